"""The Celery app: the `control` queue for the central worker, one queue per GPU node (`node.<name>`),
and `whatif` for the what-if replays, consumed by a worker of its own (a replay of a week takes minutes:
on the control worker it would hold the threads heartbeats and passes need; more workers on it fan a
sweep out).

Every task's base class is gpunodes.signing.SignedTask: with signed messages on, a task runs a message
only if the envelope inside its signed body names that task, is fresh and was never seen before."""

import os
import warnings

from celery import Celery
from celery.exceptions import SecurityWarning
from celery.signals import celeryd_init, worker_ready, worker_shutdown

from config.queues import CONTROL_QUEUE, intake_queue, node_queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# Set by `make run`'s process manager (config/procman.py) in its processes: it says once, for all of
# them, that they run as root, instead of Celery's eight-line block from each worker and agent.
ROOT_SAID_ENV = "GPUQUOTA_ROOT_SAID"
if os.environ.get(ROOT_SAID_ENV) == "1":
    warnings.filterwarnings("ignore", category=SecurityWarning)

WHATIF_QUEUE = "whatif"
WHATIF_TASKS = frozenset({"quotas.tasks.whatif_replay", "quotas.tasks.advice_replay"})
AGENT_TASK_PREFIX = "gpunodes.agent."


def report_queue(node_name: str) -> str:
    """The queue an agent sends its heartbeats and reports to: its intake list on Redis; `control`
    itself on the embedded file broker (one user, nothing to keep apart)."""
    from django.conf import settings

    return intake_queue(node_name) if settings.REDIS_URL else CONTROL_QUEUE


def route_task(name, args, kwargs, options, task=None, **kw):
    # Agent tasks run on the host that owns the attempt; everything else on the control worker.
    if name.startswith(AGENT_TASK_PREFIX) and kwargs and kwargs.get("node"):
        return {"queue": node_queue(kwargs["node"])}
    if name in WHATIF_TASKS:
        return {"queue": WHATIF_QUEUE}
    return {"queue": CONTROL_QUEUE}


def consume_as(consumer: str) -> None:
    """This process consumes as `consumer` ('control', or 'node:<name>' in an agent): on Redis, kombu
    keeps what it took but has not acknowledged under keys of its own (config/redisbroker.py)."""
    from django.conf import settings

    if settings.REDIS_URL:
        from config.redisbroker import unacked_keys

        app.conf.broker_transport_options = {
            **settings.CELERY_BROKER_TRANSPORT_OPTIONS,
            **unacked_keys(consumer),
        }


def whatif_worker_options(queues) -> dict | None:
    """The broker's options of a worker that consumes `whatif` alone, on Redis: its own keys for what it
    took but has not acknowledged (kombu restores those of its keys older than the visibility timeout:
    the control worker's must not be taken by that clock, nor a replay by the control worker's hour),
    and a replay of a worker that went away (its host lost, kill -9) given to another what-if worker
    after WHATIF_VISIBILITY_TIMEOUT_S, checked every WHATIF_RESTORE_INTERVAL_S. A pool process lost
    (prefork) is Celery's WorkerLostError: the replay is re-queued at once (reject_on_worker_lost)."""
    from django.conf import settings

    names = (
        {q.strip() for q in queues} if not isinstance(queues, str) else {q.strip() for q in queues.split(",")}
    )
    if not settings.REDIS_URL or names != {WHATIF_QUEUE}:
        return None
    from config.redisbroker import unacked_keys

    return {
        **settings.CELERY_BROKER_TRANSPORT_OPTIONS,
        **unacked_keys(WHATIF_QUEUE),
        "visibility_timeout": settings.WHATIF_VISIBILITY_TIMEOUT_S,
        "unacked_restore_interval": settings.WHATIF_RESTORE_INTERVAL_S,
        "unacked_restore_throttle": 1,  # kombu scans on every 10th tick by default
    }


@celeryd_init.connect
def whatif_worker_init(sender=None, conf=None, options=None, **kwargs) -> None:
    options = whatif_worker_options((options or {}).get("queues") or ())
    if options is not None:
        app.conf.broker_transport_options = options


@worker_ready.connect
def start_intake(sender=None, **kwargs) -> None:
    """The control worker (it consumes `control`) on Redis moves the nodes' intake lists onto `control`
    from a thread of its own; stopped with the worker."""
    from django.conf import settings

    consumer = sender
    queues = {q.name for q in consumer.task_consumer.queues} if consumer and consumer.task_consumer else set()
    if not settings.REDIS_URL or CONTROL_QUEUE not in queues:
        return
    from config.redisbroker import Intake

    intake = Intake.from_settings()
    intake.start()
    worker_shutdown.connect(lambda **kw: intake.stop(), weak=False)


app = Celery("gpuquota", task_cls="gpunodes.signing:SignedTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_routes = (route_task,)
app.autodiscover_tasks()
