"""The CLI words an estimate with its likely range ("starts 14:10–16:40, likely 15:05"); a bound stays an
ETA ("expected to start …"), and a passed ETA stays "due now"."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from quotas.models import QueueForecast
from tests.api.conftest import submit

pytestmark = pytest.mark.django_db


def hm(t: datetime) -> str:
    return t.astimezone().strftime("%H:%M")


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def job(kind="estimate", *, eta, low=None, high=None) -> dict:
    return {
        "id": 7,
        "state": "QUEUED",
        "eta_kind": kind,
        "eta_basis": f"{kind}: 3 jobs before it",
        "forecast_age_s": 4.0,
        "eta": iso(eta),
        "eta_low": iso(low) if low else None,
        "eta_high": iso(high) if high else None,
    }


def eta_text(j):
    from gpuquota_client.cli import eta_text

    return eta_text(j)


def test_an_estimate_with_a_range_says_between_when_and_when_and_the_likely_time():
    now = datetime.now(UTC)
    low, eta, high = now + timedelta(minutes=20), now + timedelta(minutes=65), now + timedelta(minutes=150)
    text = eta_text(job(eta=eta, low=low, high=high))
    assert re.fullmatch(
        r", starts (\w{3} )?\d\d:\d\d–(\w{3} )?\d\d:\d\d, likely (\w{3} )?\d\d:\d\d \(in 1h0[45]m\)"
        r" \[estimate: 3 jobs before it; forecast 4s ago\]",
        text,
    ), text
    assert all(hm(t) in text for t in (low, eta, high))


def test_a_range_on_the_same_day_reads_as_clock_times():
    # The range within the same local day as now: plain HH:MM for all three.
    now = datetime.now(UTC)
    local = now.astimezone()
    if (local + timedelta(minutes=31)).date() != local.date():
        pytest.skip("too close to midnight for a same-day range")
    low, eta, high = now + timedelta(minutes=10), now + timedelta(minutes=20), now + timedelta(minutes=30)
    text = eta_text(job(eta=eta, low=low, high=high))
    assert text.startswith(f", starts {hm(low)}–{hm(high)}, likely {hm(eta)} (in ")


def test_a_range_whose_start_has_passed_starts_now():
    now = datetime.now(UTC)
    text = eta_text(
        job(eta=now + timedelta(minutes=20), low=now - timedelta(minutes=5), high=now + timedelta(minutes=40))
    )
    assert text.startswith(", starts now–")


def test_a_bound_stays_an_eta_by_the_bound():
    now = datetime.now(UTC)
    text = eta_text(
        job(
            "bound",
            eta=now + timedelta(minutes=30),
            low=now + timedelta(minutes=10),
            high=now + timedelta(minutes=30),
        )
    )
    assert text.startswith(", expected to start ") and "starts" not in text.replace("expected to start", "")
    assert "likely" not in text


def test_a_passed_eta_stays_due_now_with_a_range():
    now = datetime.now(UTC)
    text = eta_text(
        job(
            eta=now - timedelta(seconds=30), low=now - timedelta(minutes=10), high=now + timedelta(minutes=20)
        )
    )
    assert text.startswith(", expected to start due now, forecast again after the next pass [")
    assert "likely" not in text


def test_an_estimate_without_a_range_stays_as_it_was():
    now = datetime.now(UTC)
    text = eta_text(job(eta=now + timedelta(minutes=30)))
    assert text.startswith(", expected to start ") and "likely" not in text


def test_status_shows_the_stored_range(logged_in, bob, vision_share):
    waiting = submit(bob, vision_share, gpus=4)
    now = timezone.now()
    QueueForecast.objects.create(
        job=waiting,
        position_in_share=1,
        position_overall=1,
        eta=now + timedelta(minutes=65),
        eta_low=now + timedelta(minutes=20),
        eta_high=now + timedelta(minutes=150),
        kind="estimate",
        basis="estimate: 2 jobs without a max runtime end before it",
        computed_at=now,
    )
    code, out, _ = logged_in("status", waiting.pk)
    assert code == 0
    assert re.search(
        r", starts (\w{3} )?\d\d:\d\d–(\w{3} )?\d\d:\d\d, likely (\w{3} )?\d\d:\d\d \(in 1h0[45]m\)", out
    )
    assert hm(now + timedelta(minutes=20)) in out and hm(now + timedelta(minutes=150)) in out
