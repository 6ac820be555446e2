"""Control-side tasks of the quotas app: the scheduling pass (beat and event triggered)."""

from celery import shared_task

from quotas import scheduler


@shared_task(name="quotas.tasks.scheduling_pass", ignore_result=True)
def scheduling_pass(trigger: str = "beat") -> dict:
    result = scheduler.run_pass(trigger)
    return {"admitted": len(result.admitted), "preempted": len(result.preempted), "ms": result.duration_ms}


@shared_task(name="quotas.tasks.prune_pass_records", ignore_result=True)
def prune_pass_records() -> int:
    return scheduler.prune_pass_records()


@shared_task(name="quotas.tasks.sample_usage", ignore_result=True)
def sample_usage() -> int:
    """Every minute: one UsageSample per share and GPU type (the dashboard's history)."""
    from quotas import usage

    return usage.sample()


@shared_task(name="quotas.tasks.compact_usage", ignore_result=True)
def compact_usage() -> dict:
    """Hourly: thin samples older than a day to 15-minute buckets, delete those older than 90 days."""
    from quotas import usage

    return {"downsampled": usage.downsample(), "pruned": usage.prune()}
