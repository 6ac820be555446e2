"""Keys and signed messages for the signing tests: a control key, node keys the control side trusts
(accepted, or only asked to join) and one it does not, and Celery protocol-2 bodies as the agent and the
control side send them (with the signed envelope: task name, issue time, nonce)."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

from gpunodes import signing

ENVELOPE = "_signed"
NO_CALLBACKS = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def make_keys(keys: Path, trusted_nodes: tuple[str, ...], untrusted: tuple[str, ...] = ()) -> Path:
    """control + nodes: `keys/control-trusts` holds control and the trusted nodes' certificates,
    `keys/agent-trusts` control's only (what README, "Signed control messages", says to copy)."""
    for name in ("control", *trusted_nodes, *untrusted):
        signing.make_credentials(name, keys)
    (keys / "control-trusts").mkdir(exist_ok=True)
    (keys / "agent-trusts").mkdir(exist_ok=True)
    for name in ("control", *trusted_nodes):
        shutil.copy(keys / f"{name}.pem", keys / "control-trusts")
    shutil.copy(keys / "control.pem", keys / "agent-trusts")
    return keys


def serializer(keys: Path, name: str):
    """The serializer of `name`'s processes: control trusts its trust directory, a node control only."""
    trusted = keys / ("control-trusts" if name == "control" else "agent-trusts")
    return signing.make_serializer(str(keys / f"{name}.key"), str(keys / f"{name}.pem"), str(trusted))


def envelope(task: str, at: float | None = None, nonce: str | None = None) -> dict:
    return {"task": task, "at": time.time() if at is None else at, "nonce": nonce or uuid.uuid4().hex}


def body(task: str, *args, embed: dict | None = None, signed: dict | None = None, **kwargs) -> list:
    """A protocol-2 body (args, kwargs, embed) for `task`, its envelope in the kwargs."""
    return [list(args), {**kwargs, ENVELOPE: signed or envelope(task)}, {**NO_CALLBACKS, **(embed or {})}]


def signing_env(keys: Path, name: str) -> dict[str, str]:
    trusted = "control-trusts" if name == "control" else "agent-trusts"
    return {
        "MESSAGE_SIGNING_KEY": str(keys / f"{name}.key"),
        "MESSAGE_SIGNING_CERT": str(keys / f"{name}.pem"),
        "MESSAGE_TRUSTED_CERTS": str(keys / trusted),
    }
