"""Job verbs: submit, cancel, change priority, release; who may do what; read-outs of jobs and logs.
Every state change goes through jobs.transitions (one compare-and-set that writes its event)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError
from django.db import connections, router, transaction
from django.db.models import Count
from django.utils import timezone

from jobs import images, limits, signals
from jobs import mounts as job_mounts
from jobs.choices import (
    JOB_OPEN_STATES,
    JOB_STOPPING_STATES,
    JOB_TERMINAL_STATES,
    EventKind,
    JobState,
)
from jobs.models import Job, JobArray, JobEvent
from jobs.transitions import record_event, transition
from quotas.choices import Role, Strategy
from quotas.models import GPU_TYPE_RE, Membership, Share

MAX_NAME = limits.MAX_NAME
MAX_COMMAND_ARGS = 256
MAX_COMMAND_BYTES = 16 * 1024
MAX_ENV_VARS = 128
MAX_ENV_BYTES = 32 * 1024
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Set by the agent for every attempt; a job may not override them (nor anything else GPUQUOTA_*).
RESERVED_ENV = frozenset(
    {"CUDA_VISIBLE_DEVICES", "GPUQUOTA_JOB_ID", "GPUQUOTA_ATTEMPT", "GPUQUOTA_CHECKPOINT_DIR"}
)
RESERVED_ENV_PREFIX = "GPUQUOTA_"


class Conflict(Exception):
    """The request is valid but the job's state does not allow it (HTTP 409)."""


# --- permissions ----------------------------------------------------------------------------------


def role_in_team(user, team_id: int) -> str | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(user=user, team_id=team_id).values_list("role", flat=True).first()


def can_submit(user, share: Share) -> bool:
    return bool(user.is_authenticated and (user.is_superuser or role_in_team(user, share.team_id)))


def can_manage_job(user, job: Job) -> bool:
    """Owner, a manager of the job's team, or an admin."""
    if not user.is_authenticated:
        return False
    if user.is_superuser or job.submitted_by_id == user.pk:
        return True
    return role_in_team(user, job.share.team_id) == Role.MANAGER


# --- validation -------------------------------------------------------------------------------------


def node_shapes(gpu_type: str | None = None) -> dict[str, dict[int, int]]:
    """Known node shapes (cached: jobs.submit_cache), optionally of one GPU type."""
    from jobs import submit_cache

    shapes = submit_cache.lookup(None)[0]
    if gpu_type is not None:
        return {gpu_type: shapes[gpu_type]} if gpu_type in shapes else {}
    return shapes


def describe_shapes(shapes: Mapping[str, Mapping[int, int]]) -> str:
    parts = [
        f"{count} × {size} {t}"
        for t, sizes in sorted(shapes.items())
        for size, count in sorted(sizes.items())
    ]
    return ", ".join(parts) or "no GPU nodes are registered"


def check_fits(
    gpu_type: str, gpus: int, shapes: Mapping[str, Mapping[int, int]] | None = None
) -> tuple[str, str] | None:
    """None if some node shape can hold the request, else (field, message) saying why not."""
    if shapes is None:
        shapes = node_shapes()
    if gpu_type not in shapes:
        return "gpu_type", f'No node has GPU type "{gpu_type}". Known node shapes: {describe_shapes(shapes)}.'
    sizes = shapes[gpu_type]
    largest = max(sizes)
    if gpus <= largest:
        return None
    if gpus % largest:
        return "gpus", (
            f"{gpus} GPUs do not fit on one {gpu_type} node (largest has {largest}); a larger job must ask "
            f"for whole nodes, a multiple of {largest}. Known node shapes: {describe_shapes(shapes)}."
        )
    if gpus // largest > sizes[largest]:
        return "gpus", (
            f"{gpus} GPUs need {gpus // largest} whole {largest}-GPU {gpu_type} nodes but only "
            f"{sizes[largest]} exist. Known node shapes: {describe_shapes(shapes)}."
        )
    return None


def share_never_fits(
    share: Share, gpu_type: str, gpus: int, capacities: Mapping[str, int] | None = None
) -> str | None:
    """Why the share can never hold this job as it is configured (policy.never_fits), or None. An
    unlimited borrower needs no look at its capacity: no query on the common path. `capacities`: the
    share's, when the caller has them (cached: see Known)."""
    from quotas.engine import policy

    if share.strategy == Strategy.LEND_AND_BORROW and share.borrow_limit == policy.UNLIMITED:
        return None
    if capacities is not None:
        cap = capacities.get(gpu_type, 0)
    else:
        cap = share.capacities.filter(gpu_type=gpu_type).values_list("max_gpus", flat=True).first() or 0
    view = policy.ShareView(
        name=share.name, capacity={gpu_type: cap}, strategy=share.strategy, borrow_limit=share.borrow_limit
    )
    return policy.never_fits(view, gpu_type, gpus)


def _validate_command(command: Any, use_shell: bool) -> list[str]:
    if not isinstance(command, (list, tuple)) or not command:
        raise ValidationError({"command": "Give the command as a non-empty list of arguments."})
    if not all(isinstance(a, str) for a in command):
        raise ValidationError({"command": "Every argument must be a string."})
    if len(command) > MAX_COMMAND_ARGS:
        raise ValidationError({"command": f"At most {MAX_COMMAND_ARGS} arguments."})
    if sum(len(a.encode()) for a in command) > MAX_COMMAND_BYTES:
        raise ValidationError({"command": f"The command may be at most {MAX_COMMAND_BYTES} bytes."})
    if any("\x00" in a for a in command):
        raise ValidationError({"command": "Arguments may not contain NUL characters."})
    if use_shell and len(command) != 1:
        raise ValidationError({"command": "With use_shell, give the shell command line as one string."})
    return list(command)


def _validate_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ValidationError({"env": "Give env as a map of NAME to string value."})
    if len(env) > MAX_ENV_VARS:
        raise ValidationError({"env": f"At most {MAX_ENV_VARS} variables."})
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise ValidationError({"env": f'"{name}" is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*).'})
        if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIX):
            raise ValidationError({"env": f"{name} is set by gpuquota for every attempt."})
        if not isinstance(value, str) or "\x00" in value:
            raise ValidationError({"env": f"The value of {name} must be a string without NUL characters."})
    if sum(len(k) + len(v.encode()) for k, v in env.items()) > MAX_ENV_BYTES:
        raise ValidationError({"env": f"env may be at most {MAX_ENV_BYTES} bytes."})
    return dict(env)


# --- verbs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """What the quick submit path (jobs.api.fast_submit) read from the cache in its one round trip
    (jobs.submit_cache): node shapes, the user's team ids and the share's capacities. A cached share
    may be stale; job_submit's insert checks it (see insert_job_with_event)."""

    shapes: dict[str, dict[int, int]]
    team_ids: list[int]
    capacities: dict[str, int]


def job_submit(
    *,
    user,
    share: Share,
    gpus: int,
    gpu_type: str,
    command: Sequence[str],
    name: str = "",
    priority: int = 0,
    env: Mapping[str, str] | None = None,
    max_runtime_s: int | None = None,
    preemption_grace_s: int | None = None,
    max_preemptions: int = -1,
    use_shell: bool = False,
    image: str = "",
    mounts: Sequence[str] = (),
    submitted_at=None,
    known: Known | None = None,
) -> Job | None:
    """Validate and queue a job. Raises PermissionDenied or ValidationError({field: message}).

    With `known` (the quick submit path's cached facts) the job is decided on those and the insert
    checks the share's facts in the same statement: None when they were stale (nothing written; ask
    again without `known`)."""
    job = _new_job(
        user=user,
        share=share,
        gpus=gpus,
        gpu_type=gpu_type,
        command=command,
        name=name,
        priority=priority,
        env=env,
        max_runtime_s=max_runtime_s,
        preemption_grace_s=preemption_grace_s,
        max_preemptions=max_preemptions,
        use_shell=use_shell,
        image=image,
        mounts=mounts,
        submitted_at=submitted_at,
        known=known,
    )
    event = JobEvent(
        kind=EventKind.SUBMITTED,
        reason=f"by {user.get_username()} to share {share.name}"[:300],
        detail={"gpus": gpus, "gpu_type": gpu_type, "priority": priority},
        at=job.submitted_at,
    )
    cap = settings.MAX_QUEUED_PER_USER
    if known is None:
        check_user_queue(user, 1)
    if not insert_job_with_event(
        job,
        event,
        check=known and {**_share_facts(job.share, known, gpu_type), "user_id": user.pk, "cap": cap},
    ):
        return None
    _after_commit_request_pass("submit", coalesce=True, reforecast=True)
    job.submitted_event = event  # for an answer built without reading the job back (known_related)
    return job


def check_user_queue(user, adding: int) -> None:
    """Refuse a submit that would take the user past MAX_QUEUED_PER_USER queued jobs, with both numbers.
    Counts at most the cap (an index range scan: job_user_state_idx), so a user far below it pays little.
    Concurrent submits of one user may pass it by the number in flight at once."""
    cap = settings.MAX_QUEUED_PER_USER
    queued = Job.objects.filter(submitted_by_id=user.pk, state=JobState.QUEUED)[: cap + 1].count()
    if queued + adding <= cap:
        return
    have = f"{queued:,}" if queued <= cap else f"more than {cap:,}"
    what = "1 more job" if adding == 1 else f"{adding:,} more"
    raise ValidationError(
        {
            "array" if adding > 1 else NON_FIELD_ERRORS: (
                f"You have {have} jobs queued; {what} would pass the limit of {cap:,} queued jobs per user "
                f"(MAX_QUEUED_PER_USER). Submit at most {max(0, cap - queued):,} now, or wait for your queue "
                "to drain."
            )
        }
    )


def _new_job(
    *,
    user,
    share: Share,
    gpus: int,
    gpu_type: str,
    command: Sequence[str],
    name: str = "",
    priority: int = 0,
    env: Mapping[str, str] | None = None,
    max_runtime_s: int | None = None,
    preemption_grace_s: int | None = None,
    max_preemptions: int = -1,
    use_shell: bool = False,
    image: str = "",
    mounts: Sequence[str] = (),
    submitted_at=None,
    errors: dict[str, str] | None = None,
    known: Known | None = None,
) -> Job:
    """A validated, unsaved job: the rules every submit (single or array) goes through. `errors` are
    the caller's own, reported together with these."""
    from jobs import submit_cache

    # Node shapes and the user's teams: one cache read instead of two queries.
    if known is not None:
        shapes, team_ids = known.shapes, known.team_ids
    else:
        shapes, team_ids = submit_cache.lookup(user.pk if user.is_authenticated else None)
    if not (user.is_authenticated and (user.is_superuser or share.team_id in (team_ids or ()))):
        raise PermissionDenied(
            f'You are not a member of team "{share.team}", which owns share "{share.name}".'
        )
    errors = dict(errors or {})
    if not share.is_enabled:
        errors["share"] = f'Share "{share.name}" is disabled and takes no new jobs.'
    if not isinstance(gpu_type, str) or not re.match(GPU_TYPE_RE, gpu_type):
        errors["gpu_type"] = "A GPU type is a lower-case name such as a10g or h100."
    # The one set of limits (jobs.limits), in the words every interface uses.
    for limit, value in (
        (limits.GPUS, gpus),
        (limits.PRIORITY, priority),
        (limits.MAX_PREEMPTIONS, max_preemptions),
        (limits.MAX_RUNTIME, max_runtime_s),
        (limits.PREEMPTION_GRACE, preemption_grace_s),
    ):
        if value is not None or limit in (limits.GPUS, limits.PRIORITY, limits.MAX_PREEMPTIONS):
            problem = limit.problem(value)
            if problem:
                errors[limit.field] = problem
    if len(name or "") > MAX_NAME:
        errors["name"] = f"A name may be at most {MAX_NAME} characters."
    if "gpus" not in errors and "gpu_type" not in errors:
        problem = check_fits(gpu_type, gpus, shapes)
        if problem:
            errors[problem[0]] = problem[1]
        else:
            never = share_never_fits(share, gpu_type, gpus, known and known.capacities)
            if never:
                errors["gpus"] = never
    try:
        command = _validate_command(command, use_shell)
    except ValidationError as e:
        errors.update({k: v[0] for k, v in e.message_dict.items()})
    try:
        env = _validate_env(env)
    except ValidationError as e:
        errors.update({k: v[0] for k, v in e.message_dict.items()})
    image = image or ""
    if image:
        problem = images.image_problem(image, share_name=share.name, share_rules=share.allowed_images)
        if problem:
            errors["image"] = problem
    stored_mounts, problem = job_mounts.mounts_problem(
        list(mounts) if isinstance(mounts, tuple) else mounts,
        image=image,
        share_name=share.name,
        share_rules=share.allowed_mounts,
    )
    if problem:
        errors["mounts"] = problem
    if errors:
        raise ValidationError(errors)

    return Job(
        share=share,
        submitted_by=user,
        name=name or "",
        gpu_type=gpu_type,
        gpus=gpus,
        priority=priority,
        command=command,
        use_shell=use_shell,
        image=image,
        mounts=stored_mounts,
        env=env,
        max_runtime_s=max_runtime_s,
        preemption_grace_s=(
            limits.effective_grace(settings.DEFAULT_PREEMPTION_GRACE_S)
            if preemption_grace_s is None
            else preemption_grace_s
        ),
        max_preemptions=max_preemptions,
        submitted_at=submitted_at or timezone.now(),
    )


ARRAY_INDEX_ENV = "GPUQUOTA_ARRAY_INDEX"
MAX_INDEX = 2**31 - 1


def job_array_submit(*, user, share: Share, size: int, first_index: int = 0, **fields: Any) -> JobArray:
    """Validate and queue an array: `size` jobs alike but for their index (first_index, first_index+1,
    ...), each with GPUQUOTA_ARRAY_INDEX in its env, all created in one transaction. Refused whole when
    it is larger than MAX_ARRAY_SIZE or would take the share's queue past MAX_QUEUED_PER_SHARE or the
    user's past MAX_QUEUED_PER_USER."""
    errors = {}
    problem = limits.ARRAY_SIZE.problem(size)
    if problem:
        errors["array"] = problem
    elif not isinstance(first_index, int) or isinstance(first_index, bool) or first_index < 0:
        errors["array"] = "The first index of an array is 0 or more."
    elif first_index + size - 1 > MAX_INDEX:
        errors["array"] = f"Array indexes go up to {MAX_INDEX}."
    proto = _new_job(user=user, share=share, errors=errors, **fields)
    cap = settings.MAX_QUEUED_PER_SHARE
    with transaction.atomic():
        # The share's row lock serialises arrays into one share, so two cannot both pass the cap.
        Share.objects.select_for_update().filter(pk=share.pk).values_list("pk").first()
        check_user_queue(user, size)
        queued = Job.objects.filter(share=share, state=JobState.QUEUED).count()
        if queued + size > cap:
            raise ValidationError(
                {
                    "array": f'Share "{share.name}" has {queued:,} jobs queued; {size:,} more would pass its '
                    f"limit of {cap:,} (MAX_QUEUED_PER_SHARE). Submit at most {max(0, cap - queued):,} now, "
                    "or wait for the queue to drain."
                }
            )
        array = JobArray.objects.create(
            share=share,
            submitted_by=user,
            name=proto.name,
            first_index=first_index,
            size=size,
            submitted_at=proto.submitted_at,
        )
        proto.array = array
        reason = f"by {user.get_username()} to share {share.name}, array {array.pk} task "
        detail = {
            "gpus": proto.gpus,
            "gpu_type": proto.gpu_type,
            "priority": proto.priority,
            "array": array.pk,
        }
        _insert_tasks(proto, range(first_index, first_index + size), reason, detail)
        _after_commit_request_pass("array submitted", reforecast=True)
    return array


def _insert_tasks(proto: Job, indexes: range, reason: str, detail: dict) -> None:
    """Insert one job per index, copies of `proto`, each with its SUBMITTED event. On PostgreSQL one
    statement builds them all on the server (generate_series); elsewhere two bulk inserts."""
    conn = connections[router.db_for_write(Job)]
    if conn.vendor != "postgresql":
        tasks = []
        for i in indexes:
            task = Job(
                **{
                    f.attname: getattr(proto, f.attname)
                    for f in Job._meta.concrete_fields
                    if not f.primary_key
                }
            )
            task.array_index, task.env = i, {**proto.env, ARRAY_INDEX_ENV: str(i)}
            tasks.append(task)
        Job.objects.bulk_create(tasks, batch_size=500)
        JobEvent.objects.bulk_create(
            [
                JobEvent(
                    job_id=t.pk,
                    kind=EventKind.SUBMITTED,
                    reason=f"{reason}{t.array_index}"[:300],
                    detail=detail,
                    at=t.submitted_at,
                )
                for t in tasks
            ],
            batch_size=500,
        )
        return
    qn = conn.ops.quote_name
    fields = [f for f in Job._meta.concrete_fields if not f.primary_key]
    exprs, params = [], []
    for f in fields:
        if f.attname == "array_index":
            exprs.append("g")
        elif f.attname == "env":
            exprs.append(f"(CAST(%s AS jsonb) || jsonb_build_object('{ARRAY_INDEX_ENV}', g::text))")
            params.append(f.get_db_prep_save(f.pre_save(proto, True), connection=conn))
        else:
            exprs.append(f"CAST(%s AS {f.cast_db_type(conn)})")
            params.append(f.get_db_prep_save(f.pre_save(proto, True), connection=conn))
    at = JobEvent._meta.get_field("at")
    detail_field = JobEvent._meta.get_field("detail")
    sql = (
        f"WITH t AS (INSERT INTO {qn(Job._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
        f"SELECT {', '.join(exprs)} FROM generate_series(%s, %s) AS g ORDER BY g "
        f"RETURNING {qn('id')}, {qn('array_index')}) "
        f"INSERT INTO {qn(JobEvent._meta.db_table)} ({qn('job_id')}, {qn('attempt_number')}, {qn('at')}, "
        f"{qn('kind')}, {qn('reason')}, {qn('detail')}) "
        f"SELECT t.{qn('id')}, NULL, CAST(%s AS {at.cast_db_type(conn)}), %s, "
        f"LEFT(CAST(%s AS text) || t.{qn('array_index')}::text, 300), CAST(%s AS jsonb) FROM t"
    )
    params += [
        indexes.start,
        indexes.stop - 1,
        at.get_db_prep_save(proto.submitted_at, connection=conn),
        EventKind.SUBMITTED.value,
        reason,
        detail_field.get_db_prep_save(detail, connection=conn),
    ]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)


def array_tasks(array: JobArray):
    return Job.objects.filter(array=array)


def array_counts(array_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """{array id: {state: number of tasks}} in one aggregate."""
    out: dict[int, dict[str, int]] = {a: {} for a in array_ids}
    rows = (
        Job.objects.filter(array_id__in=list(array_ids))
        .values_list("array_id", "state")
        .annotate(n=Count("id"))
        .order_by()
    )
    for array_id, state, n in rows:
        out[array_id][state] = n
    return out


def can_manage_array(user, array: JobArray) -> bool:
    if not user.is_authenticated:
        return False
    if user.is_superuser or array.submitted_by_id == user.pk:
        return True
    return role_in_team(user, array.share.team_id) == Role.MANAGER


def array_set_priority(*, user, array: JobArray, priority: int) -> int:
    """Set the priority of every task that has not ended. Returns how many changed."""
    if not can_manage_array(user, array):
        raise PermissionDenied("Only the array's owner, a team manager or an admin may change its priority.")
    if problem := limits.PRIORITY.problem(priority):
        raise ValidationError({"priority": problem})
    now = timezone.now()
    with transaction.atomic():
        rows = list(
            Job.objects.select_for_update()
            .filter(array=array, state__in=[s.value for s in JOB_OPEN_STATES])
            .exclude(priority=priority)
            .values_list("pk", "priority")
        )
        if (
            not rows
            and not Job.objects.filter(array=array, state__in=[s.value for s in JOB_OPEN_STATES]).exists()
        ):
            raise Conflict(f"Every task of array {array.pk} has ended; its priority no longer matters.")
        Job.objects.filter(pk__in=[pk for pk, _ in rows]).update(priority=priority, updated_at=now)
        who = user.get_username()
        JobEvent.objects.bulk_create(
            [
                JobEvent(
                    job_id=pk,
                    kind=EventKind.PRIORITY_CHANGED,
                    reason=f"{old} → {priority} by {who} (array)",
                    detail={"from": old, "to": priority, "array": array.pk},
                    at=now,
                )
                for pk, old in rows
            ],
            batch_size=1000,
        )
        if rows:
            _after_commit_request_pass("priority", reforecast=True)
    return len(rows)


def array_cancel(*, user, array: JobArray) -> int:
    """Cancel every task that has not ended: the queued and held ones at once, in bulk; live ones through
    the job's own cancel (CANCELLING until their attempts are stopped, with their grace). Returns how
    many were cancelled now; tasks already CANCELLING are not counted again, and are no conflict."""
    if not can_manage_array(user, array):
        raise PermissionDenied("Only the array's owner, a team manager or an admin may cancel it.")
    from jobs import lifecycle

    who = user.get_username()
    now = timezone.now()
    waiting = [JobState.QUEUED, JobState.HELD]
    with transaction.atomic():
        queued = list(
            Job.objects.select_for_update()
            .filter(array=array, state__in=waiting)
            .values_list("pk", flat=True)
        )
        Job.objects.filter(pk__in=queued, state__in=waiting).update(
            state=JobState.CANCELLED,
            state_reason=f"by {who} (array)"[:300],
            finished_at=now,
            updated_at=now,
            beneficiary=False,
        )
        JobEvent.objects.bulk_create(
            [
                JobEvent(job_id=pk, kind=EventKind.CANCELLED, reason=f"by {who} (array)", at=now)
                for pk in queued
            ],
            batch_size=1000,
        )
        if queued:
            _after_commit_request_pass("cancel", reforecast=True)
    live = list(
        Job.objects.filter(array=array, state__in=[s.value for s in JOB_OPEN_STATES])
        .exclude(state=JobState.CANCELLING)
        .values_list("pk", flat=True)
    )
    cancelled = len(queued) + sum(1 for pk in live if lifecycle.cancel(pk, by=who))
    if not cancelled and not Job.objects.filter(array=array, state=JobState.CANCELLING).exists():
        raise Conflict(f"Every task of array {array.pk} has already ended; there is nothing to cancel.")
    return cancelled


def fold_arrays(entries: list[dict], can_manage=None) -> list[dict]:
    """Queue rows ({"job": Job, ...}, in queue order) with every array's tasks folded into one row at
    the place of its first task: {"array": JobArray, "counts": {state: n}, "tasks": [rows], ...the
    first task's position, eta and waiting}. Two queries, whatever the number of rows."""
    ids = {e["job"].array_id for e in entries if e["job"].array_id}
    if not ids:
        return entries
    arrays = JobArray.objects.select_related("share", "submitted_by").in_bulk(list(ids))
    counts = array_counts(list(ids))
    folded: list[dict] = []
    rows: dict[int, dict] = {}
    for e in entries:
        array_id = e["job"].array_id
        if not array_id:
            folded.append(e)
        elif array_id in rows:
            rows[array_id]["tasks"].append(e)
        else:
            array = arrays[array_id]
            rows[array_id] = {
                **e,
                "array": array,
                "counts": counts[array_id],
                "tasks": [e],
                "can_manage": can_manage(array) if can_manage else False,
            }
            folded.append(rows[array_id])
    return folded


def known_related(job: Job) -> Job:
    """A job just returned by job_submit, with its attempts (none) and events (its SUBMITTED) filled in
    as if prefetched: serializing it needs no query. Only for answering the submit at once: the filled
    lists do not follow later changes (refresh_from_db() clears them)."""
    _known_related(job, attempts=[], events=[job.submitted_event])
    return job


def _known_related(job: Job, **related: list) -> None:
    """Fill the prefetch cache of a job just created."""
    cache = job.__dict__.setdefault("_prefetched_objects_cache", {})
    for name, objs in related.items():
        qs = getattr(job, name).all()
        qs._result_cache, qs._prefetch_done = list(objs), True
        cache[name] = qs


def insert_job_with_event(job: Job, event: JobEvent, *, check: dict | None = None) -> bool:
    """Store a new job and its first event. On PostgreSQL one statement (a data-modifying CTE: atomic
    on its own, one round trip instead of BEGIN, two INSERTs and COMMIT); elsewhere two inserts in a
    transaction. Sets the primary keys of both.

    `check` (PostgreSQL only; _share_facts, with the user's id and MAX_QUEUED_PER_USER as "cap"): the
    share as the job was decided on. The statement inserts only if the share's row still says so and the
    user has fewer than "cap" jobs queued, and returns False when not (nothing written)."""
    conn = connections[router.db_for_write(Job)]
    if conn.vendor != "postgresql":
        if check is not None:
            return False  # no checked insert here: decide from the database instead
        with transaction.atomic(using=conn.alias):
            job.save(force_insert=True, using=conn.alias)
            event.job = job
            event.save(force_insert=True, using=conn.alias)
        return True
    job_cols, job_params = _insert_columns(job, conn)
    event_cols, event_params = _insert_columns(event, conn, skip={"job_id"})
    qn = conn.ops.quote_name
    marks = ", ".join(["%s"] * len(job_cols))
    if check is None:
        guard, guard_params, source = "", [], f"VALUES ({marks})"
    else:
        guard, guard_params = _share_check_sql(conn, check)
        guard, source = f"ok AS ({guard}), ", f"SELECT {marks} FROM ok"
    sql = (
        f"WITH {guard}j AS (INSERT INTO {qn(Job._meta.db_table)} ({', '.join(job_cols)}) "
        f"{source} RETURNING {qn(Job._meta.pk.column)}) "
        f"INSERT INTO {qn(JobEvent._meta.db_table)} ({qn('job_id')}, {', '.join(event_cols)}) "
        f"SELECT {qn(Job._meta.pk.column)}, {', '.join(['%s'] * len(event_cols))} FROM j "
        f"RETURNING {qn('job_id')}, {qn(JobEvent._meta.pk.column)}"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [*guard_params, *job_params, *event_params])
        row = cursor.fetchone()
    if row is None:
        return False
    job.pk, event.pk, event.job = row[0], row[1], job
    for obj in (job, event):
        obj._state.adding, obj._state.db = False, conn.alias
    return True


def _share_facts(share: Share, known: Known, gpu_type: str) -> dict:
    """What a submit decided from about its share (enabled, owning team, strategy, borrow limit, the
    capacity of the job's type) and shows of it (names): checked by the insert."""
    return {
        "id": share.pk,
        "name": share.name,
        "state": share.state,
        "team_id": share.team_id,
        "strategy": share.strategy,
        "borrow_limit": share.borrow_limit,
        "team_slug": share.team.slug,
        "gpu_type": gpu_type,
        "capacity": known.capacities.get(gpu_type, 0),
    }


_SHARE_CHECK_KEYS = (
    "id",
    "name",
    "state",
    "team_id",
    "strategy",
    "borrow_limit",
    "team_slug",
    "gpu_type",
    "capacity",
    "user_id",
    "state_queued",
    "cap",
    "cap",
)
_share_check_text: dict[str, str] = {}  # per connection alias: built once, not on every submit


def _share_check_sql(conn, check: dict) -> tuple[str, list]:
    """A SELECT that yields one row exactly when the share's row and its capacity match `check` and the
    submitting user has fewer than `cap` jobs queued (MAX_QUEUED_PER_USER: counted up to the cap only)."""
    sql = _share_check_text.get(conn.alias)
    if sql is None:
        sql = _share_check_text[conn.alias] = _build_share_check(conn)
    check = {**check, "state_queued": JobState.QUEUED.value}
    return sql, [check[k] for k in _SHARE_CHECK_KEYS]


def _build_share_check(conn) -> str:
    from quotas.models import ShareCapacity, Team

    qn = conn.ops.quote_name

    def col(model, name):
        return qn(model._meta.get_field(name).column)

    return (
        f"SELECT 1 FROM {qn(Share._meta.db_table)} s JOIN {qn(Team._meta.db_table)} t "
        f"ON t.{col(Team, 'id')} = s.{col(Share, 'team')} "
        f"WHERE s.{col(Share, 'id')} = %s AND s.{col(Share, 'name')} = %s AND s.{col(Share, 'state')} = %s "
        f"AND s.{col(Share, 'team')} = %s AND s.{col(Share, 'strategy')} = %s "
        f"AND s.{col(Share, 'borrow_limit')} = %s AND t.{col(Team, 'slug')} = %s "
        f"AND COALESCE((SELECT c.{col(ShareCapacity, 'max_gpus')} FROM {qn(ShareCapacity._meta.db_table)} c "
        f"WHERE c.{col(ShareCapacity, 'share')} = s.{col(Share, 'id')} "
        f"AND c.{col(ShareCapacity, 'gpu_type')} = %s), 0) = %s "
        f"AND (SELECT COUNT(*) FROM (SELECT 1 FROM {qn(Job._meta.db_table)} j "
        f"WHERE j.{col(Job, 'submitted_by')} = %s AND j.{col(Job, 'state')} = %s LIMIT %s) q) < %s"
    )


def _insert_columns(obj, conn, *, skip: frozenset[str] | set[str] = frozenset()) -> tuple[list[str], list]:
    """Column names and database values of a new row, as Django's own INSERT computes them."""
    fields = [f for f in type(obj)._meta.concrete_fields if not f.primary_key and f.attname not in skip]
    return (
        [conn.ops.quote_name(f.column) for f in fields],
        [f.get_db_prep_save(f.pre_save(obj, True), connection=conn) for f in fields],
    )


def job_set_priority(*, user, job: Job, priority: int) -> Job:
    return job_update(user=user, job=job, priority=priority)


def job_update(*, user, job: Job, priority: int | None = None, preemption_grace_s: int | None = None) -> Job:
    """Change the priority and/or the grace of a job that has not ended (owner, team manager, admin),
    each change an event. A new priority counts from the next pass; a new grace from the job's next stop
    (an attempt already stopping keeps the grace it was stopped with)."""
    if not can_manage_job(user, job):
        raise PermissionDenied("Only the job's owner, a team manager or an admin may change its priority.")
    errors = {}
    for limit, value in ((limits.PRIORITY, priority), (limits.PREEMPTION_GRACE, preemption_grace_s)):
        if value is not None and (problem := limit.problem(value)):
            errors[limit.field] = problem
    if priority is None and preemption_grace_s is None and not errors:
        errors[NON_FIELD_ERRORS] = "Give priority, preemption_grace_s or both."
    if errors:
        raise ValidationError(errors)
    who = user.get_username()
    with transaction.atomic():
        old_priority, old_grace, state = (
            Job.objects.select_for_update()
            .filter(pk=job.pk)
            .values_list("priority", "preemption_grace_s", "state")
            .get()
        )
        if state in JOB_TERMINAL_STATES:
            what = "its priority no longer matters" if priority is not None else "its grace no longer matters"
            raise Conflict(f"Job {job.pk} has already ended ({state}); {what}.")
        now = timezone.now()
        if priority is not None and old_priority != priority:
            Job.objects.filter(pk=job.pk).update(priority=priority, updated_at=now)
            record_event(
                job.pk,
                EventKind.PRIORITY_CHANGED,
                f"{old_priority} → {priority} by {who}",
                detail={"from": old_priority, "to": priority},
                at=now,
            )
            _after_commit_request_pass("priority", reforecast=True)
        if preemption_grace_s is not None and old_grace != preemption_grace_s:
            Job.objects.filter(pk=job.pk).update(preemption_grace_s=preemption_grace_s, updated_at=now)
            later = (
                " (from its next stop: its attempt is already stopping)"
                if state in JOB_STOPPING_STATES
                else ""
            )
            record_event(
                job.pk,
                EventKind.GRACE_CHANGED,
                f"grace {old_grace} s → {preemption_grace_s} s by {who}{later}",
                detail={"from": old_grace, "to": preemption_grace_s},
                at=now,
            )
    job.refresh_from_db()
    return job


def job_cancel(*, user, job: Job) -> Job:
    """Cancel a job (jobs.lifecycle.cancel): a queued or held one at once; a live one is stopped as a
    pre-emption stops it and shows CANCELLING, its GPUs held, until its host reports it stopped (or the
    stop expires); then CANCELLED. Cancelling a job already CANCELLING changes nothing."""
    if not can_manage_job(user, job):
        raise PermissionDenied("Only the job's owner, a team manager or an admin may cancel it.")
    from jobs import lifecycle

    if not lifecycle.cancel(job.pk, by=user.get_username()):
        job.refresh_from_db()
        raise Conflict(f"Job {job.pk} has already ended ({job.state}); there is nothing to cancel.")
    job.refresh_from_db()
    return job


def job_release(*, user, job: Job) -> Job:
    """Release a HELD job (an admin only, as Slurm's `scontrol release` of an admin hold): it is queued
    again with its original submit time, its count of attempts lost with their agent back to 0."""
    if not (user.is_authenticated and user.is_superuser):
        raise PermissionDenied("Only an admin may release a held job.")
    with transaction.atomic():
        if not transition(
            job.pk,
            from_states=[JobState.HELD],
            to_state=JobState.QUEUED,
            event=EventKind.RELEASED,
            reason=f"released by {user.get_username()}; queued again with its original submit time",
            node_lost_streak=0,
            strike_nodes=[],
        ):
            job.refresh_from_db()
            raise Conflict(f"Job {job.pk} is {job.state}, not HELD; there is nothing to release.")
        _after_commit_request_pass("release", reforecast=True)
    job.refresh_from_db()
    return job


def _after_commit_request_pass(why: str, *, coalesce: bool = False, reforecast: bool = False) -> None:
    signals.announce(why, coalesce=coalesce, reforecast=reforecast)


# --- read-outs: who sees which jobs, and their logs -------------------------------------------------

LOG_PAGE_BYTES = 1024 * 1024  # the most log text one read returns
MAX_TAIL_LINES = 10_000


def team_ids_of(user) -> list[int]:
    if not user.is_authenticated:
        return []
    return list(Membership.objects.filter(user=user).values_list("team_id", flat=True))


def visible_jobs(user, queryset=None):
    """The jobs a user may see with their command, env and logs: every job for an admin, the jobs of
    their teams' shares for anyone else (other teams' jobs show only as anonymous queue entries)."""
    qs = Job.objects.all() if queryset is None else queryset
    if not user.is_authenticated:
        return qs.none()
    if user.is_superuser:
        return qs
    return qs.filter(share__team__memberships__user=user)


def can_see_job(user, job: Job) -> bool:
    return bool(user.is_authenticated and (user.is_superuser or role_in_team(user, job.share.team_id)))


def job_logs(
    *,
    job: Job,
    attempt: int | None = None,
    node: str | None = None,
    rank: int | None = None,
    after: int | None = None,
    tail: int | None = None,
) -> dict[str, Any]:
    """Log text of one attempt (default: the latest) on one node (`node`, or the node of `rank`;
    default: its first, rank 0) as the host shipped it; `nodes` lists every rank's node, in rank order,
    so each rank's log can be read. `after` is a cursor from an earlier read: only chunks after it are
    returned. `tail` keeps the last N lines. Returns {attempt, node, rank, nodes, text, cursor, more,
    finished}."""
    from jobs.choices import AttemptState
    from jobs.models import Attempt, LogChunk

    errors = {}
    if tail is not None and not 0 < tail <= MAX_TAIL_LINES:
        errors["tail"] = f"tail is a number of lines from 1 to {MAX_TAIL_LINES}."
    if after is not None and after < -1:
        errors["after"] = "after is a cursor from an earlier read (-1 or more)."
    if rank is not None and node is not None:
        errors["rank"] = "Give a node or a rank, not both."
    elif rank is not None and rank < 0:
        errors["rank"] = "rank is a node's rank in the attempt, from 0."
    if errors:
        raise ValidationError(errors)
    attempts = list(Attempt.objects.filter(job=job).values_list("number", "placement", "state"))
    numbers = [a[0] for a in attempts]
    empty = {
        "attempt": None,
        "attempts": numbers,
        "node": None,
        "rank": None,
        "nodes": [],
        "text": "",
        "cursor": -1,
        "more": False,
        "finished": job.state in JOB_TERMINAL_STATES,
        "removed": output_removed(job),
    }
    if attempt is None:
        if not attempts:
            return empty
        attempt = max(numbers)
    match = [a for a in attempts if a[0] == attempt]
    if not match:
        have = f"it has attempts {min(numbers)} to {max(numbers)}" if numbers else "it has not started yet"
        raise ValidationError({"attempt": f"Job {job.pk} has no attempt {attempt}; {have}."})
    number, placement, state = match[0]
    nodes = [p["node"] for p in placement]
    if rank is not None:
        if rank >= len(nodes):
            raise ValidationError(
                {"rank": f"Attempt {number} ran on {len(nodes)} node(s): ranks 0 to {len(nodes) - 1}."}
            )
        node = nodes[rank]
    if node is None:
        node = nodes[0] if nodes else None
    elif node not in nodes:
        raise ValidationError(
            {"node": f"Attempt {number} ran on {', '.join(nodes) or 'no node'}, not on {node}."}
        )
    result = dict(
        empty,
        attempt=number,
        node=node,
        rank=nodes.index(node) if node in nodes else None,
        nodes=nodes,
        finished=state == AttemptState.ENDED,
    )
    chunks = LogChunk.objects.filter(attempt__job=job, attempt__number=number, node=node)
    if after is not None:
        chunks = chunks.filter(offset__gt=after)
    if tail is not None:
        # Newest first until enough lines are in hand: a long log is not read whole for its tail.
        picked, lines, size = [], 0, 0
        for offset, text in chunks.order_by("-offset").values_list("offset", "text").iterator():
            picked.append((offset, text))
            lines += text.count("\n")
            size += len(text)
            if lines > tail or size >= LOG_PAGE_BYTES:
                break
        picked.reverse()
        text = "".join(t for _, t in picked)
        kept = text.splitlines(keepends=True)[-tail:]
        result.update(text="".join(kept)[-LOG_PAGE_BYTES:], cursor=picked[-1][0] if picked else (after or -1))
        return result
    picked, size, more = [], 0, False
    for offset, text in chunks.order_by("offset").values_list("offset", "text").iterator():
        if picked and size + len(text) > LOG_PAGE_BYTES:
            more = True
            break
        picked.append((offset, text))
        size += len(text)
    result.update(
        text="".join(t for _, t in picked),
        cursor=picked[-1][0] if picked else (-1 if after is None else after),
        more=more,
    )
    return result


def prune_job_output(*, now=None, batch: int = 2000) -> int:
    """Remove the output (log chunks) of jobs that ended more than JOB_OUTPUT_KEEP_DAYS days ago, in
    batches (each its own short transaction). Returns how many chunks went. 0 days: kept for ever."""
    from datetime import timedelta

    from jobs.models import LogChunk

    days = settings.JOB_OUTPUT_KEEP_DAYS
    if days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    old = LogChunk.objects.filter(
        attempt__job__state__in=[s.value for s in JOB_TERMINAL_STATES], attempt__job__finished_at__lt=cutoff
    )
    removed = 0
    while ids := list(old.values_list("pk", flat=True)[:batch]):
        removed += LogChunk.objects.filter(pk__in=ids).delete()[0]
    recount_team_output()
    return removed


# Where the control side stopped storing an attempt's output on a node (a LogChunk with cut=True).
OUTPUT_CUT_NOTE = (
    "\n[gpuquota: output cut here: the team's jobs hold {used} bytes of stored output, its budget is "
    "{budget} (TEAM_OUTPUT_MAX_BYTES); output is removed {days} days after its job ended]\n"
)


def log_append(*, attempt_id: int, node: str, offset: int, text: str, team_id: int) -> str:
    """Store one chunk of an attempt's output (a host ships them), within its team's budget of stored
    output (TEAM_OUTPUT_MAX_BYTES): past it the chunk is not stored, and the first one refused of an
    attempt on a node leaves a note in its place, which also tells the end report's gap check that
    nothing more is wanted (gpunodes.tasks._log_gaps). A chunk already stored changes nothing. Returns
    "stored", "repeat" (stored before) or "cut" (over the budget). Two to three queries."""
    from django.db.models import F

    from jobs.models import LogChunk, TeamOutput

    size = len(text.encode("utf-8", "replace"))
    budget = settings.TEAM_OUTPUT_MAX_BYTES
    used = TeamOutput.objects.filter(team_id=team_id).values_list("bytes", flat=True).first() or 0
    if budget > 0 and used + size > budget:
        mine = LogChunk.objects.filter(attempt_id=attempt_id, node=node)
        if not mine.filter(cut=True).exists():
            note = OUTPUT_CUT_NOTE.format(used=used, budget=budget, days=settings.JOB_OUTPUT_KEEP_DAYS)
            LogChunk.objects.get_or_create(
                attempt_id=attempt_id, node=node, offset=offset, defaults={"text": note, "cut": True}
            )
        return "cut"
    _, created = LogChunk.objects.get_or_create(
        attempt_id=attempt_id, node=node, offset=offset, defaults={"text": text}
    )
    if created and not TeamOutput.objects.filter(team_id=team_id).update(bytes=F("bytes") + size):
        TeamOutput.objects.get_or_create(team_id=team_id)
        TeamOutput.objects.filter(team_id=team_id).update(bytes=F("bytes") + size)
    return "stored" if created else "repeat"


def team_output(team) -> dict:
    """A team's stored output against its budget, for its page (one query)."""
    from jobs.models import TeamOutput

    used = TeamOutput.objects.filter(team=team).values_list("bytes", flat=True).first() or 0
    return {
        "used": used,
        "budget": settings.TEAM_OUTPUT_MAX_BYTES,
        "keep_days": settings.JOB_OUTPUT_KEEP_DAYS,
    }


def recount_team_output() -> dict[int, int]:
    """Count each team's stored output again from its chunks (after a prune; a job deleted with its
    output, or chunks stored by other means, leave the running count off until then). One query to
    count, one to write."""
    from django.db.models import Sum

    from jobs.models import LogChunk, OctetLength, TeamOutput
    from quotas.models import Team

    totals = dict(
        LogChunk.objects.values_list("attempt__job__share__team_id")
        .annotate(total=Sum(OctetLength("text")))
        .values_list("attempt__job__share__team_id", "total")
    )
    rows = [
        TeamOutput(team_id=pk, bytes=totals.get(pk) or 0) for pk in Team.objects.values_list("pk", flat=True)
    ]
    TeamOutput.objects.bulk_create(
        rows, update_conflicts=True, unique_fields=["team"], update_fields=["bytes"]
    )
    return totals


def output_removed(job: Job, now=None) -> bool:
    """Whether the job's output is gone by JOB_OUTPUT_KEEP_DAYS (it ended longer ago than that)."""
    from datetime import timedelta

    days = settings.JOB_OUTPUT_KEEP_DAYS
    return bool(
        days > 0
        and job.state in JOB_TERMINAL_STATES
        and job.finished_at
        and job.finished_at < (now or timezone.now()) - timedelta(days=days)
    )


def manage_checker(user):
    """A predicate job -> whether `user` may cancel it or change its priority (the rule of
    can_manage_job), for lists: one query up front instead of one per job."""
    if not user.is_authenticated:
        return lambda job: False
    if user.is_superuser:
        return lambda job: True
    managed = set(Membership.objects.filter(user=user, role=Role.MANAGER).values_list("team_id", flat=True))
    return lambda job: job.submitted_by_id == user.pk or job.share.team_id in managed
