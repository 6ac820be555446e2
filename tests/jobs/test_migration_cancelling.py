"""jobs 0005: CANCELLING and HELD join the job states (the database's check constraint with them), and
the rows an older release left are brought in line: a job CANCELLED while its attempt was still stopping
is CANCELLING (it becomes CANCELLED when its host confirms), and no job that has not ended keeps a grace
past MAX_PREEMPTION_GRACE_S."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("jobs", "0004_job_arrays")]
AFTER = [("jobs", "0005_cancelling_held_and_grace_cap")]


@pytest.mark.django_db(transaction=True)
def test_old_rows_are_brought_in_line(settings):
    settings.MAX_PREEMPTION_GRACE_S = 3600
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    apps = executor.loader.project_state(BEFORE).apps
    User = apps.get_model("auth", "User")
    Team, Share = apps.get_model("quotas", "Team"), apps.get_model("quotas", "Share")
    Job, Attempt = apps.get_model("jobs", "Job"), apps.get_model("jobs", "Attempt")
    user = User.objects.create(username="old-bob")
    share = Share.objects.create(name="old-share", team=Team.objects.create(name="Old", slug="old"))

    def job(state, grace=30, attempt=None):
        j = Job.objects.create(
            share=share, submitted_by=user, gpu_type="a10g", gpus=1, state=state, preemption_grace_s=grace
        )
        if attempt:
            Attempt.objects.create(
                job=j, number=1, state=attempt, outcome="SUCCEEDED" if attempt == "ENDED" else ""
            )
        return j.pk

    stopping = job("CANCELLED", attempt="STOPPING")
    done = job("CANCELLED", attempt="ENDED")
    greedy = job("QUEUED", grace=2_147_483_647)
    ended_greedy = job("SUCCEEDED", grace=86_400)
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        Job = executor.loader.project_state(AFTER).apps.get_model("jobs", "Job")
        states = dict(Job.objects.values_list("pk", "state"))
        assert states[stopping] == "CANCELLING" and states[done] == "CANCELLED"
        assert Job.objects.get(pk=stopping).finished_at is None
        graces = dict(Job.objects.values_list("pk", "preemption_grace_s"))
        assert graces[greedy] == 3600 and graces[ended_greedy] == 86_400  # an ended job is history
        with pytest.raises(IntegrityError), transaction.atomic():
            Job.objects.filter(pk=greedy).update(state="PAUSED")
        Job.objects.filter(pk=greedy).update(state="HELD")  # a state the constraint now knows
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
