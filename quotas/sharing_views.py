"""The usage page (admins): GPU-hours used, lent, borrowed and lost by cause per share and team over
time, what sharing gained and what it cost the owners (quotas/sharing.py). Its numbers are also the
API's (GET /api/v1/usage/) and the CSV download's (?format=csv there)."""

from __future__ import annotations

from django.shortcuts import render
from django.views.decorators.http import require_GET

from quotas import organisation, sharing, usage
from quotas.forms import UsageForm
from quotas.views import admin_required


@require_GET
@admin_required
def usage_page(request):
    form = UsageForm(request.GET)
    valid = form.is_valid()
    days = form.cleaned_data["days"] if valid else 7
    share = (form.cleaned_data["share"] or None) if valid else None
    report = sharing.report(days=days)
    query = f"days={days}" + (f"&share={share}" if share else "")

    def row(figures: sharing.Figures, **names) -> dict:
        data = figures.as_dict()
        # In the causes' order, for the table's columns; priorities highest first.
        data["lost_row"] = [data["lost_gpu_hours"][c] for c in sharing.CAUSES]
        data["lost_pairs"] = [
            (sharing.CAUSE_LABELS[c], h) for c, h in zip(sharing.CAUSES, data["lost_row"], strict=True) if h
        ]
        data["waits_by_priority"] = list(data["owner_wait"]["by_priority"].items())
        return {**names, **data}

    context = {
        "form": form,
        "report": report,
        "days": days,
        "share": share,
        "share_names": sorted(report.teams),
        "shares": [row(f, name=name, team=report.teams[name]) for name, f in sorted(report.shares.items())],
        "teams": [row(f, team=team) for team, f in sorted(report.team_totals.items())],
        "cluster": row(report.cluster),
        "chart": report.chart(share),
        "causes": [(c, sharing.CAUSE_LABELS[c]) for c in sharing.CAUSES],
        # borrowed GPU-hours per type, group and share against their fair part (issue 37)
        "tree": organisation.borrowing_by_tree(usage.borrowed_by_type(report.since, report.until)),
        "csv_url": f"/api/v1/usage/?format=csv&{query}",
        "api_url": f"/api/v1/usage/?{query}",
    }
    return render(request, "quotas/usage.html", context, status=200 if valid else 400)
