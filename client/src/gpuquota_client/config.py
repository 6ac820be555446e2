"""Where the CLI keeps the server URL and the token: one JSON file in the user's config directory,
readable by the user alone (0600). GPUQUOTA_CONFIG names another file; GPUQUOTA_URL and
GPUQUOTA_TOKEN override what it holds. Paths are plain strings (os.path): pathlib's import costs a
noticeable part of a `gpuquota` command's start."""

from __future__ import annotations

import os
import sys


def config_path(override: str | os.PathLike | None = None) -> str:
    """The config file: `override` (--config) if given, else $GPUQUOTA_CONFIG, else the user's config
    directory's gpuquota/config.json."""
    if override:
        return os.fspath(override)
    if os.environ.get("GPUQUOTA_CONFIG"):
        return os.path.expanduser(os.environ["GPUQUOTA_CONFIG"])
    home = os.path.expanduser("~")
    if sys.platform == "win32":
        base = os.environ.get("APPDATA") or os.path.join(home, "AppData", "Roaming")
    elif sys.platform == "darwin":
        base = os.path.join(home, "Library", "Application Support")
    else:
        base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    return os.path.join(base, "gpuquota", "config.json")


def load(path: str | os.PathLike | None = None) -> dict:
    path = path or config_path()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (FileNotFoundError, ValueError):
        text = ""
    data = {}
    if text:
        from gpuquota_client.quickjson import loads

        try:
            data = loads(text)
        except ValueError:
            data = {}
    if os.environ.get("GPUQUOTA_URL"):
        data["url"] = os.environ["GPUQUOTA_URL"]
    if os.environ.get("GPUQUOTA_TOKEN"):
        data["token"] = os.environ["GPUQUOTA_TOKEN"]
    return data


def save(data: dict, path: str | os.PathLike | None = None) -> str:
    """Write the config so that only its owner can read it (the token is a password)."""
    import json

    path = os.fspath(path or config_path())
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.chmod(path, 0o600)  # also when the file was there before with wider rights
    return path


def remove(path: str | os.PathLike | None = None) -> None:
    path = path or config_path()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
