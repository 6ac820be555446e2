"""Dashboard pages of the jobs app: the job page (state, attempts timeline, events, live log tail) and
the job verbs from the team page (submit, cancel, priority). Thin views over jobs.services; the
permission checks are the services' own (PermissionDenied → 403)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from jobs import services
from jobs.choices import JOB_TERMINAL_STATES, AttemptState
from jobs.forms import PriorityForm
from jobs.models import Job, JobArray, JobEvent
from quotas import services as quota_services
from quotas.forms import add_service_errors
from quotas.models import Share, Team
from quotas.views import hx_redirect, page_or_part, submit_form_for, team_queue_context

LOG_TAIL_LINES = 200
EVENTS_SHOWN = 200
STOP_POLLING = 286  # htmx stops an every-Ns poll on this status

JOB_PARTS = {"state": "jobs/partials/_job_state.html", "log": "jobs/partials/_log_tail.html"}


def _visible_job(user, pk: int) -> Job:
    job = get_object_or_404(Job.objects.select_related("share__team", "submitted_by", "forecast"), pk=pk)
    if not services.can_see_job(user, job):
        raise Http404("No such job among your teams'.")  # other teams' jobs do not exist for you
    return job


def _timeline(attempts, now) -> dict:
    """Plotly-ready bars: one per attempt, from admission to its end (or now)."""
    bars = []
    for a in attempts:
        end = a.ended_at or now
        bars.append(
            {
                "label": f"attempt {a.number}",
                "start": a.admitted_at.isoformat(),
                "end": end.isoformat(),
                "ms": max(1, int((end - a.admitted_at).total_seconds() * 1000)),
                "outcome": a.outcome or a.state,
                "borrowed": a.borrowed if getattr(a, "borrowed_now", None) is None else a.borrowed_now,
                "nodes": ", ".join(p["node"] for p in a.placement),
            }
        )
    return {"bars": bars}


def _label_borrowed_now(attempts) -> None:
    """A live attempt is labelled as the policy counts it now (policy.borrowed_attempts, the same
    classification as the team page, the nodes grid and reclaim); an ended one keeps how it was
    admitted (borrowed_now None)."""
    from jobs.choices import ATTEMPT_ACTIVE_STATES
    from quotas.engine import policy
    from quotas.scheduler import load_snapshot

    live = [a for a in attempts if a.state in ATTEMPT_ACTIVE_STATES]
    borrowed = policy.borrowed_attempts(load_snapshot(timezone.now(), queued=False).snapshot) if live else ()
    for a in attempts:
        a.borrowed_now = (a.pk in borrowed) if a in live else None


def _job_context(request, job: Job) -> dict:
    attempts = list(job.attempts.order_by("number"))
    _label_borrowed_now(attempts)
    stopping = next((a for a in attempts if a.state == AttemptState.STOPPING), None)
    events = list(JobEvent.objects.filter(job=job).order_by("-at", "-id")[:EVENTS_SHOWN])
    forecast = quota_services.forecast_fields(job)  # the stored forecast: no replay in a request
    return {
        "job": job,
        "attempts": attempts,
        "events": events,
        "timeline": _timeline(attempts, timezone.now()),
        "can_manage": services.can_manage_job(request.user, job),
        # A cancelled job still stopping: when its SIGKILL is due (its GPUs are held until then at most).
        "stopping": stopping,
        "position": forecast["position"],
        "e": forecast,  # eta, kind, basis, computed_at (templates/jobs/partials/_eta.html)
        "waiting": forecast["waiting"],
        "finished": job.state in JOB_TERMINAL_STATES,
        # The job's latest checkpoint its hosts saw (any attempt): where a restart resumes from.
        "last_checkpoint": max(
            (a.last_checkpoint_at for a in attempts if a.last_checkpoint_at), default=None
        ),
        "priority_form": PriorityForm(initial={"priority": job.priority}),
        "poll": True,
        "now": timezone.now(),
    }


@require_GET
@login_required
def job_page(request, pk):
    job = _visible_job(request.user, pk)
    part = request.GET.get("part") if request.htmx else None
    context: dict = {"job": job, "finished": job.state in JOB_TERMINAL_STATES, "poll": True}
    if part in (None, "state"):
        context.update(_job_context(request, job))
    if part in (None, "log"):
        context["log"] = services.job_logs(job=job, tail=LOG_TAIL_LINES)
        context["rank_logs"] = rank_logs(job, context["log"])
    response = page_or_part(request, "jobs/job.html", JOB_PARTS, context)
    if part == "log" and context["log"]["finished"] and context["finished"]:
        response.status_code = STOP_POLLING  # the last words are in; nothing more will come
    elif part == "state" and context["finished"]:
        response.status_code = STOP_POLLING
    return response


def rank_logs(job, first: dict) -> list[dict]:
    """Every rank's last lines of the attempt whose rank 0 `first` is (a gang's traceback is often in
    another rank's log than rank 0's), rank 0 first; just `first` for a one-node attempt."""
    nodes = first["nodes"]
    if len(nodes) <= 1:
        return [first]
    return [first] + [
        services.job_logs(job=job, attempt=first["attempt"], node=node, tail=LOG_TAIL_LINES)
        for node in nodes[1:]
    ]


def _int_or_none(value):
    return value if value not in ("", None) else None


@require_POST
@login_required
def job_submit(request, slug):
    team = get_object_or_404(Team, slug=slug)
    form = submit_form_for(team, request.POST)
    if form.is_valid():
        data = form.cleaned_data
        share = Share.objects.select_related("team").get(name=data["share"], team=team)
        fields = {
            "user": request.user,
            "share": share,
            "name": data["name"],
            "gpu_type": data["gpu_type"],
            "gpus": data["gpus"],
            "priority": data["priority"],
            "command": data["command"],
            "image": data["image"],
            "mounts": data["mounts"],
            "max_runtime_s": _int_or_none(data["max_runtime_s"]),
            "preemption_grace_s": _int_or_none(data["preemption_grace_s"]),
        }
        size = _int_or_none(data.get("array_size"))
        try:
            if size is None:
                job, array = services.job_submit(**fields), None
            else:
                job, array = None, services.job_array_submit(size=size, **fields)
        except ValidationError as e:
            add_service_errors(form, e, {"array": "array_size"})
        else:
            if request.htmx:
                # A fresh form, and the queue refreshed at once (it listens for this event).
                response = render(
                    request,
                    "jobs/partials/_submit_form.html",
                    {"form": submit_form_for(team), "team": team, "submitted": job, "submitted_array": array},
                )
                response["HX-Trigger"] = "queue-changed"
                return response
            return redirect("team", slug=team.slug)
    template = "jobs/partials/_submit_form.html" if request.htmx else "jobs/submit_error.html"
    return render(request, template, {"form": form, "team": team}, status=400)


def _after_action(request, job: Job, error: str = "", status: int = 200):
    """htmx from the team page: the refreshed queue (with the error, if any, above it); from the job
    page or without JS: a redirect, or the error as plain text."""
    if request.htmx and request.POST.get("from") == "team":
        team = job.share.team
        context = {"team": team, "action_error": error, **team_queue_context(request.user, team)}
        # 400 is swapped like a 200 (base.html's htmx-config): the message shows where the click was.
        return render(request, "quotas/partials/_team_queue.html", context, status=400 if error else 200)
    if error:
        return HttpResponse(error, status=status, content_type="text/plain")
    if request.POST.get("from") == "team":
        return redirect("team", slug=job.share.team.slug)
    return hx_redirect(request, job_url(job))


def job_url(job: Job) -> str:
    from django.urls import reverse

    return reverse("job", args=[job.pk])


def _visible_array(user, pk: int) -> JobArray:
    array = get_object_or_404(JobArray.objects.select_related("share__team", "submitted_by"), pk=pk)
    if not (user.is_superuser or services.role_in_team(user, array.share.team_id)):
        raise Http404("No such array among your teams'.")
    return array


def _after_array_action(request, array: JobArray, error: str = "", status: int = 200):
    team = array.share.team
    if request.htmx:
        context = {"team": team, "action_error": error, **team_queue_context(request.user, team)}
        return render(request, "quotas/partials/_team_queue.html", context, status=400 if error else 200)
    if error:
        return HttpResponse(error, status=status, content_type="text/plain")
    return redirect("team", slug=team.slug)


@require_POST
@login_required
def array_cancel(request, pk):
    array = _visible_array(request.user, pk)
    try:
        services.array_cancel(user=request.user, array=array)
    except services.Conflict as e:
        return _after_array_action(request, array, str(e), status=409)
    return _after_array_action(request, array)


@require_POST
@login_required
def array_priority(request, pk):
    array = _visible_array(request.user, pk)
    form = PriorityForm(request.POST)
    if not form.is_valid():
        return _after_array_action(request, array, "Priority: " + " ".join(form.errors["priority"]), 400)
    try:
        services.array_set_priority(user=request.user, array=array, priority=form.cleaned_data["priority"])
    except services.Conflict as e:
        return _after_array_action(request, array, str(e), status=409)
    return _after_array_action(request, array)


@require_POST
@login_required
def job_cancel(request, pk):
    job = _visible_job(request.user, pk)
    try:
        job = services.job_cancel(user=request.user, job=job)
    except services.Conflict as e:
        return _after_action(request, job, str(e), status=409)
    return _after_action(request, job)


@require_POST
@login_required
def job_release(request, pk):
    job = _visible_job(request.user, pk)
    try:
        job = services.job_release(user=request.user, job=job)
    except services.Conflict as e:
        return _after_action(request, job, str(e), status=409)
    return _after_action(request, job)


@require_POST
@login_required
def job_priority(request, pk):
    job = _visible_job(request.user, pk)
    form = PriorityForm(request.POST)
    if not form.is_valid():
        return _after_action(request, job, "Priority: " + " ".join(form.errors["priority"]), status=400)
    try:
        job = services.job_set_priority(user=request.user, job=job, priority=form.cleaned_data["priority"])
    except services.Conflict as e:
        return _after_action(request, job, str(e), status=409)
    return _after_action(request, job)
