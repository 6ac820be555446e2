"""Read-only dataset mounts of a container job (README "Container images"): host directories an admin
allowed, for every share with the cluster's ALLOWED_MOUNTS, for one share with its `allowed_mounts` (the
layout document). A job names each as HOST[:CONTAINER] (the same path inside when CONTAINER is left out);
it is mounted read-only, nosuid and nodev. Nothing is allowed unless an admin allowed it; a refusal names
the rule.

Here the names are checked: absolute, plain (no `.` or `..` part, no `:` or `,`), under an allowed
directory at a `/`. What a name leads to on the host (symlinks) is checked where it is mounted, on the GPU
host, against the real path of the directory that allowed it (gpunodes/agent/containers.resolve_dataset):
a link inside a dataset cannot reach beyond it."""

from __future__ import annotations

import re
from collections.abc import Iterable

from django.conf import settings

MAX_MOUNTS = 8
MAX_PATH = 1024
# Where a dataset may not go inside the container: the image's own system directories, and the
# directories podman or the agent mount there (gpunodes/agent/containers.RESERVED_TARGETS).
RESERVED_TARGETS = ("/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/usr", "/tmp", "/run")
EXAMPLE = "/datasets/imagenet:/data/imagenet"


def path_problem(path, what: str = "path") -> str | None:
    """Why `path` is not a plain absolute path (the admin's rules are checked with it too)."""
    if not isinstance(path, str) or not path:
        return f"the {what} is empty"
    if len(path) > MAX_PATH:
        return f"the {what} may be at most {MAX_PATH} characters"
    if not path.startswith("/"):
        return f'the {what} "{path}" is not absolute (it must start with /)'
    if re.search(r"[:,\x00-\x1f\x7f]", path):
        return f'the {what} "{path}" holds a ":", a "," or a control character'
    if path != "/" and any(part in ("", ".", "..") for part in path.split("/")[1:]):
        return f'the {what} "{path}" has an empty, "." or ".." part: write it plainly'
    return None


def under(path: str, root: str) -> bool:
    """`path` is `root` or lies in it (at a "/": /data/set is not under /data/se)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def rule_problem(rule) -> str | None:
    """Why an admin's allowed directory is not one (the layout's check and the setting's)."""
    problem = path_problem(rule, "allowed directory")
    return f"{rule!r} is not a host directory to allow: {problem}" if problem else None


def parse(spec) -> tuple[str, str]:
    """HOST[:CONTAINER] as (host, container). Raises ValueError in words."""
    if not isinstance(spec, str):
        raise ValueError(f"a mount is HOST[:CONTAINER], e.g. {EXAMPLE}")
    host, sep, container = spec.partition(":")
    container = container if sep else host
    for what, path in (("host path", host), ("container path", container)):
        problem = path_problem(path, what)
        if problem:
            raise ValueError(f"{problem} (a mount is HOST[:CONTAINER], e.g. {EXAMPLE})")
    if container == "/" or any(under(container, r) for r in RESERVED_TARGETS):
        raise ValueError(
            f'a dataset may not be mounted at "{container}" in the container (not /, nor under '
            f"{', '.join(RESERVED_TARGETS)})"
        )
    return host, container


def mounts_problem(
    specs, *, image: str, share_name: str, share_rules: Iterable[str]
) -> tuple[list[dict] | None, str | None]:
    """The job's mounts as stored ([{"host", "container", "allowed_by"}]) or why not, in words that name
    the rules."""
    if not specs:
        return [], None
    if not isinstance(specs, list | tuple):
        return None, f"Give a list of HOST[:CONTAINER] mounts, e.g. [{EXAMPLE}]."
    if not image:
        return None, "Only a container job may mount datasets: name an image too."
    if len(specs) > MAX_MOUNTS:
        return None, f"A job may mount at most {MAX_MOUNTS} datasets."
    # "/datasets/" as written in the environment is the directory /datasets (the agent takes plain paths).
    cluster = [rule.rstrip("/") or "/" for rule in settings.ALLOWED_MOUNTS]
    share = list(share_rules or ())
    out: list[dict] = []
    for spec in specs:
        try:
            host, container = parse(spec)
        except ValueError as e:
            return None, f"Mount {spec!r}: {e}."
        if any(m["container"] == container for m in out):
            return None, f'Two mounts go to "{container}" in the container.'
        rule = next((r for r in (*cluster, *share) if under(host, r)), None)
        if rule is None:
            said = [
                f"ALLOWED_MOUNTS allows {', '.join(cluster)}" if cluster else "ALLOWED_MOUNTS allows none",
                f'share "{share_name}" allows {", ".join(share)}'
                if share
                else f'share "{share_name}" allows none (allowed_mounts in the layout)',
            ]
            return None, f'Mount "{host}" is not allowed here: {"; ".join(said)}. Ask an admin to allow it.'
        out.append({"host": host, "container": container, "allowed_by": rule})
    return out, None


def words(mounts) -> list[str]:
    """The stored mounts as the job named them (HOST:CONTAINER), for pages, API and CLI."""
    return [f"{m['host']}:{m['container']}" for m in mounts or ()]
