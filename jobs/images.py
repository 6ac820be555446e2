"""Which container images a job may name (README "Container images"): the cluster's ALLOWED_IMAGES and
the share's `allowed_images` (the layout document), each a list of registries or image prefixes. Nothing
is allowed unless an admin allowed it; a refusal names the rule that would have let it through."""

from __future__ import annotations

import re
from collections.abc import Iterable

from django.conf import settings

MAX_IMAGE = 255
# A fully qualified reference: a registry host (with a dot or a port, or `localhost`), a path, then an
# optional :tag and/or @digest. Short names ("python:3.11") are refused: podman would resolve them
# through the host's search registries, which is not the name the admin allowed.
IMAGE_RE = re.compile(
    r"^(?P<registry>localhost(?::\d+)?|[a-z0-9-]+(?:\.[a-z0-9-]+)+(?::\d+)?|[a-z0-9-]+:\d+)"
    r"(?P<path>(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}))?$"
)
PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9._:/@-]*$")


def image_syntax_problem(image: str) -> str | None:
    if not isinstance(image, str) or not image:
        return "Give an image such as registry.example.com/team/train:1.4."
    if len(image) > MAX_IMAGE:
        return f"An image name may be at most {MAX_IMAGE} characters."
    if not IMAGE_RE.match(image):
        return (
            f'"{image}" is not a fully qualified image name: write registry/path[:tag][@sha256:digest], '
            "e.g. registry.example.com/team/train:1.4 (short names like python:3.11 are not resolved)."
        )
    return None


def prefix_problem(prefix: str) -> str | None:
    """Why an admin's allow-list entry is not one (the layout's check and the setting's)."""
    if not isinstance(prefix, str) or not PREFIX_RE.match(prefix) or len(prefix) > MAX_IMAGE:
        return f"{prefix!r} is not a registry or image prefix (e.g. registry.example.com/ml/)"
    return None


def matches(image: str, prefix: str) -> bool:
    """A prefix allows the image itself and what lies under it: "reg.example.com/ml" allows
    reg.example.com/ml/train:1 and reg.example.com/ml:2, never reg.example.com/mlx."""
    if image == prefix:
        return True
    if not image.startswith(prefix):
        return False
    return prefix[-1] in "/:@" or image[len(prefix)] in "/:@"


def allowed_by(image: str, rules: Iterable[str]) -> str | None:
    return next((p for p in rules if matches(image, p)), None)


def image_problem(image: str, *, share_name: str, share_rules: Iterable[str]) -> str | None:
    """Why the share may not run this image, in words that name the rules; None when it may."""
    problem = image_syntax_problem(image)
    if problem:
        return problem
    cluster = list(settings.ALLOWED_IMAGES)
    share = list(share_rules or ())
    if allowed_by(image, cluster) or allowed_by(image, share):
        return None
    said = []
    said.append(f"ALLOWED_IMAGES allows {', '.join(cluster)}" if cluster else "ALLOWED_IMAGES allows none")
    said.append(
        f'share "{share_name}" allows {", ".join(share)}'
        if share
        else f'share "{share_name}" allows none (allowed_images in the layout)'
    )
    return f'Image "{image}" is not allowed here: {"; ".join(said)}. Ask an admin to allow it.'
