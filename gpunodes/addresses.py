"""The address a node advertises to its peers (its heartbeat's `address`, a gang's MASTER_ADDR and
GPUQUOTA_HOSTS): an IP address or a host name, checked the same way where a heartbeat brings it and where
a start message carries it on to a job's environment. No Django here: the agent uses it too."""

from __future__ import annotations

import ipaddress
import re

MAX_LENGTH = 253
HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


def valid_address(value) -> bool:
    """An IPv4 or IPv6 address, or a DNS host name (letters, digits, hyphens, dots)."""
    if not isinstance(value, str) or not value or len(value) > MAX_LENGTH:
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return bool(HOST_NAME.match(value))
    return True
