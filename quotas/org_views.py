"""The organisation page (/organisation/): the tree of groups and shares per GPU type, each with its
capacity, use, what it takes from and lends outside, its fair-share value with its parts and its state
in words, and for the reader's own shares their fair part and why they wait; live over htmx like the
overview (one partial per swap target). Everyone logged in reads it: groups and shares by name and
their numbers, never a job."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.views.decorators.http import require_GET

from quotas import organisation
from quotas.models import Share
from quotas.views import page_or_part

ORG_PARTS = {
    "tree": "quotas/partials/_org_tree.html",
    "mine": "quotas/partials/_org_mine.html",
}


def _own_shares(user) -> list[str]:
    qs = Share.objects.order_by("name")
    if not user.is_superuser:
        qs = qs.filter(team__memberships__user=user)
    return list(qs.values_list("name", flat=True).distinct())


@require_GET
@login_required
def organisation_page(request):
    part = request.GET.get("part") if request.htmx else None
    org = organisation.load_recent()
    context: dict = {"org": org, "poll": True, "states": organisation.STATES}
    if part in (None, "tree"):
        context["types"] = [
            {"gpu_type": t, "nodes": org.of_type(t), "sunburst": org.sunburst(t)} for t in org.gpu_types
        ]
    if part in (None, "mine"):
        context["mine"] = organisation.share_lines(org, _own_shares(request.user))
    return page_or_part(request, "quotas/organisation.html", ORG_PARTS, context)
