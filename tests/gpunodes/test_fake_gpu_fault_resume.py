"""A --fake-gpus agent that restarts goes on reading its fault file from where it was (issue 42, item 6):
it does not replay the file from its first line (an Xid an admin already dealt with would fail the GPU
again), and what the lines it read left (a lost GPU, an ECC count) is still so, as on a real host."""

from __future__ import annotations

import json

from gpunodes.agent.health import OFF_BUS, XID, FakeNvml
from tests.gpunodes.test_gpu_health_watcher import make_watcher, one_round


def write(path, *faults, tail=""):
    with open(path, "a") as f:
        for fault in faults:
            f.write(json.dumps(fault) + "\n")
        f.write(tail)


def test_a_restarted_agent_goes_on_from_where_the_last_one_stopped_reading(tmp_path):
    faults, kept = tmp_path / "faults.jsonl", tmp_path / "state" / "fake-gpu-faults.read.json"
    write(faults, {"gpu": 1, "xid": 79}, {"gpu": 3, "lost": True}, tail='{"gpu": 2, "xi')
    watcher, found = make_watcher(FakeNvml("n1", 4, faults, state_file=kept))
    one_round(watcher)
    assert sorted((i, f.reason) for i, f in found) == [(1, XID), (3, OFF_BUS)]

    # The agent restarts (its watcher forgets what it saw; the control side keeps GPU 1 out until an
    # admin's reset and re-check): the Xid of GPU 1 is not seen again, GPU 3 is still off the bus,
    # and the line that was half written when it stopped is read whole.
    watcher2, found2 = make_watcher(FakeNvml("n1", 4, faults, state_file=kept))
    write(faults, tail='d": 48}\n')
    one_round(watcher2)
    assert sorted((i, f.reason) for i, f in found2) == [(2, XID), (3, OFF_BUS)]
    assert "Xid 48" in dict(found2)[2].detail


def test_a_fault_file_replaced_since_is_read_from_its_start(tmp_path):
    faults, kept = tmp_path / "faults.jsonl", tmp_path / "read.json"
    write(faults, {"gpu": 0, "ecc_uncorrected": 0}, {"gpu": 0, "ecc_uncorrected": 0})
    one_round(make_watcher(FakeNvml("n1", 4, faults, state_file=kept))[0])
    faults.unlink()
    write(faults, {"gpu": 2, "xid": 79})  # a new file, shorter than the offset kept
    watcher, found = make_watcher(FakeNvml("n1", 4, faults, state_file=kept))
    one_round(watcher)
    assert [(i, f.reason) for i, f in found] == [(2, XID)]


def test_a_kept_state_that_cannot_be_read_means_the_file_from_its_start(tmp_path):
    faults, kept = tmp_path / "faults.jsonl", tmp_path / "read.json"
    write(faults, {"gpu": 2, "xid": 79})
    kept.write_text("{not json")
    watcher, found = make_watcher(FakeNvml("n1", 4, faults, state_file=kept))
    one_round(watcher)
    assert [(i, f.reason) for i, f in found] == [(2, XID)]
    assert json.loads(kept.read_text())["offset"] == faults.stat().st_size
