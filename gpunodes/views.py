"""Dashboard pages of the gpunodes app: the grid of hosts and their GPUs (coloured by the share using
each GPU, hatched while borrowed, red while broken, heartbeat age), a node's own page (its GPUs with their
health, its GPU failures), and the admins' cordon / uncordon / drain and mark-healthy buttons."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from gpunodes import services
from gpunodes.choices import GpuHealth, NodeState
from gpunodes.models import Gpu, Node
from jobs.services import Conflict
from quotas.views import admin_required, hx_redirect, page_or_part

NODES_PER_PAGE = 64  # a page of a big cluster renders in tens of milliseconds; 1,000 nodes took over a second
ACTIONS = {"cordon": services.node_cordon, "uncordon": services.node_uncordon, "drain": services.node_drain}


# The buttons an admin gets on a node, by its state (templates/gpunodes/partials/_grid.html).
BUTTONS = {
    NodeState.READY: (("cordon", "Cordon"), ("drain", "Drain")),
    NodeState.CORDONED: (("uncordon", "Uncordon"), ("drain", "Drain")),
    NodeState.DRAINING: (("uncordon", "Uncordon"),),
}


# A node whose GPUs nobody can use now, whatever its last claims say: its GPUs read so, never "free".
OUT_OF_SERVICE = {
    NodeState.LOST: ("lost", "node lost: not usable until its agent is heard again"),
    NodeState.PENDING: ("pending", "node not accepted yet: not usable"),
}


def _gpu_cell(g: dict, node_state: str, may_see) -> dict:
    """A GPU of the grid ready to print: its classes, its title and who holds it (a page shows 64 nodes
    of 8 GPUs: the template places these instead of deciding each GPU's words). The job's id and name
    are shown only to those who may see the job (`may_see(share name)`: its team's members, admins), as
    its page is; others see the share that uses the GPU. A GPU that is not healthy says so in red, with
    its reason and since when, whoever still holds it."""
    if g["health"] != GpuHealth.HEALTHY:
        checking = g["health"] == GpuHealth.CHECKING
        since = (
            timezone.localtime(g["health_changed_at"]).strftime("%Y-%m-%d %H:%M:%S")
            if g["health_changed_at"]
            else "?"
        )
        words = (
            f"marked healthy at {since}, waiting for its agent's re-check"
            if checking
            else f"UNHEALTHY since {since}: {g['health_reason']}: {g['health_detail']}"
        )
        who = "re-checking" if checking else "unhealthy"
        return {
            **g,
            "css": "unhealthy checking" if checking else "unhealthy",
            "title": f"GPU {g['index']}: {words}",
            "who": who,
            "broken": True,
        }
    if not g["share"]:
        if node_state in OUT_OF_SERVICE:
            css, words = OUT_OF_SERVICE[node_state]
            return {**g, "css": f"free {css}", "title": f"GPU {g['index']}: {words}", "who": css}
        return {**g, "css": "free", "title": f"GPU {g['index']}: free", "who": "free"}
    title = f"GPU {g['index']}: share {g['share']}"
    if may_see(g["share"]):
        title += f", job {g['job_id']}"
        if g["job_name"]:
            title += f" {g['job_name']}"
    if g["borrowed"]:
        title += " (borrowed GPU)"
    elif g["job_borrowed"]:
        title += " (a borrowed job; this GPU is within the share's own capacity)"
    return {
        **g,
        "css": f"s{g['colour']} hatched" if g["borrowed"] else f"s{g['colour']}",
        "title": title,
        "who": f"{g['share']} · borrowed" if g["borrowed"] else g["share"],
    }


def _share_visibility(user):
    """A predicate share name -> whether `user` may see that share's jobs (jobs.services.visible_jobs'
    rule: an admin every share's, anyone else their teams'). One query."""
    if user.is_superuser:
        return lambda share: True
    from quotas.models import Share

    names = set(Share.objects.filter(team__memberships__user=user).values_list("name", flat=True))
    return names.__contains__


def grid_context(request) -> dict:
    # Page the node names first, then read only that page's nodes, GPUs and claims.
    names = Node.objects.order_by("name").values_list("name", flat=True)
    page = Paginator(names, NODES_PER_PAGE).get_page(request.GET.get("page"))
    grid = services.node_grid(now=timezone.now(), names=list(page.object_list))
    admin = request.user.is_superuser
    may_see = _share_visibility(request.user)
    for row in grid:
        row["gpus"] = [_gpu_cell(g, row["node"].state, may_see) for g in row["gpus"]]
        row["buttons"] = [
            {"label": label, "url": reverse("node_action", args=[row["node"].name, action])}
            for action, label in (BUTTONS.get(row["node"].state, ()) if admin else ())
        ]
    return {"grid": grid, "page": page, "poll": True}


def node_context(request, node: Node) -> dict:
    """A node's page: its GPUs as the grid shows them (with mark-healthy for admins), and its GPU
    failures, the latest first."""
    [row] = services.node_grid(now=timezone.now(), names=[node.name])
    may_see = _share_visibility(request.user)
    row["gpus"] = [_gpu_cell(g, node.state, may_see) for g in row["gpus"]]
    admin = request.user.is_superuser
    for g in row["gpus"]:
        g["heal_url"] = (
            reverse("gpu_mark_healthy", args=[node.name, g["index"]])
            if admin and g["health"] == GpuHealth.UNHEALTHY
            else None
        )
    row["buttons"] = [
        {"label": label, "url": reverse("node_action", args=[node.name, action])}
        for action, label in (BUTTONS.get(node.state, ()) if admin else ())
    ]
    failures = list(node.gpu_failures.select_related("cleared_by")[:FAILURES_SHOWN])
    return {"node": node, "row": row, "failures": failures, "poll": True}


FAILURES_SHOWN = 50


@require_GET
@login_required
def node_grid(request):
    context = grid_context(request)
    return page_or_part(request, "gpunodes/nodes.html", {"grid": "gpunodes/partials/_grid.html"}, context)


@require_GET
@login_required
def node_page(request, name):
    node = get_object_or_404(Node, name=name)
    context = node_context(request, node)
    return page_or_part(request, "gpunodes/node.html", {"gpus": "gpunodes/partials/_node_gpus.html"}, context)


@require_POST
@admin_required
def gpu_mark_healthy(request, name, index):
    """An admin brings a GPU back after a reset: its agent re-checks it before it takes work."""
    node = get_object_or_404(Node, name=name)
    try:
        services.gpu_mark_healthy(node=node, index=index, actor=request.user)
    except Gpu.DoesNotExist:
        raise Http404(f"Node {name} has no GPU {index}.") from None
    if request.htmx:
        return render(request, "gpunodes/partials/_node_gpus.html", node_context(request, node))
    return hx_redirect(request, reverse("node", args=[name]))


@require_POST
@admin_required
def node_action(request, name, action):
    node = get_object_or_404(Node, name=name)
    if action not in ACTIONS:
        return HttpResponse(f"Unknown action {action}.", status=400, content_type="text/plain; charset=utf-8")
    try:
        ACTIONS[action](node=node, actor=request.user)
    except Conflict as e:
        return HttpResponse(str(e), status=409, content_type="text/plain; charset=utf-8")
    if request.htmx:
        return render(request, "gpunodes/partials/_grid.html", grid_context(request))
    return hx_redirect(request, reverse("nodes"))
