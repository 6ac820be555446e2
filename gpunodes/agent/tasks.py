"""The tasks of a host's own queue `node.<name>`. They run only inside the agent process (Celery's
threads pool, so they share the one Runner), refuse a message meant for another node, refuse starts
while the node is not READY (cordoned, draining, pending), and validate every field before anything
touches the host: ints are ints, names match their pattern, the command is a list of strings, the
environment maps valid names to strings (opened first if the control side sealed it to this node). A
refused message is logged.

A full state disk never turns a stop into nothing: a stop (and an ack, a re-check) runs even when its
nonce cannot be recorded (`replay_safe`: running one twice changes nothing), while a start that cannot
be recorded, or that comes while the agent's disk is short (agent/disk.py), is refused back to the
control side (re-queued, no strike)."""

from __future__ import annotations

import logging
import re

from celery import shared_task
from celery.exceptions import SecurityError

from gpunodes.addresses import valid_address
from gpunodes.agent.joblog import bound_host_logs
from gpunodes.agent.runner import Runner

log = logging.getLogger(__name__)

RUNNER: Runner | None = None
# The agent's GPU health watcher (agent/health.py), where it has one: re-checks an admin asks for;
# and the event that sends a heartbeat at once (its answer).
HEALTH = None
BEAT_NOW = None
# The agent's DiskGuard (agent/disk.py): starts are refused while its disk is short.
DISK = None
# Host log files of finished attempts, per job and per user, in bytes (joblog.bound_host_logs): 0, none.
LOG_BYTES_PER_JOB = 0
LOG_BYTES_PER_USER = 0

NODE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$")  # gpunodes.models.NODE_NAME_RE
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# The control side checks an image fully (jobs/images.py); here only that it is one word podman reads as
# an image, never an option.
IMAGE = re.compile(r"^[a-z0-9][a-z0-9._:/@-]{0,254}$")
MAX_MOUNTS = 16
STATES = {"PENDING", "READY", "CORDONED", "DRAINING", "LOST"}
MAX_ARGV = 4096
MAX_ARG_BYTES = 256 * 1024


class Invalid(ValueError):
    pass


def _int(name: str, value, *, minimum: int = 0, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if type(value) is not int or value < minimum:
        raise Invalid(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _name(what: str, value) -> str:
    if not isinstance(value, str) or not NODE_NAME.match(value):
        raise Invalid(f"{what} must be a node name, got {value!r}")
    return value


def validate_start(msg: dict) -> dict:
    """The fields of a start message, checked; Invalid names the first bad one."""
    command = msg.get("command")
    if (
        not isinstance(command, list)
        or not command
        or len(command) > MAX_ARGV
        or not all(isinstance(a, str) and "\x00" not in a for a in command)
        or sum(len(a) for a in command) > MAX_ARG_BYTES
    ):
        raise Invalid("command must be a non-empty list of strings")
    env = msg.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and ENV_NAME.match(k) and isinstance(v, str) and "\x00" not in v
        for k, v in env.items()
    ):
        raise Invalid("env must map variable names to strings")
    use_shell = msg.get("use_shell", False)
    if type(use_shell) is not bool or (use_shell and len(command) != 1):
        raise Invalid("use_shell must be a bool, with a single command string")
    gpus = msg.get("gpus") or []
    if not isinstance(gpus, list | tuple) or len(set(gpus)) != len(gpus):
        raise Invalid("gpus must be a list of distinct GPU indexes")
    for g in gpus:
        _int("gpu index", g)
    world = msg.get("world")
    if world is not None:
        if not isinstance(world, list) or not world:
            raise Invalid("world must be a list of node names")
        for w in world:
            _name("world", w)
    rank = _int("rank", msg.get("rank", 0))
    if world is not None and rank >= len(world):
        raise Invalid("rank must index world")
    rendezvous = validate_rendezvous(msg.get("rendezvous"), nodes=len(world) if world is not None else 1)
    image = msg.get("image") or ""
    if not isinstance(image, str) or (image and IMAGE.match(image) is None):
        raise Invalid("image must be an image name (registry/path[:tag][@digest])")
    mounts = msg.get("mounts") or []
    if (
        not isinstance(mounts, list)
        or len(mounts) > MAX_MOUNTS
        or (mounts and not image)
        or not all(
            isinstance(m, dict)
            and set(m) == {"host", "container", "allowed_by"}
            and all(isinstance(v, str) and v.startswith("/") and "\x00" not in v for v in m.values())
            for m in mounts
        )
    ):
        # What the paths lead to is checked where they are mounted (containers.resolve_dataset).
        raise Invalid("mounts must be a container job's list of {host, container, allowed_by} paths")
    return {
        "attempt_id": _int("attempt_id", msg.get("attempt_id"), minimum=1),
        "number": _int("number", msg.get("number"), minimum=1),
        "job_id": _int("job_id", msg.get("job_id"), minimum=1),
        "command": list(command),
        "env": dict(env),
        "use_shell": use_shell,
        "gpus": list(gpus),
        "max_runtime_s": _int("max_runtime_s", msg.get("max_runtime_s"), minimum=1, optional=True),
        "grace_s": _int("grace_s", msg.get("grace_s", 30)),
        "rank": rank,
        "world": list(world) if world is not None else None,
        "rendezvous": rendezvous,
        # When the control side admitted the attempt (microseconds): a control side older than this
        # agent sends none.
        "admitted_us": _int("admitted_us", msg.get("admitted_us"), optional=True),
        # The job's owner (a user id): its host log files are bounded per user too.
        "user": _int("user", msg.get("user"), minimum=1, optional=True),
        # A container image to run the command in (containers.py); "" runs it on the host.
        "image": image,
        # Read-only datasets of a container job (containers.resolve_dataset), sent only where it has some.
        "mounts": [dict(m) for m in mounts],
    }


def validate_rendezvous(value, *, nodes: int) -> dict | None:
    """A start's rendezvous (rank 0's address and the attempt's port, every rank's address, the world
    in processes): each field checked, since they become the job's MASTER_ADDR, MASTER_PORT,
    GPUQUOTA_HOSTS and WORLD_SIZE. None: a control side that sends none."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"master_addr", "master_port", "hosts", "world_size"}:
        raise Invalid("rendezvous must have master_addr, master_port, hosts and world_size")
    hosts = value["hosts"]
    if not isinstance(hosts, list) or len(hosts) != nodes or not all(valid_address(h) for h in hosts):
        raise Invalid(f"rendezvous hosts must be {nodes} host address(es), one per rank")
    if not valid_address(value["master_addr"]) or value["master_addr"] != hosts[0]:
        raise Invalid("rendezvous master_addr must be rank 0's host address")
    port = value["master_port"]
    if type(port) is not int or not 1024 <= port <= 65535:
        raise Invalid(f"rendezvous master_port must be an int from 1024 to 65535, got {port!r}")
    return {
        "master_addr": value["master_addr"],
        "master_port": port,
        "hosts": list(hosts),
        "world_size": _int("rendezvous world_size", value["world_size"], minimum=1),
    }


def _mine(node) -> bool:
    if RUNNER is None or node != RUNNER.node:
        log.error("refusing a message for node %r: this agent is %r", node, RUNNER and RUNNER.node)
        return False
    return True


def open_env(fields: dict, node: str) -> dict:
    """The start's fields with its env opened, if the control side sealed it to this node (signed
    messages: gpunodes.signing.seal); Invalid if it cannot be opened here."""
    env = fields.get("env")
    if not isinstance(env, str):
        return fields
    from gpunodes import signing

    try:
        opened = signing.unseal(
            env, node=node, attempt_id=fields.get("attempt_id"), number=fields.get("number")
        )
    except (ValueError, SecurityError) as e:
        raise Invalid(f"env: {e}") from None
    return {**fields, "env": opened}


def refuse_unrecorded(task, kwargs: dict, why: str) -> None:
    """A start whose nonce this agent could not record (its state disk is full): whether it is a replay
    cannot be told, so it does not run; the control side hears at once that it was refused (re-queued,
    no strike), instead of waiting for it with the job ADMITTED."""
    attempt_id, number = kwargs.get("attempt_id"), kwargs.get("number")
    if RUNNER is None or kwargs.get("node") != RUNNER.node:
        return
    if type(attempt_id) is not int or type(number) is not int or attempt_id < 1 or number < 1:
        return
    RUNNER.refuse(
        attempt_id, number, f"{RUNNER.node} cannot record the start ({why}): is its state disk full?"
    )


@shared_task(
    name="gpunodes.agent.tasks.start_attempt",
    ignore_result=True,
    acks_late=True,
    on_unrecorded=refuse_unrecorded,
)
def start_attempt(*, node: str, **fields) -> str:
    if not _mine(node):
        return "refused"
    try:
        msg = validate_start(open_env(fields, node))
    except Invalid as e:
        log.error("refusing a start message: %s", e)
        return "refused"
    inventory = RUNNER.gpu_indexes
    if inventory is not None and not set(msg["gpus"]) <= inventory:
        log.error(
            "refusing a start of job %s, attempt %s: GPUs %s are not on this host",
            msg["job_id"],
            msg["number"],
            msg["gpus"],
        )
        return "refused"
    if RUNNER.node_state != "READY":
        log.warning(
            "refusing the start of job %s, attempt %s: this node is %s",
            msg["job_id"],
            msg["number"],
            RUNNER.node_state,
        )
        RUNNER.refuse(msg["attempt_id"], msg["number"], f"{RUNNER.node} is {RUNNER.node_state}")
        return "refused"
    short = DISK.short() if DISK is not None else ""
    if short:
        log.error("refusing the start of job %s, attempt %s: %s", msg["job_id"], msg["number"], short)
        RUNNER.refuse(msg["attempt_id"], msg["number"], short)
        return "refused"
    user = msg.pop("user")
    if LOG_BYTES_PER_JOB or LOG_BYTES_PER_USER:
        try:
            bound_host_logs(
                RUNNER.log_dir,
                job_id=msg["job_id"],
                user=user,
                live=RUNNER.live_logs(),
                cap_bytes=RUNNER.log_cap_bytes,
                per_job_bytes=LOG_BYTES_PER_JOB,
                per_user_bytes=LOG_BYTES_PER_USER,
            )
        except OSError as e:
            log.warning("cannot bound the host log files of job %s: %s", msg["job_id"], e)
    return RUNNER.start(**msg)


@shared_task(
    name="gpunodes.agent.tasks.preempt_attempt", ignore_result=True, acks_late=True, replay_safe=True
)
def preempt_attempt(*, node: str, attempt_id: int, number: int, grace_s: int = 30) -> str:
    if not _mine(node):
        return "refused"
    try:
        attempt_id, number = _int("attempt_id", attempt_id, minimum=1), _int("number", number, minimum=1)
        grace_s = _int("grace_s", grace_s)
    except Invalid as e:
        log.error("refusing a stop message: %s", e)
        return "refused"
    return RUNNER.stop(attempt_id=attempt_id, number=number, grace_s=grace_s)


@shared_task(name="gpunodes.agent.tasks.node_state", ignore_result=True)
def node_state(*, node: str, state: str) -> str:
    """The control side's word on this node's state: starts are refused unless READY."""
    if not _mine(node):
        return "refused"
    if state not in STATES:
        log.error("refusing a node state %r", state)
        return "refused"
    if RUNNER.node_state != state:
        log.info("node %s is now %s", node, state)
        RUNNER.node_state = state
    return state


@shared_task(name="gpunodes.agent.tasks.outbox_ack", ignore_result=True, replay_safe=True)
def outbox_ack(*, node: str, epoch: str, ids: list, relog: list | None = None) -> int:
    """The control side applied these outbox entries (agent/outbox.py): they leave the outbox. `relog`:
    [entry id, start, end] of the log bytes it still lacks of an end it holds back (sent again)."""
    if not _mine(node):
        return 0
    relog = relog or []
    if not isinstance(epoch, str) or not isinstance(ids, list) or len(ids) > 10_000:
        log.error("refusing an outbox ack: %r, %d ids", epoch, len(ids) if isinstance(ids, list) else -1)
        return 0
    try:
        ids = [_int("outbox id", i, minimum=1) for i in ids]
        if not isinstance(relog, list) or len(relog) > 1000:
            raise Invalid("relog must be a list of at most 1000 gaps")
        gaps: dict[int, list[tuple[int, int]]] = {}
        for gap in relog:
            if not isinstance(gap, list) or len(gap) != 3:
                raise Invalid(f"a gap must be [entry id, start, end], got {gap!r}")
            entry_id, start = _int("outbox id", gap[0], minimum=1), _int("start", gap[1])
            gaps.setdefault(entry_id, []).append((start, _int("end", gap[2], minimum=start + 1)))
    except Invalid as e:
        log.error("refusing an outbox ack: %s", e)
        return 0
    if epoch != RUNNER.outbox.epoch:
        return 0
    for entry_id, wanted in gaps.items():
        RUNNER.reship_log(entry_id, wanted)
    return RUNNER.outbox.ack(ids, epoch)


@shared_task(name="gpunodes.agent.tasks.gpu_recheck", ignore_result=True, replay_safe=True)
def gpu_recheck(*, node: str, index: int, token: int) -> str:
    """An admin marked this GPU healthy (after a reset): check it now, before it takes work again. The
    answer goes with the next heartbeat (sent at once): `rechecked` carries the token, `unhealthy`
    lists the GPU again if the check found it still broken."""
    if not _mine(node):
        return "refused"
    try:
        index, token = _int("index", index), _int("token", token, minimum=1)
    except Invalid as e:
        log.error("refusing a GPU re-check: %s", e)
        return "refused"
    if HEALTH is None:
        log.error("refusing a re-check of GPU %d: this agent watches no GPU health", index)
        return "refused"
    fault = HEALTH.recheck(index, token)
    if BEAT_NOW is not None:
        BEAT_NOW.set()
    return "unhealthy" if fault is not None else "healthy"


@shared_task(name="gpunodes.agent.tasks.log_cut", ignore_result=True, replay_safe=True)
def log_cut(*, node: str, attempt_id: int, number: int) -> str:
    """The control side cut this attempt's stored output (its team's budget, TEAM_OUTPUT_MAX_BYTES):
    the runner ships no more of it (backpressure: none of it waits on the broker or the control queue)."""
    if not _mine(node):
        return "refused"
    try:
        attempt_id, number = _int("attempt_id", attempt_id, minimum=1), _int("number", number, minimum=1)
    except Invalid as e:
        log.error("refusing a log cut: %s", e)
        return "refused"
    if RUNNER is None:
        return "refused"
    return "stopped" if RUNNER.stop_log(attempt_id, number) else "not running"
