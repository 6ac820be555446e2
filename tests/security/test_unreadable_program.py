"""A job that cannot run or read its program says so plainly (issue 32): it ends FAILED with the path,
what is wrong with it, and the uid it ran as, instead of a bare "exit code 2" (Python's "can't open
file") or a time-out in the tests. Real processes, a root agent: its uid is not root's."""

import re

import pytest

from tests.security.agent_helpers import as_root, job_python, wait_until

pytestmark = as_root
HINT = "job programs must be readable by job uids, see README"


@pytest.fixture
def private(root_dir):
    """A directory of root's the job uids cannot enter (a checkout under /root, or under `mktemp -d`)."""
    d = root_dir / "private"
    d.mkdir(mode=0o700)
    (d / "train.py").write_text("print('trained')\n")
    (d / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (d / "run.sh").chmod(0o755)
    return d


def ended(runner, reports, command, **kw):
    result = runner.start(attempt_id=1, number=1, job_id=7, command=command, **kw)
    end = wait_until(lambda: reports.finished(1), runner=runner, what="the attempt's end")
    return result, end


def reason(end) -> tuple[str, int]:
    match = re.fullmatch(rf"(.*) \(the job runs as uid (\d+); {HINT}\)", end.get("detail", ""))
    assert match, end
    return match.group(1), int(match.group(2))


def test_a_python_script_it_cannot_read(root_runner, reports, private):
    result, end = ended(root_runner, reports, [job_python(), str(private / "train.py"), "--steps", "3"])
    assert result == "failed" and end["how"] == "failed_to_start"
    what, uid = reason(end)
    assert what == f"cannot read {private / 'train.py'}: permission denied"
    assert root_runner.uids.first <= uid <= root_runner.uids.last
    assert what in (root_runner.log_dir / "job-7" / "attempt-1.n1.log").read_text()  # its host log too


def test_a_program_it_cannot_run(root_runner, reports, private):
    _, end = ended(root_runner, reports, [str(private / "run.sh")])
    assert end["how"] == "failed_to_start"
    assert reason(end)[0] == f"cannot run {private / 'run.sh'}: permission denied"


def test_a_relative_script_in_a_working_directory_it_cannot_enter(root_dir, reports, private):
    from tests.security.agent_helpers import make_runner, uid_pool

    runner = make_runner(root_dir, reports, uids=uid_pool(), workdir=private)  # the operator's --workdir
    try:
        _, end = ended(runner, reports, [job_python(), "train.py"])
    finally:
        runner.shutdown(grace_s=0)
    assert end["how"] == "failed_to_start"
    assert reason(end)[0] == f"cannot enter its working directory {private}: permission denied"


@pytest.mark.parametrize(
    "command, why",
    [
        (["/nonexistent/bin/train"], "cannot run /nonexistent/bin/train: not found"),
        (["gpuquota-no-such-program"], "cannot run gpuquota-no-such-program: not found on PATH"),
        ("not-executable", "cannot run {root}/plain.py: not executable"),
    ],
)
def test_a_program_that_is_missing_or_not_executable(root_runner, reports, root_dir, command, why):
    if command == "not-executable":
        (root_dir / "plain.py").write_text("print(1)\n")
        (root_dir / "plain.py").chmod(0o644)
        command = [str(root_dir / "plain.py")]
    _, end = ended(root_runner, reports, command)
    assert end["how"] == "failed_to_start" and reason(end)[0] == why.format(root=root_dir)


def test_words_and_missing_files_in_its_arguments_do_not_stop_a_job(root_runner, reports):
    code = "import sys; print('args', len(sys.argv))"
    _, end = ended(
        root_runner, reports, [job_python(), "-c", code, "/no/such/output.pt", "word", "--x=/root"]
    )
    assert (end["how"], end["exit_code"]) == ("exited", 0), reports.log_of(1)
    assert "args 4" in reports.log_of(1)
