"""A fair reclaim (SEMANTICS rule 11) in production: the pass records it as its own reason, not as an
in-share priority pre-emption, and the work it throws away counts under the cause fair_share, as the
simulator's result does."""

from types import SimpleNamespace

import pytest
from django.utils import timezone

from jobs import lifecycle
from jobs.choices import AttemptState, LostCause, Outcome, PreemptionReason
from jobs.models import Attempt, JobEvent
from quotas import scheduler
from quotas.engine import policy
from tests.api.conftest import run, submit

pytestmark = pytest.mark.django_db


def test_a_fair_share_preemption_is_named_so_and_its_lost_work_counts_under_fair_share(
    no_messages, bob, charlie, language_share, vision_share, nodes
):
    victim = submit(charlie, language_share)
    attempt = run(victim, nodes[0], [0], borrowed=True)
    beneficiary = submit(bob, vision_share)
    loaded = SimpleNamespace(attempt_numbers={attempt.pk: (attempt.number, 0)})
    p = policy.Preemption(
        attempt_id=attempt.pk,
        job_id=victim.pk,
        share=language_share.name,
        reason=policy.FAIR_SHARE,
        beneficiary_job_id=beneficiary.pk,
        beneficiary_share=vision_share.name,
    )
    assert scheduler.apply_preemptions(loaded, (p,), timezone.now()) == [attempt.pk]
    said = JobEvent.objects.filter(job=victim).order_by("pk").last().reason
    assert said == f"PREEMPTED_FAIR_SHARE by job {beneficiary.pk} of share {vision_share.name}"
    attempt.refresh_from_db()
    assert (attempt.state, attempt.preemption_reason) == (AttemptState.STOPPING, PreemptionReason.FAIR_SHARE)
    assert lifecycle.end_attempt(attempt.pk, attempt.number, outcome=Outcome.PREEMPTED)
    assert Attempt.objects.get(pk=attempt.pk).lost_cause == LostCause.FAIR_SHARE
