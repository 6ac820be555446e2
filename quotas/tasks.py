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
