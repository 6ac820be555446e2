"""Dashboard pages of the quotas app: the overview, team pages, share configuration (with the what-if
preview) and the audit log. Thin views: they parse, call a service or a read-out, and render; an htmx
request gets only the partial it swaps (templates/quotas/partials/_<target>.html)."""

from __future__ import annotations

import dataclasses
import functools
import heapq
import logging
from datetime import UTC as dt_utc
from datetime import datetime

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, RequestDataTooBig, ValidationError
from django.core.paginator import Paginator
from django.db import transaction
from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import Resolver404, resolve, reverse
from django.utils import timezone
from django.views import defaults
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from jobs import services as job_services
from jobs.choices import EventKind
from jobs.models import Job, JobEvent
from quotas import layout, layoutdoc, services, track_record, usage, whatif
from quotas.audit import field_changes as audit_field_changes
from quotas.choices import ShareState, Strategy
from quotas.forms import ShareForm, SweepForm, add_service_errors
from quotas.hearing import hearing
from quotas.models import AuditEntry, LayoutPlan, Membership, Share, Team

log = logging.getLogger(__name__)

FEED_SIZE = 15
QUEUE_SHOWN = 50
RUNNING_SHOWN = 50
AUDIT_PAGE = 50
FEED_KINDS = [EventKind.PREEMPTING, EventKind.NODE_LOST, EventKind.GPU_FAILED, EventKind.AGENT_STOPPED]


# --- helpers shared by the dashboard's views ---------------------------------------------------------


def admin_required(view):
    """Logged in as an admin (is_superuser, as the API and the services take it; Django's staff flag
    alone only opens the Django admin); anyone else logged in gets 403 (not a login loop)."""

    @functools.wraps(view)
    @login_required
    def wrapped(request, *args, **kwargs):
        if not request.user.is_superuser:
            raise PermissionDenied("Only admins can manage shares, nodes and the audit log.")
        return view(request, *args, **kwargs)

    return wrapped


def page_or_part(request, page: str, parts: dict[str, str], context: dict, status: int = 200):
    """The whole page, or for an htmx request naming ?part=, only that partial."""
    part = request.GET.get("part")
    if request.htmx and part in parts:
        return render(request, parts[part], context, status=status)
    return render(request, page, context, status=status)


def hx_redirect(request, url: str) -> HttpResponse:
    if request.htmx:
        response = HttpResponse(status=204)
        response["HX-Redirect"] = url
        return response
    return redirect(url)


def _feed(user):
    """Recent pre-emptions, reclaims, lost nodes and failed GPUs (one query); job names only where the
    user may see the job."""
    mine = None if user.is_superuser else set(job_services.team_ids_of(user))
    events = list(
        JobEvent.objects.filter(kind__in=FEED_KINDS)
        .select_related("job__share")
        .only(
            "at", "kind", "reason", "attempt_number", "job__name", "job__share__name", "job__share__team_id"
        )
        .order_by("-at", "-id")[:FEED_SIZE]
    )
    for e in events:
        e.visible = mine is None or e.job.share.team_id in mine
        e.label, e.badge = _feed_label(e.kind, e.reason)
    return events


# The reasons of an attempt its own agent ended by restarting (gpunodes.services.node_heartbeat for one
# that died first; an agent before AGENT_STOPPED said its shutdown so): re-queued, but no node was lost.
AGENT_RESTART_REASONS = ("stopped at the shutdown of the agent on ", "the agent on ")


def _feed_label(kind: str, reason: str) -> tuple[str, str]:
    """A feed entry's badge: its words and its class."""
    if "RECLAIM" in reason:
        return "reclaim", "borrowed"
    if kind == EventKind.GPU_FAILED:
        return "GPU failed", "off"
    if kind == EventKind.AGENT_STOPPED:  # an orderly shutdown of its agent (Ctrl-C): no node lost
        return "agent stopped", "state-queued"
    if kind == EventKind.NODE_LOST:
        if reason.startswith(AGENT_RESTART_REASONS):
            return "agent restarted", "state-queued"
        return "node lost", "off"
    return "priority", "prio"


# --- errors ----------------------------------------------------------------------------------------


def bytes_words(n: int) -> str:
    """A size as a person reads it: "256 KiB", "1.5 MiB", "300 bytes"."""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def bad_request(request, exception=None):
    """handler400. A body over MAX_REQUEST_BYTES is never read (that is the limit), so Django answered a
    bare "Bad Request (400)", even in place of the submit form: the form comes back instead, blank, with
    the limit in words, and the log has one line (settings.LOGGING quiets Django's own traceback)."""
    if not isinstance(exception, RequestDataTooBig):
        return defaults.bad_request(request, exception)
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    sent = int(request.META.get("CONTENT_LENGTH") or 0)
    log.warning("refused %s %s: %s over the limit of %s", request.method, request.path, sent, limit)
    message = (
        f"What was sent ({bytes_words(sent)}) is larger than {bytes_words(limit)}, the most one request may "
        "carry: shorten the command (a long input belongs in a file the job reads) and submit again."
    )
    try:
        match = resolve(request.path_info)
    except Resolver404:
        match = None
    if match is not None and match.url_name == "job_submit" and request.user.is_authenticated:
        try:
            team, _ = _team_for(request.user, match.kwargs["slug"])
        except Http404:
            pass
        else:
            context = {"form": submit_form_for(team), "team": team, "form_error": message}
            template = "jobs/partials/_submit_form.html" if request.htmx else "jobs/submit_error.html"
            return render(request, template, context, status=400)
    return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")


# --- overview ---------------------------------------------------------------------------------------

OVERVIEW_PARTS = {
    "cards": "quotas/partials/_cards.html",
    "sankey": "quotas/partials/_sankey.html",
    "totals": "quotas/partials/_totals.html",
    "feed": "quotas/partials/_feed.html",
    "history": "quotas/partials/_history.html",
}


@require_GET
@login_required
def overview(request):
    part = request.GET.get("part") if request.htmx else None
    if part == "live":
        # Everything that shows the current moment, from one picture, in one answer (see overview.html).
        context = {
            "picture": usage.cluster_picture(),
            "hearing": hearing(timezone.now()),
            "feed": _feed(request.user),
            "oob": True,
        }
        return render(request, "quotas/partials/_overview_live.html", context)
    # The page polls once for all its live parts (part=live); ?part=<name> still answers one part.
    context: dict = {"poll": part is not None, "poll_history": True}
    if part in (None, "cards", "sankey", "totals"):
        context["picture"] = usage.cluster_picture()
    if part in (None, "totals"):
        context["hearing"] = hearing(timezone.now())
    if part in (None, "feed"):
        context["feed"] = _feed(request.user)
    if part in (None, "history"):
        context["history"] = usage.history(hours=24)
        context["colours"] = usage.share_colours(Share.objects.values_list("name", flat=True))
    return page_or_part(request, "quotas/overview.html", OVERVIEW_PARTS, context)


# --- team page -------------------------------------------------------------------------------------

TEAM_PARTS = {
    "queue": "quotas/partials/_team_queue.html",
    "cards": "quotas/partials/_cards.html",
}


def _team_for(user, slug: str) -> tuple[Team, str | None]:
    team = get_object_or_404(Team, slug=slug)
    role = Membership.objects.filter(team=team, user=user).values_list("role", flat=True).first()
    if role is None and not user.is_superuser:
        raise Http404("No such team among yours.")
    return team, role


# The job columns the team queue shows (and manage_checker / fold_arrays read): nothing else is loaded.
QUEUE_JOB_FIELDS = (
    "id",
    "name",
    "gpu_type",
    "gpus",
    "priority",
    "state",
    "submitted_at",
    "array_id",
    "array_index",
    "submitted_by_id",
    "submitted_by__username",
    "share_id",
    "share__name",
    "share__team_id",
)


def _queue_row(e: dict, now) -> dict:
    """A queued job's row, ready to print: numbers as text and the wording computed once (a long table
    otherwise costs a template variable lookup, a number format or a timesince per cell)."""
    from quotas.templatetags.gpuquota import ago

    job, position = e["job"], e["position"]
    return {
        **e,
        "id": str(job.pk),
        "overall": str(position["overall"]) if position else "–",
        "in_share": f" ({position['in_share']} in share)" if position else "",
        "who": job.submitted_by.username,
        "submitted": ago(job.submitted_at, now),
        "share": job.share.name,
        "size": f"{job.gpus} × {job.gpu_type}",
        "priority": str(job.priority),
    }


def team_queue_context(user, team: Team, live: usage.LivePicture | None = None) -> dict:
    """The team's queue in admission order (position, ETA, why it waits: the stored forecast, see
    QueueForecast) and its running jobs. No replay and no queue in the snapshot: constant queries,
    whatever the length of the queue. Rows come ready to print (_queue_row): the template only places
    them."""
    from jobs.choices import JobState
    from quotas.models import QueueForecast
    from quotas.templatetags.gpuquota import ago

    now = timezone.now()
    # Shared by the pages while nothing changed: no snapshot load per view.
    live = live or usage.live_picture()
    names = {c.name for c in live.picture.cards if c.team_id == team.pk}  # every share has its card
    # Counts from the live picture's per-share totals; the first rows in the stored forecast's order
    # walk its position index, then jobs not forecast yet in queue order.
    queued_total = sum(jobs for (share, _), (jobs, _) in live.queued_totals.items() if share in names)
    queued_qs = Job.objects.filter(state=JobState.QUEUED, share__team=team)
    shown_q = []
    for f in (
        # A join, not `job__in=queued_qs`: the same rows, planned in a fraction of the time.
        QueueForecast.objects.filter(job__state=JobState.QUEUED, job__share__team=team)
        .select_related("job__share", "job__submitted_by")
        .only(
            *(f.name for f in QueueForecast._meta.concrete_fields), *(f"job__{n}" for n in QUEUE_JOB_FIELDS)
        )
        .order_by("position_overall")[:QUEUE_SHOWN]
    ):
        f.job.forecast = f  # the row read is the job's forecast (no second join for it)
        shown_q.append(f.job)
    if len(shown_q) < QUEUE_SHOWN:
        shown_q += list(
            queued_qs.filter(forecast__isnull=True)
            .select_related("share", "submitted_by", "forecast")
            .only(*QUEUE_JOB_FIELDS, "forecast")
            .order_by("-priority", "submitted_at", "id")[: QUEUE_SHOWN - len(shown_q)]
        )
    running = [r for name in names for r in live.running.get(name, ())]
    shown_r = heapq.nsmallest(RUNNING_SHOWN, running, key=lambda r: (-r.started_at, r.attempt_id))
    jobs = (
        Job.objects.select_related("share", "submitted_by")
        .only(*QUEUE_JOB_FIELDS)
        .in_bulk([r.job_id for r in shown_r])
    )
    can_manage = job_services.manage_checker(user)
    entries = [
        _queue_row({"job": job, **services.forecast_fields(job), "can_manage": can_manage(job)}, now)
        for job in shown_q
    ]
    computed = [e["computed_at"] for e in entries if e["computed_at"]]
    entries = job_services.fold_arrays(entries, can_manage)  # an array: one expandable row
    borrowed_now = live.borrowed
    running_rows = []
    for r in shown_r:
        job = jobs.get(r.job_id)
        if job is None:
            continue
        running_rows.append(
            {
                "job": job,
                "id": str(job.pk),
                "share": job.share.name,
                "who": job.submitted_by.username,
                "state": job.state,
                "state_class": job.state.lower(),
                "where": "; ".join(f"{node} [{','.join(map(str, idx))}]" for node, idx in r.placement),
                "size": f"{job.gpus} × {job.gpu_type}",
                "borrowed": r.attempt_id in borrowed_now,
                "started": ago(datetime.fromtimestamp(r.started_at, tz=dt_utc), now),
                # A job already CANCELLING is stopping: nothing left to cancel or re-prioritise.
                "can_manage": can_manage(job) and job.state != JobState.CANCELLING,
            }
        )
    # The jobs the rows stand for: an array's row stands for all its queued tasks.
    queued_shown = sum(e["counts"].get(JobState.QUEUED.value, 0) if e.get("array") else 1 for e in entries)
    return {
        "team": team,
        "queue": entries,
        "queued_total": queued_total,
        "queued_shown": queued_shown,
        "forecast_age": services.age_words(max(computed)) if computed else None,
        "planned": True,
        "running": running_rows,
        "running_total": len(running),
        "now": now,
    }


def track_record_context(summary: dict) -> dict:
    """A share's track record (a quotas.track_record summary) ready to print, with its picture: each
    start as forecast wait against actual wait in minutes, its range as a bar across (it crosses the
    diagonal when the start fell inside it)."""
    points = []
    for p in summary["points"]:
        ranged = p["low_s"] is not None
        told = services.duration_words(p["forecast_s"])
        if ranged:
            told += f" ({services.duration_words(p['low_s'])} to {services.duration_words(p['high_s'])})"
        points.append(
            {
                "x": round(p["forecast_s"] / 60, 2),
                "y": round(p["actual_s"] / 60, 2),
                "plus": round((p["high_s"] - p["forecast_s"]) / 60, 2) if ranged else 0,
                "minus": round((p["forecast_s"] - p["low_s"]) / 60, 2) if ranged else 0,
                "group": "none" if not ranged else "within" if p["within"] else "outside",
                "text": f"job {p['job']}: told {told}, started after {services.duration_words(p['actual_s'])}",
            }
        )
    fraction = summary["within_fraction"]
    return {
        **summary,
        "percent": None if fraction is None else round(100 * fraction),
        "chart": {"points": points},
    }


def submit_form_for(team: Team, data=None):
    from jobs.forms import SubmitForm
    from jobs.services import node_shapes

    shares = list(Share.objects.filter(team=team, state=ShareState.ENABLED).order_by("name"))
    return SubmitForm(data, shares=shares, gpu_types=node_shapes().keys())


@require_GET
@login_required
def team_page(request, slug):
    team, role = _team_for(request.user, slug)
    part = request.GET.get("part") if request.htmx else None
    context: dict = {"team": team, "role": role, "poll": True}
    live = usage.live_picture()  # once per view: the queue's running rows and the cards share it
    if part in (None, "queue"):
        context.update(team_queue_context(request.user, team, live=live))
    if part in (None, "cards"):
        # This team's cards (as cluster_picture(team_id=...) gives them), from the same picture.
        cards = [c for c in live.picture.cards if c.team_id == team.pk]
        context["picture"] = dataclasses.replace(live.picture, cards=cards)
    if part is None:
        context["form"] = submit_form_for(team)
        context["members"] = list(team.memberships.select_related("user").order_by("user__username"))
        context["output"] = job_services.team_output(team)
        shares = list(team.shares.order_by("name"))
        records = track_record.summaries(shares)  # two queries for all of them
        visible = track_record.sees_jobs(request.user, team.pk)  # points name the team's jobs
        context["track_records"] = [
            track_record_context(track_record.shown(records[s.pk], jobs_visible=visible)) for s in shares
        ]
        # Each share's fair part of idle capacity and why it waits (issue 37; the organisation page)
        from quotas import organisation

        context["fair_lines"] = organisation.share_lines(organisation.load(), [s.name for s in shares])
        # plotly.js only where there is a picture to draw
        context["track_chart"] = any(t["chart"]["points"] for t in context["track_records"])
    return page_or_part(request, "quotas/team.html", TEAM_PARTS, context)


@require_GET
@login_required
def team_list(request):
    teams = Team.objects.order_by("name")
    if not request.user.is_superuser:
        teams = teams.filter(memberships__user=request.user)
    teams = list(teams)
    if len(teams) == 1:
        return redirect("team", slug=teams[0].slug)
    return render(request, "quotas/teams.html", {"teams": team_rows(teams)})


def team_rows(teams: list[Team]) -> list[dict]:
    """Each team with its members and its shares' usage now (GPUs used of capacity, borrowed, jobs
    running and queued), from one picture: a constant number of queries."""
    cards = {c.name: c for c in usage.cluster_picture().cards}
    members: dict[int, list] = {t.pk: [] for t in teams}
    for m in Membership.objects.filter(team__in=teams).select_related("user").order_by("user__username"):
        members[m.team_id].append(m)
    shares: dict[int, list] = {t.pk: [] for t in teams}
    for share in Share.objects.filter(team__in=teams).order_by("name"):
        card = cards.get(share.name)
        bars = card.bars if card else []
        shares[share.team_id].append(
            {
                "share": share,
                "colour": card.colour if card else None,
                "used": sum(b.own + b.borrowed for b in bars),
                "capacity": sum(b.capacity for b in bars),
                "borrowed": sum(b.borrowed for b in bars),
                "running": sum(b.running_jobs for b in bars),
                "queued": sum(b.queued_jobs for b in bars),
            }
        )
    return [{"team": t, "members": members[t.pk], "shares": shares[t.pk]} for t in teams]


# --- share configuration (admins) ------------------------------------------------------------------


def _gpu_types(share: Share | None = None) -> list[str]:
    from jobs.services import node_shapes

    types = set(node_shapes())
    if share is not None:
        types |= set(share.capacity_map())
    return sorted(types)


def _overcommit() -> list[str]:
    return usage.cluster_picture().overcommitted


@require_GET
@admin_required
def share_list(request):
    shares = list(Share.objects.select_related("team").prefetch_related("capacities").order_by("name"))
    picture = usage.cluster_picture()
    colours = usage.share_colours(s.name for s in shares)
    for s in shares:
        s.colour = colours[s.name]
    return render(
        request,
        "quotas/shares.html",
        {
            "shares": shares,
            "overcommitted": picture.overcommitted,
            "totals": picture.totals,
            "temporary": _temporary_rows(),
        },
    )


def _temporary_rows() -> list[dict]:
    """The temporary changes still to end, each with what goes back and when (soonest first)."""
    return [
        {"change": c, "share": c.share.name, "until": c.until, "words": layout.temporary_words(c)}
        for c in layout.pending_changes()
    ]


def _share_form_response(request, form, share, status=200, warnings=()):
    template = "quotas/partials/_share_form.html" if request.htmx else "quotas/share_edit.html"
    recent = layout.share_history(share.name) if share is not None else []
    context = {
        "form": form,
        "share": share,
        "recent": recent,
        "overcommitted": _overcommit(),
        "warnings": warnings,
        "sweep_form": SweepForm(gpu_types=_gpu_types(share)) if share is not None else None,
        # The whole page only: an htmx answer is the form alone.
        "track": track_record_context(
            track_record.shown(
                track_record.summary(share), jobs_visible=track_record.sees_jobs(request.user, share.team_id)
            )
        )
        if share is not None and not request.htmx
        else None,
    }
    return render(request, template, context, status=status)


@require_http_methods(["GET", "POST"])
@admin_required
def share_create(request):
    form = ShareForm(request.POST or None, gpu_types=_gpu_types())
    if request.method == "POST":
        if form.is_valid() and (warned := _warn_first(request, form, None)):
            return warned
        if form.is_valid():
            try:
                services.share_create(capacity=form.capacity(), actor=request.user, **form.share_fields())
            except ValidationError as e:
                add_service_errors(form, e, {"capacity": "new_gpu_type"})
            else:
                return hx_redirect(request, reverse("share_list"))
        return _share_form_response(request, form, None, status=400)
    return _share_form_response(request, form, None)


@require_http_methods(["GET", "POST"])
@admin_required
def share_edit(request, name):
    share = get_object_or_404(Share.objects.select_related("team").prefetch_related("capacities"), name=name)
    types = _gpu_types(share)
    if request.method == "POST":
        form = ShareForm(request.POST, gpu_types=types)
        if form.is_valid() and (warned := _warn_first(request, form, share)):
            return warned
        if form.is_valid():
            try:
                services.share_update(
                    share=share, capacity=form.capacity(), actor=request.user, **form.share_fields()
                )
            except ValidationError as e:
                add_service_errors(form, e, {"capacity": "new_gpu_type"})
            else:
                return hx_redirect(request, reverse("share_list"))
        share.refresh_from_db()
        return _share_form_response(request, form, share, status=400)
    form = ShareForm(initial=ShareForm.initial_for(share), gpu_types=types)
    return _share_form_response(request, form, share)


def _warn_first(request, form, share):
    """A capacity that over-commits or names a GPU type no node has is saved only once the admin has
    seen why and pressed "Save anyway" (confirm=1): the form comes back with the warnings. Field errors
    come first: a save that would fail (a taken name) is not warned about."""
    if request.POST.get("confirm") or not _saves_cleanly(form, share, request.user):
        return None
    warnings = usage.capacity_warnings(
        capacity=form.capacity(),
        share_id=share.pk if share else None,
        enabled=form.cleaned_data.get("state", ShareState.ENABLED) != ShareState.DISABLED,
    )
    if not warnings:
        return None
    return _share_form_response(request, form, share, warnings=warnings)


class _Rollback(Exception):
    pass


def _saves_cleanly(form, share, actor) -> bool:
    """Whether the service would save the form (a new share when `share` is None): it runs, then is
    rolled back, so its own checks (a taken name, a share its jobs no longer fit) land on the form's
    fields before anything else is said about it."""
    try:
        with transaction.atomic():
            if share is None:
                services.share_create(capacity=form.capacity(), actor=actor, **form.share_fields())
            else:
                fresh = Share.objects.get(pk=share.pk)
                services.share_update(
                    share=fresh, capacity=form.capacity(), actor=actor, **form.share_fields()
                )
            raise _Rollback
    except _Rollback:
        return True
    except ValidationError as e:
        add_service_errors(form, e, {"capacity": "new_gpu_type"})
        return False


WHATIF_PARTS = {
    "preview": "quotas/partials/_whatif.html",
    "layout": "quotas/partials/_whatif.html",
    "sweep": "quotas/partials/_sweep.html",
}


def _run_context(run: whatif.RunStatus) -> dict:
    return {"run": run, "max_jobs": whatif.MAX_JOBS, "reuse_min": whatif.WINDOW_REUSE_S // 60}


@require_POST
@admin_required
def share_whatif(request, name=None):
    """Replay the last 7 days with the share as it is and as the form proposes (nothing is saved): two
    Celery tasks side by side; the answer is the run's progress (polling) or, when done, its result."""
    share = None
    if name is not None:
        share = get_object_or_404(Share.objects.select_related("team"), name=name)
    form = ShareForm(request.POST, gpu_types=_gpu_types(share))
    if not (form.is_valid() and _saves_cleanly(form, share, request.user)):
        return render(request, WHATIF_PARTS["preview"], {"form": form, "errors": True}, status=400)
    fields = form.share_fields()
    entry = {
        "name": fields["name"],
        "team": fields["team"].slug,
        "capacity": form.capacity(),
        **{f: fields[f] for f in layoutdoc.VALUE_FIELDS if f in fields},
    }
    # The same plan a save makes (quotas.layout), not saved: its what-if replays the layout it gives.
    planned = layout.change_share(
        name=share.name if share else None, share=entry, actor=request.user, dry_run=True, run_whatif=True
    )
    run_id = planned.whatif_run
    if not run_id:  # the settings as they are: last week as it went, replayed (the same twice)
        run_id = whatif.start_preview(share=share.name if share else fields["name"], changes={})
    return render(request, WHATIF_PARTS["preview"], _run_context(whatif.status(run_id)))


@require_POST
@admin_required
def share_sweep(request, name):
    """Replay the last 7 days once per value of one setting of the share (each its own Celery task)."""
    share = get_object_or_404(Share.objects.select_related("team"), name=name)
    form = SweepForm(request.POST, gpu_types=_gpu_types(share))
    borrows = share.strategy == Strategy.LEND_AND_BORROW
    if form.is_valid() and form.cleaned_data["setting"] == "borrow_limit" and not borrows:
        form.add_error("setting", "Only a LEND_AND_BORROW share borrows: sweep its strategy instead.")
    if not form.is_valid():
        # Back to the form, with the errors beside its fields (not into the result area).
        response = render(
            request, "quotas/partials/_sweep_form.html", {"form": form, "share": share}, status=400
        )
        response["HX-Retarget"] = "#sweep-form"
        response["HX-Reswap"] = "outerHTML"
        return response
    run_id = whatif.start_sweep(
        share=share.name,
        setting=form.cleaned_data["setting"],
        values=form.cleaned_data["parsed"],
        labels=form.labels(),
        setting_label=dict(form.fields["setting"].choices)[form.cleaned_data["setting"]],
    )
    # The form again, out of band: the errors of an earlier try go from beside its fields.
    context = {"share": share, "sweep_form": form, **_run_context(whatif.status(run_id))}
    return render(request, WHATIF_PARTS["sweep"], context)


@require_GET
@admin_required
def whatif_run(request, run_id):
    """A run's progress, then its result. htmx polls the partial; the answer that shows the result
    (or the failure) is 286, which stops the polling. Without htmx: a page of its own."""
    run = whatif.status(run_id)
    if run is None:
        raise Http404("No such what-if run (it may have expired).")
    context = _run_context(run)
    if request.htmx:
        return render(request, WHATIF_PARTS[run.kind], context, status=286 if run.finished else 200)
    return render(request, "quotas/whatif_run.html", {**context, "part": WHATIF_PARTS[run.kind]})


@require_POST
@admin_required
def share_set_state(request, name):
    share = get_object_or_404(Share, name=name)
    state = request.POST.get("state")
    if state not in ShareState.values:
        return HttpResponse(
            f"state must be one of {', '.join(ShareState.values)}",
            status=400,
            content_type="text/plain; charset=utf-8",
        )
    services.share_update(share=share, state=state, actor=request.user)
    return hx_redirect(request, reverse("share_list"))


@require_POST
@admin_required
def share_delete(request, name):
    share = get_object_or_404(Share, name=name)
    try:
        services.share_delete(share=share, actor=request.user)
    except job_services.Conflict as e:
        return HttpResponse(str(e), status=409, content_type="text/plain; charset=utf-8")
    return hx_redirect(request, reverse("share_list"))


# --- the layout: plan, then apply (admins) ---------------------------------------------------------

LAYOUT_PARTS = {"plan": "quotas/partials/_layout_plan.html"}


@require_GET
@admin_required
def share_layout_versions(request):
    """/layout/versions/, as the README and `gpuquota shares history` name it: the versions table of
    /layout/ (it was a 404)."""
    return redirect(f"{reverse('share_layout')}#versions-h")


@require_GET
@admin_required
def share_layout(request):
    """The whole layout to edit (or a file to upload), the versions to roll back to, the temporary
    changes still to end."""
    context = {
        "document": layout.export_yaml(user=request.user),
        "versions": layout.versions(),
        "temporary": _temporary_rows(),
        "max_bytes": layoutdoc.MAX_BYTES,
    }
    return render(request, "quotas/layout.html", context)


def _plan_context(planned: LayoutPlan) -> dict:
    run = whatif.status(planned.whatif_run) if planned.whatif_run else None
    return {
        "plan": planned,
        "changes": [{**c, "words": layoutdoc.describe(c)} for c in planned.diff],
        "summary": layoutdoc.summary(planned.diff),
        "effects": planned.effects,
        "run": run,
        "max_jobs": whatif.MAX_JOBS,
        "age": layout.plan_age_words(planned),
    }


@require_POST
@admin_required
def share_layout_plan(request):
    """Plan the layout pasted, uploaded (`file`) or of an earlier version (`rollback`): its diff, every
    problem with its path (400), what it does now, and the what-if (which polls)."""
    run_whatif = request.POST.get("whatif", "1") != "0"
    try:
        if request.POST.get("rollback"):
            number = request.POST["rollback"]
            if not number.isdigit():
                raise ValidationError({"rollback": ["give a version number"]})
            planned = layout.plan_rollback(number=int(number), actor=request.user, run_whatif=run_whatif)
        else:
            upload = request.FILES.get("file")
            if upload is not None:
                if upload.size > layoutdoc.MAX_BYTES:
                    raise ValidationError(
                        {"document": [f"the file is larger than {layoutdoc.MAX_BYTES // 1024} KiB"]}
                    )
                source = upload.read()
            else:
                source = request.POST.get("document", "")
            planned = layout.plan(source=source, actor=request.user, run_whatif=run_whatif)
    except ValidationError as e:
        errors = [(path, messages) for path, messages in e.message_dict.items()]
        return render(request, LAYOUT_PARTS["plan"], {"errors": errors}, status=400)
    return render(request, LAYOUT_PARTS["plan"], _plan_context(planned))


@require_GET
@admin_required
def share_layout_plan_show(request, plan_id):
    planned = get_object_or_404(LayoutPlan, pk=plan_id)
    context = _plan_context(planned)
    if request.htmx:
        return render(request, LAYOUT_PARTS["plan"], context)
    return render(request, "quotas/layout_plan.html", context)


@require_POST
@admin_required
def share_layout_apply(request, plan_id):
    """Apply a plan as planned, or refuse (409, in words) when the layout changed since. A plan that adds
    to an over-commit comes back with why and an "Apply anyway" button (confirm=1)."""
    try:
        applied = layout.apply(
            plan_id=plan_id, actor=request.user, overcommit_ok=request.POST.get("confirm") == "1"
        )
    except job_services.Conflict as e:
        return HttpResponse(str(e), status=409, content_type="text/plain; charset=utf-8")
    except ValidationError as e:
        planned = get_object_or_404(LayoutPlan, pk=plan_id)
        context = {**_plan_context(planned), "confirm": e.message_dict.get("confirm", [])}
        return render(request, LAYOUT_PARTS["plan"], context, status=400)
    context = {"applied": applied, **_plan_context(applied.plan)}
    return render(request, LAYOUT_PARTS["plan"], context)


# --- audit log (admins) ---------------------------------------------------------------------------


@require_GET
@admin_required
def audit_log(request):
    entries = AuditEntry.objects.order_by("-at", "-id")
    kind = request.GET.get("type", "")
    if kind:
        entries = entries.filter(object_type=kind)
    page = Paginator(entries, AUDIT_PAGE).get_page(request.GET.get("page"))
    for entry in page:
        entry.rows = [
            {
                **c,
                "before_words": layoutdoc.value_words(c["before"]),
                "after_words": layoutdoc.value_words(c["after"]),
            }
            for c in entry.changes
            or audit_field_changes(f"{entry.object_type} {entry.object_repr}", entry.before, entry.after)
        ]
    return render(request, "quotas/audit.html", {"page": page, "type": kind})
