"""Start-up checks of the timing behind "never two copies of a job at once" (README, "Failures and
timing"): an agent that cannot renew its lease stops its jobs (FENCE_AFTER_S, then SIGTERM,
FENCE_GRACE_S, SIGKILL) before the control side may declare its node LOST and start the copies
elsewhere (NODE_LOST_AFTER_S). Run by every management command (the agent, the web server, migrate,
`check`); set the same values on the control side and on the agents. And the rendezvous ports
(RENDEZVOUS_PORTS) are a range the pass can choose from."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register


def fence_margin_s() -> float:
    """What must separate a fenced attempt's last moment from its node's LOST: the heartbeats still on
    their way (the broker's and the control worker's lag), two heartbeat intervals."""
    return 2.0 * settings.HEARTBEAT_INTERVAL_S


@register(Tags.compatibility)
def fence_before_lost(app_configs, **kwargs) -> list:
    fence, grace, lost = settings.FENCE_AFTER_S, settings.FENCE_GRACE_S, settings.NODE_LOST_AFTER_S
    heartbeat = settings.HEARTBEAT_INTERVAL_S
    if fence <= 0:
        return [
            Warning(
                "FENCE_AFTER_S is 0: an agent that is frozen or cut off from the broker keeps running its "
                "jobs after their node is LOST and their copies start elsewhere (only an agent that dies "
                "takes its jobs with it).",
                id="gpunodes.W001",
            )
        ]
    errors = []
    if fence < 2 * heartbeat:
        errors.append(
            Error(
                f"FENCE_AFTER_S ({fence}) is shorter than two heartbeats (HEARTBEAT_INTERVAL_S {heartbeat}): "
                "healthy agents would fence their jobs.",
                id="gpunodes.E002",
            )
        )
    if fence + grace + fence_margin_s() > lost:
        errors.append(
            Error(
                f"FENCE_AFTER_S ({fence}) + FENCE_GRACE_S ({grace}) + two heartbeats ({fence_margin_s():.0f}) "
                f"exceed NODE_LOST_AFTER_S ({lost}): a node could be declared LOST, and its jobs started "
                "elsewhere, while its agent still runs them.",
                hint="Raise NODE_LOST_AFTER_S or lower FENCE_AFTER_S / FENCE_GRACE_S.",
                id="gpunodes.E001",
            )
        )
    return errors


@register(Tags.compatibility)
def rendezvous_ports(app_configs, **kwargs) -> list:
    from gpunodes.rendezvous import port_range

    try:
        port_range()
    except ValueError as e:
        return [Error(str(e), id="gpunodes.E003")]
    return []
