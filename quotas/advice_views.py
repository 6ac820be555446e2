"""/advice/: the advisor's page (admins; issue 38). Start a run over the last 1-4 weeks, watch its replays
come in (htmx polls the partial; 286 stops it), read the trade-off, and make a layout plan of a point."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from quotas import advice, advise
from quotas.views import admin_required, hx_redirect

PART = "quotas/partials/_advice.html"


class AdviceForm(forms.Form):
    weeks = forms.IntegerField(
        min_value=1, max_value=advice.MAX_WEEKS, initial=2, label="Weeks of history to replay"
    )


def _chart(advice_data: dict) -> dict:
    """What static/js/advice.js draws: every point, the frontier, today, the recommended one."""
    points = advice_data["points"]
    front = advice_data["frontier"]
    label = lambda p: "; ".join(c["words"] for c in p["changes"]) or "today's layout"  # noqa: E731
    return {
        "points": {
            "utilisation": [p["utilisation"] for p in points],
            "wait": [p["owners_p95_wait_s"] or 0 for p in points],
            "lost_gpu_hours": [round(p["lost_gpu_seconds"] / 3600, 2) for p in points],
            "text": [label(p) for p in points],
        },
        "frontier": {
            "utilisation": [f["utilisation"] for f in front],
            "wait": [f["owners_p95_wait_s"] or 0 for f in front],
        },
        "today": {
            "utilisation": advice_data["today"]["utilisation"],
            "wait": advice_data["today"]["owners_p95_wait_s"] or 0,
        },
        "recommended": advice_data["recommended"],
    }


def _context(st: dict | None, form: AdviceForm | None = None) -> dict:
    ctx: dict = {"form": form or AdviceForm(), "run": st, "max_weeks": advice.MAX_WEEKS}
    if st and st["advice"]:
        a = st["advice"]
        ctx["chart"] = _chart(a)
        ctx["rows"] = [
            {
                "index": i,
                **f,
                "wait_words": advise.duration_words(f["owners_p95_wait_s"]),
                "lost_gpu_hours": round(f["lost_gpu_seconds"] / 3600, 1),
                "recommended": i == a["recommended"],
            }
            for i, f in enumerate(a["frontier"])
        ]
        ctx["today_wait"] = advise.duration_words(a["today"]["owners_p95_wait_s"])
        spread = a["today"]["spread"]
        ctx["spread"] = spread
        ctx["spread_wait"] = (
            [advise.duration_words(w) for w in spread["owners_p95_wait_s"]]
            if spread["owners_p95_wait_s"]
            else None
        )
    return ctx


@require_http_methods(["GET", "POST"])
@admin_required
def advice_page(request):
    """GET: the form (and the last run named by ?run=). POST: start a run, then its page."""
    if request.method == "POST":
        form = AdviceForm(request.POST)
        if not form.is_valid():
            return render(request, "quotas/advice.html", _context(None, form), status=400)
        run_id = advice.start(weeks=form.cleaned_data["weeks"], actor=request.user)
        url = reverse("advice_run", args=[run_id])
        return hx_redirect(request, url)
    return render(request, "quotas/advice.html", _context(None))


@require_GET
@admin_required
def advice_run(request, run_id):
    st = advice.status(run_id)
    if st is None:
        raise Http404("No such advice run (it may have expired).")
    ctx = _context(st)
    if request.htmx:
        return render(request, PART, ctx, status=286 if st["finished"] else 200)
    return render(request, "quotas/advice.html", ctx)


@require_POST
@admin_required
def advice_cancel(request, run_id):
    if not advice.cancel(run_id):
        raise Http404("No such advice run (it may have expired).")
    url = reverse("advice_run", args=[run_id])
    return hx_redirect(request, url)


@require_POST
@admin_required
def advice_plan(request, run_id):
    """A layout plan of the chosen point, through the plan flow (its what-if runs): nothing changes yet."""
    st = advice.status(run_id)
    if st is None:
        raise Http404("No such advice run (it may have expired).")
    try:
        planned = advice.make_plan(
            run_id=run_id, index=int(request.POST.get("point", "")), actor=request.user
        )
    except ValueError:
        return _no_plan("point must be a number")
    except LookupError as e:  # an index off the frontier, a share gone from the layout
        return _no_plan(str(e).strip("'"))
    except ValidationError as e:  # the layout refused it as it stands now
        return _no_plan("; ".join(f"{k}: {' '.join(v)}" for k, v in e.message_dict.items()))
    url = reverse("share_layout_plan_show", args=[planned.pk])
    return hx_redirect(request, url)


def _no_plan(words: str) -> HttpResponse:
    return HttpResponse(f"No plan made: {words}", status=400, content_type="text/plain; charset=utf-8")
