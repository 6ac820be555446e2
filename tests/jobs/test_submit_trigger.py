"""A burst of submits asks for passes without a cache round trip per submit: the first at once, the
rest folded into one trailing request at the end of the window (so none is left without a pass)."""

import time

import pytest

from quotas import triggers


@pytest.fixture
def asked(monkeypatch):
    calls = []
    monkeypatch.setattr(triggers, "request_pass", lambda why="": calls.append((time.monotonic(), why)))
    return calls  # each test has a coalescer of its own (tests/conftest.py)


def test_a_lone_submit_asks_at_once(asked):
    triggers.request_pass_soon("submit")
    assert [why for _, why in asked] == ["submit"]


def test_a_burst_costs_one_request_now_and_one_at_the_end_of_the_window(asked):
    start = time.monotonic()
    for _ in range(200):
        triggers.request_pass_soon("submit")
    assert len(asked) == 1
    time.sleep(triggers.COALESCE_S * 2 + 0.2)
    assert len(asked) == 2
    assert asked[1][0] - start >= triggers.COALESCE_S * 0.9


def test_after_a_quiet_window_the_next_submit_asks_at_once_again(asked):
    triggers.request_pass_soon("submit")
    time.sleep(triggers.COALESCE_S + 0.05)
    triggers.request_pass_soon("submit")
    assert len(asked) == 2


def test_settling_drops_the_trailing_request_so_none_fires_into_the_next_test(asked):
    triggers.request_pass_soon("submit")
    triggers.request_pass_soon("submit")  # folded into a trailing request
    triggers._coalescer.settle()
    time.sleep(triggers.COALESCE_S * 2)
    assert len(asked) == 1
    triggers.request_pass_soon("submit")  # nothing pending: a later submit still asks
    assert len(asked) == 2
