"""The agent's GPU health watcher (gpunodes/agent/health.py) against a fake NVML: which events and
states make a GPU unhealthy (critical Xids but not the application's, ECC, pages pending retirement, rows
pending remapping, a GPU fallen off the bus, a process that outlives its attempt), that only that GPU is
taken out, that a fault is reported once and stays until a re-check finds the GPU well, and the fault
file a test writes for a --fake-gpus agent."""

from __future__ import annotations

import json

import pytest

from gpunodes.agent.health import (
    ECC,
    OFF_BUS,
    RETIRED_PAGES,
    ROW_REMAP,
    STUCK_PROCESS,
    XID,
    FakeNvml,
    HealthWatcher,
)

GPUS = 4


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def nvml():
    return FakeNvml("n1", GPUS)


def make_watcher(nvml, found=None, **kw):
    found = found if found is not None else []
    watcher = HealthWatcher(
        nvml,
        {i: f"GPU-fake-n1-{i}" for i in range(GPUS)},
        on_fault=lambda index, fault: found.append((index, fault)),
        **kw,
    )
    watcher.start()
    return watcher, found


def one_round(watcher):
    watcher.step(wait_ms=0)


@pytest.mark.parametrize(
    "fault, reason, words",
    [
        ({"xid": 79}, XID, "Xid 79 (GPU has fallen off the bus)"),
        ({"xid": 48}, XID, "Xid 48 (double-bit ECC error)"),
        ({"xid": 94}, XID, "Xid 94 (contained ECC error)"),
        ({"xid": 1234}, XID, "Xid 1234"),
        ({"double_bit_ecc": True}, ECC, "double-bit"),
        ({"ecc_uncorrected": 2}, ECC, "2 uncorrectable ECC error(s) since the last reset"),
        ({"retired_pending": True}, RETIRED_PAGES, "pending retirement"),
        ({"remap_pending": True}, ROW_REMAP, "pending remapping"),
        ({"remap_failed": True}, ROW_REMAP, "remapping failed"),
        ({"lost": True}, OFF_BUS, "fallen off the bus"),
    ],
)
def test_a_broken_gpu_is_found_with_its_reason_and_only_that_one(nvml, fault, reason, words):
    watcher, found = make_watcher(nvml)
    one_round(watcher)
    assert found == []
    nvml.inject({"gpu": 2, **fault})
    one_round(watcher)
    one_round(watcher)  # a state, not an event: the next check finds it (check_every_s is over at 0)
    watcher._next_check = 0
    one_round(watcher)
    assert [(i, f.reason) for i, f in found] == [(2, reason)]
    assert words in found[0][1].detail
    assert set(watcher.faults()) == {2}
    assert watcher.unhealthy() == [
        {"index": 2, "reason": reason, "detail": found[0][1].detail, "at": found[0][1].at}
    ]


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
def test_an_application_xid_is_the_jobs_not_the_gpus(nvml, xid):
    watcher, found = make_watcher(nvml)
    nvml.inject({"gpu": 2, "xid": xid})
    one_round(watcher)
    assert found == [] and watcher.faults() == {}
    assert nvml._events == []  # read, and let go


def test_more_xids_can_be_ignored(nvml):
    watcher, found = make_watcher(nvml, ignored_xids={13, 31, 43, 45, 68, 109})
    nvml.inject({"gpu": 1, "xid": 109})
    one_round(watcher)
    assert found == []
    nvml.inject({"gpu": 1, "xid": 79})
    one_round(watcher)
    assert [i for i, _ in found] == [1]


def test_a_fault_is_reported_once_and_stays(nvml):
    watcher, found = make_watcher(nvml)
    nvml.inject({"gpu": 3, "xid": 79})
    nvml.inject({"gpu": 3, "xid": 48})
    nvml.inject({"gpu": 3, "ecc_uncorrected": 1})
    for _ in range(4):
        watcher._next_check = 0
        one_round(watcher)
    assert len(found) == 1 and found[0][1].reason == XID and "79" in found[0][1].detail
    nvml.inject({"gpu": 3, "reset": True})
    watcher._next_check = 0
    one_round(watcher)
    assert set(watcher.faults()) == {3}  # still: only a re-check clears it


def test_a_recheck_of_a_reset_gpu_makes_it_well_and_remembers_the_token(nvml):
    watcher, found = make_watcher(nvml)
    nvml.inject({"gpu": 2, "xid": 79})
    one_round(watcher)
    assert set(watcher.faults()) == {2}
    nvml.inject({"gpu": 2, "reset": True})
    assert watcher.recheck(2, 7) is None
    assert watcher.faults() == {} and watcher.rechecked() == {2: 7}
    nvml.inject({"gpu": 2, "xid": 79})  # it fails again later: found again
    one_round(watcher)
    assert [i for i, _ in found] == [2, 2]


def test_a_recheck_of_a_gpu_still_broken_keeps_it_out_with_what_was_found(nvml):
    watcher, found = make_watcher(nvml)
    nvml.inject({"gpu": 2, "ecc_uncorrected": 3})
    watcher._next_check = 0
    one_round(watcher)
    fault = watcher.recheck(2, 8)
    assert fault is not None and fault.reason == ECC
    assert watcher.rechecked() == {2: 8}
    assert watcher.faults()[2].detail.startswith("re-check failed: 3 uncorrectable")
    assert len(found) == 2  # reported again: the control side hears the re-check's answer


def test_a_check_the_gpu_does_not_support_is_skipped(nvml, monkeypatch):
    def unsupported(*a):
        raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(nvml, "nvmlDeviceGetTotalEccErrors", unsupported)
    monkeypatch.setattr(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", unsupported)
    watcher, found = make_watcher(nvml)
    watcher._next_check = 0
    one_round(watcher)
    assert found == []
    nvml.inject({"gpu": 0, "remap_pending": True})
    watcher._next_check = 0
    one_round(watcher)
    assert [(i, f.reason) for i, f in found] == [(0, ROW_REMAP)]


def test_a_gpu_gone_before_the_agent_started_is_unhealthy_from_the_start(nvml):
    nvml.inject({"gpu": 1, "lost": True})
    watcher, found = make_watcher(nvml)
    assert [(i, f.reason) for i, f in found] == [(1, OFF_BUS)]


def test_an_event_of_a_gpu_nvml_cannot_name_checks_them_all_first(nvml, monkeypatch):
    """The device plugin takes every GPU out then; the checks find the one really gone, if any."""
    watcher, found = make_watcher(nvml)
    nvml.inject({"gpu": 3, "lost": True})
    nvml._events.append(FakeNvml.Event("not-a-handle", 0x8, 79))
    one_round(watcher)
    assert [(i, f.reason) for i, f in found] == [(3, OFF_BUS)]
    # With none gone, every GPU is taken out: the event was real and no GPU can be blamed.
    watcher2, found2 = make_watcher(FakeNvml("n1", GPUS))
    watcher2.nvml._events.append(FakeNvml.Event("not-a-handle", 0x8, 79))
    one_round(watcher2)
    assert sorted(i for i, _ in found2) == [0, 1, 2, 3] and all(f.reason == XID for _, f in found2)


def test_a_wait_error_checks_every_gpu_instead_of_taking_them_all_out(nvml, monkeypatch):
    def broken_wait(*a):
        raise nvml.NVMLError(nvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(nvml, "nvmlEventSetWait_v2", broken_wait)
    watcher, found = make_watcher(nvml)
    watcher._next_check = 1e18
    one_round(watcher)
    assert found == []
    nvml.inject({"gpu": 0, "lost": True})
    one_round(watcher)
    assert [(i, f.reason) for i, f in found] == [(0, OFF_BUS)]


def test_a_process_that_outlives_its_attempt_makes_its_gpu_unhealthy(nvml):
    mono = Clock()
    watcher, found = make_watcher(nvml, stuck_after_s=30, monotonic=mono)
    nvml.inject({"gpu": 1, "processes": [4242]})
    nvml.inject({"gpu": 2, "processes": [4343]})
    watcher.released([1, 2], "17/1")
    mono.now += 10
    nvml.inject({"gpu": 2, "processes": []})  # this one let go in time
    watcher.check_released()
    assert found == []
    mono.now += 25
    watcher.check_released()
    assert [(i, f.reason) for i, f in found] == [(1, STUCK_PROCESS)]
    assert "pid 4242" in found[0][1].detail and "attempt 17/1" in found[0][1].detail
    mono.now += 100
    watcher.check_released()
    assert len(found) == 1  # GPU 2 is no longer watched


def test_the_fault_file_is_read_as_it_grows_a_line_at_a_time(tmp_path):
    faults = tmp_path / "faults.jsonl"
    nvml = FakeNvml("n1", GPUS, faults)
    watcher, found = make_watcher(nvml)
    with open(faults, "a") as f:
        f.write(json.dumps({"gpu": 2, "xid": 13}) + "\n")
        f.write('{"gpu": 2, "xi')  # still being written
    one_round(watcher)
    assert found == []
    with open(faults, "a") as f:
        f.write('d": 79}\nnot json\n' + json.dumps({"gpu": 9, "xid": 79}) + "\n")
    one_round(watcher)
    assert [(i, f.reason) for i, f in found] == [(2, XID)]
