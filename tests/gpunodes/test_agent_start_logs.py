"""An agent started by `make run` says what its setup means once, not a WARNING at every start about the
flags `make run` itself passes, nor one about the oom_score_adj only root may lower (issue 42.6)."""

import errno
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpunodes.agent import containment
from gpunodes.agent.main import MAKE_RUN_ENV, job_uids

ROOT = Path(__file__).resolve().parents[2]


def agent_lines(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name.startswith("gpunodes") and r.levelno == level]


def test_under_make_run_the_single_user_flag_is_one_info_line(monkeypatch, caplog):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv(MAKE_RUN_ENV, "1")
    with caplog.at_level(logging.INFO):
        assert job_uids(uid_range="2000000-2000099", unsafe_run_as_self=True) is None
    assert agent_lines(caplog, logging.WARNING) == []
    assert agent_lines(caplog, logging.INFO) == [
        "single-user demo (make run): jobs run as this agent's own user (uid 1000)"
    ]


def test_elsewhere_it_stays_loud(monkeypatch, caplog):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv(MAKE_RUN_ENV, raising=False)
    with caplog.at_level(logging.INFO):
        job_uids(uid_range="2000000-2000099", unsafe_run_as_self=True)
    assert len([m for m in agent_lines(caplog, logging.WARNING) if m.startswith("UNSAFE")]) == 3


def test_an_agent_that_is_not_root_says_once_that_it_keeps_its_oom_score(monkeypatch, caplog):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(containment, "_warned", set())

    def refused(self, text):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Path, "write_text", refused)
    with caplog.at_level(logging.INFO):
        assert containment.protect_from_oom() is False
        assert containment.protect_from_oom() is False
    assert agent_lines(caplog, logging.WARNING) == []
    [line] = agent_lines(caplog, logging.INFO)
    assert line.startswith("oom_score_adj stays as it was: lowering it to ") and "takes root" in line


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_run_tells_its_processes():
    dry = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "run"], cwd=ROOT, capture_output=True, text=True
    )
    assert f"{MAKE_RUN_ENV}=1 " in dry.stdout
