"""The notifications page: what each user is told by e-mail, their webhooks, and their teams' channels
(a team's managers add and remove them); a failing or switched-off endpoint is shown to its owner."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from notify.forms import ChannelForm, EmailForm
from notify.models import Channel, Kind
from quotas.choices import Role
from quotas.models import Team


def managed_teams(user):
    if user.is_superuser:
        return Team.objects.order_by("slug")
    return Team.objects.filter(memberships__user=user, memberships__role=Role.MANAGER).order_by("slug")


def _owners(user) -> list[tuple[str, str]]:
    return [("me", "Me (my jobs)")] + [
        (f"team:{t.slug}", f"Team {t.name} (its jobs)") for t in managed_teams(user)
    ]


def _visible(user):
    return Channel.objects.filter(Q(user=user) | Q(team__in=managed_teams(user))).select_related("team")


@login_required
@require_http_methods(["GET", "POST"])
def notifications(request):
    email = Channel.objects.filter(user=request.user, kind=Kind.EMAIL).first()
    email_form = EmailForm(initial={"events": email.events if email else []})
    channel_form = ChannelForm(owners=_owners(request.user))
    if request.method == "POST" and request.POST.get("form") == "email":
        email_form = EmailForm(request.POST)
        if email_form.is_valid():
            events = email_form.cleaned_data["events"]
            if events:
                Channel.objects.update_or_create(
                    user=request.user, kind=Kind.EMAIL, defaults={"events": events, "disabled_at": None}
                )
            else:
                Channel.objects.filter(user=request.user, kind=Kind.EMAIL).delete()
            messages.success(request, "E-mail choices saved.")
            return redirect("notifications")
    elif request.method == "POST":
        channel_form = ChannelForm(request.POST, owners=_owners(request.user))
        if channel_form.is_valid():
            data = channel_form.cleaned_data
            owner = {"user": request.user}
            if data["owner"].startswith("team:"):
                owner = {"team": managed_teams(request.user).get(slug=data["owner"][5:])}
            Channel.objects.create(
                **owner, kind=data["kind"], url=data["url"], secret=data["secret"], events=data["events"]
            )
            messages.success(request, "Channel added.")
            return redirect("notifications")
    status = 200 if request.method == "GET" else 400
    return render(
        request,
        "notify/notifications.html",
        {
            "email_form": email_form,
            "channel_form": channel_form,
            "channels": _visible(request.user).exclude(kind=Kind.EMAIL).order_by("team__slug", "id"),
            "email": email,
            "has_address": bool(request.user.email),
        },
        status=status,
    )


@login_required
@require_POST
def channel_delete(request, pk: int):
    deleted, _ = _visible(request.user).filter(pk=pk).exclude(kind=Kind.EMAIL).delete()
    if not deleted:
        raise Http404
    messages.success(request, "Channel removed.")
    return redirect("notifications")
