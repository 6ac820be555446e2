"""Choices of the jobs app, in one place, with the sets of active and terminal states beside them."""

from django.db import models


class JobState(models.TextChoices):
    QUEUED = "QUEUED", "Queued"
    ADMITTED = "ADMITTED", "Admitted"
    RUNNING = "RUNNING", "Running"
    PREEMPTING = "PREEMPTING", "Pre-empting"
    # Cancelled while it ran: stopping (SIGTERM, SIGKILL at the end of its grace), its GPUs still held
    # until its host reports the processes gone; then CANCELLED.
    CANCELLING = "CANCELLING", "Cancelling"
    # Not run again until an admin releases it (Slurm's `scontrol hold`/`release`): its last attempts
    # ended with their host's agent on HOLD_AFTER_NODE_LOST different hosts (strikes: jobs.lifecycle).
    # Holds no GPUs; can be cancelled.
    HELD = "HELD", "Held"
    SUCCEEDED = "SUCCEEDED", "Succeeded"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"


# Holding GPUs through a live attempt.
JOB_ACTIVE_STATES = frozenset({JobState.ADMITTED, JobState.RUNNING, JobState.PREEMPTING, JobState.CANCELLING})
# Live attempts in their grace: stopping, their GPUs counted as being freed.
JOB_STOPPING_STATES = frozenset({JobState.PREEMPTING, JobState.CANCELLING})
JOB_TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
# Not ended: a cancel, a priority change still applies.
JOB_OPEN_STATES = frozenset({JobState.QUEUED, JobState.HELD}) | JOB_ACTIVE_STATES


class AttemptState(models.TextChoices):
    ADMITTED = "ADMITTED", "Admitted"  # GPUs claimed, start sent to the agent
    RUNNING = "RUNNING", "Running"  # the agent reported the process started
    STOPPING = "STOPPING", "Stopping"  # pre-empted or cancelled, in its grace period
    ENDED = "ENDED", "Ended"


ATTEMPT_ACTIVE_STATES = frozenset({AttemptState.ADMITTED, AttemptState.RUNNING, AttemptState.STOPPING})


class Outcome(models.TextChoices):
    SUCCEEDED = "SUCCEEDED", "Succeeded"
    FAILED = "FAILED", "Failed"
    PREEMPTED = "PREEMPTED", "Pre-empted"
    NODE_LOST = "NODE_LOST", "Node lost"
    CANCELLED = "CANCELLED", "Cancelled"
    TIMED_OUT = "TIMED_OUT", "Ran past max_runtime_s"
    # Its GPU was found broken (gpunodes/agent/health.py): re-queued, never the user's failure nor a
    # pre-emption (max_preemptions), nor a step towards HOLD_AFTER_NODE_LOST.
    GPU_FAILED = "GPU_FAILED", "GPU failed"
    # Stopped by an orderly shutdown of its host's agent (Ctrl-C, a service stop): re-queued with its
    # original submit time; not a lost host, never a strike toward HOLD_AFTER_NODE_LOST.
    AGENT_STOPPED = "AGENT_STOPPED", "Stopped with its host's agent"
    # Its host would not run it (cordoned, draining, short of uids, GPUs, disk, or it could not record
    # the start): it never ran; re-queued, never a strike.
    REFUSED = "REFUSED", "Refused by its host"


class PreemptionReason(models.TextChoices):
    RECLAIM = "RECLAIM", "Reclaim of borrowed capacity"
    PRIORITY = "PRIORITY", "Higher priority in the share"
    FAIR_SHARE = "FAIR_SHARE", "Fair reclaim between borrowers"


class LostCause(models.TextChoices):
    """Why an attempt's work since its safe point was thrown away (SEMANTICS "Checkpoints and safe
    points"): the same causes as the simulator's result (`lost_gpu_seconds`), plus the two only a real
    host has. An attempt that succeeded, failed or was cancelled lost nothing to anyone's decision."""

    RECLAIM = "reclaim", "Reclaim of borrowed capacity"
    PRIORITY = "priority", "Higher priority in the share"
    FAIR_SHARE = "fair_share", "Fair reclaim between borrowers"
    NODE_LOST = "node_lost", "Its host was lost"
    FENCED = "fenced", "Fenced: its host's agent lost its lease"
    GPU_FAILED = "gpu_failed", "A GPU of it failed"
    AGENT_STOPPED = "agent_stopped", "Its host's agent was stopped"
    HOST_FAULT = "host_fault", "Its host failed under it (its container runtime died)"


class EventKind(models.TextChoices):
    SUBMITTED = "SUBMITTED", "Submitted"
    ADMITTED = "ADMITTED", "Admitted"
    STARTED = "STARTED", "Started"
    PREEMPTING = "PREEMPTING", "Pre-empting"
    PREEMPTED = "PREEMPTED", "Pre-empted"
    REQUEUED = "REQUEUED", "Re-queued"
    NODE_LOST = "NODE_LOST", "Node lost"
    SUCCEEDED = "SUCCEEDED", "Succeeded"
    FAILED = "FAILED", "Failed"
    CANCEL_REQUESTED = "CANCEL_REQUESTED", "Cancel requested"
    CANCELLED = "CANCELLED", "Cancelled"
    PRIORITY_CHANGED = "PRIORITY_CHANGED", "Priority changed"
    GRACE_CHANGED = "GRACE_CHANGED", "Grace changed"
    HELD = "HELD", "Held"
    RELEASED = "RELEASED", "Released"
    GPU_FAILED = "GPU_FAILED", "GPU failed"
    AGENT_STOPPED = "AGENT_STOPPED", "Stopped with its agent"
    # The layout changed under a queued job (quotas.layout.apply): e.g. its share can no longer hold it.
    SHARE_CHANGED = "SHARE_CHANGED", "Share changed"
