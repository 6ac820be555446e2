"""An attempt's own /tmp and /var/tmp hide the host's: what of them it still sees are its own
directories, and the top entries there that its command names (a checkout under /tmp, as in a CI
clone), never the whole directory (identity.carries)."""

import os
from pathlib import Path

from gpunodes.agent import identity


def sources(found):
    return {c.source for c in found}


def test_a_named_path_brings_its_top_entry_of_tmp_through_symlinks(tmp_path):
    checkout = Path("/tmp") / tmp_path.relative_to("/tmp").parts[0]  # pytest's own dir under /tmp
    link = tmp_path / "link"
    os.symlink(tmp_path, link)
    (tmp_path / "train.py").write_text("")
    found = identity.carries(Path("/w"), named=[str(link / "train.py"), "/usr/bin/python3"])
    assert sources(found) == {str(checkout)}
    (carry,) = found
    assert carry.target == f"/w/tmp/{checkout.name}" and carry.is_dir


def test_neither_the_whole_tmp_nor_a_missing_path_nor_the_agents_own_directories(tmp_path):
    named = ["/tmp", "/tmp/", "/var/tmp", "/tmp/gpuquota-no-such-entry", str(tmp_path)]
    assert identity.carries(Path("/w"), named=named, agent_roots=[tmp_path / "jobs"]) == []


def test_the_agents_own_directories_come_exactly_and_nested_ones_once(tmp_path):
    workdir, checkpoint = tmp_path / "work" / "a1", tmp_path / "ckpt" / "job-7"
    for d in (workdir, checkpoint):
        d.mkdir(parents=True)
    found = identity.carries(workdir, exact=[workdir, checkpoint, workdir / "sub" / ".."])
    assert sources(found) == {str(workdir), str(checkpoint)}
    rel = workdir.relative_to("/tmp")
    assert {c.target for c in found if c.source == str(workdir)} == {str(workdir / "tmp" / rel)}


def test_a_commands_files_are_its_program_on_path_and_its_absolute_arguments(tmp_path):
    prog = tmp_path / "bin" / "trainer"
    prog.parent.mkdir()
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    found = identity.paths_in(["trainer", "--data", "/tmp/d", "rel"], str(prog.parent))
    assert set(found) == {"/tmp/d", str(prog)}
    assert identity.paths_in(["/usr/bin/python3", "/tmp/ci/main/examples/train.py"], "") == [
        "/usr/bin/python3",
        "/tmp/ci/main/examples/train.py",
    ]
