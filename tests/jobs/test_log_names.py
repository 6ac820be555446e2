"""Log lines name an attempt as a user knows it, "job 14, attempt 2", not by its internal id (issue 42.6):
the control side's reports and the agent's own lines."""

import logging

import pytest

from gpunodes.agent.runner import attempt_words as agent_words
from jobs import lifecycle
from jobs.tasks import attempt_started
from tests.jobs.test_checkpoints_and_lost_work import job, running  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def test_an_attempt_is_named_by_its_job_and_number(job, nodes):  # noqa: F811
    a = running(job, [("node-1", [0, 1])], number=2)
    assert lifecycle.attempt_words(a.pk) == f"job {job.pk}, attempt 2"
    assert lifecycle.attempt_words(a.pk + 1000) == f"attempt id {a.pk + 1000}"
    assert agent_words(job.pk, 2) == f"job {job.pk}, attempt 2"


def test_a_report_from_a_node_outside_the_placement_names_the_job(job, nodes, caplog):  # noqa: F811
    a = running(job, [("node-1", [0, 1])], number=2)
    with caplog.at_level(logging.WARNING, logger="jobs.tasks"):
        assert attempt_started(a.pk, 2, "node-2") is False
    [line] = [r.getMessage() for r in caplog.records if r.name == "jobs.tasks"]
    assert (
        line
        == f"refusing a start report about job {job.pk}, attempt 2 from node 'node-2': not in its placement"
    )
    assert f"attempt {a.pk}" not in line.replace(f"job {job.pk}, attempt 2", "")
