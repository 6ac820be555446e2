"""An attempt's own /tmp hides the host's: a job whose program or files live under /tmp (a checkout
there, as in a CI clone) keeps the host's /tmp instead of failing to start."""

import os

from gpunodes.agent import identity


def test_paths_under_tmp_are_recognised_through_symlinks(tmp_path):
    link = tmp_path / "link"
    os.symlink("/tmp", link)
    assert identity.under_tmp("/tmp/ci/main/examples/train.py")
    assert identity.under_tmp(link / "x")
    assert not identity.under_tmp("/var/tmp/gpuquota-jobs/1")
    assert not identity.under_tmp("/usr/bin/python3")


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
