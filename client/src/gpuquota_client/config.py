"""Where the CLI keeps the server URL and the token: one JSON file in the user's config directory,
readable by the user alone (0600). GPUQUOTA_CONFIG names another file; GPUQUOTA_URL and
GPUQUOTA_TOKEN override what it holds."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def config_path() -> Path:
    if os.environ.get("GPUQUOTA_CONFIG"):
        return Path(os.environ["GPUQUOTA_CONFIG"]).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "gpuquota" / "config.json"


def load(path: Path | None = None) -> dict:
    path = path or config_path()
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        data = {}
    if os.environ.get("GPUQUOTA_URL"):
        data["url"] = os.environ["GPUQUOTA_URL"]
    if os.environ.get("GPUQUOTA_TOKEN"):
        data["token"] = os.environ["GPUQUOTA_TOKEN"]
    return data


def save(data: dict, path: Path | None = None) -> Path:
    """Write the config so that only its owner can read it (the token is a password)."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.chmod(path, 0o600)  # also when the file was there before with wider rights
    return path


def remove(path: Path | None = None) -> None:
    path = path or config_path()
    try:
        path.unlink()
    except FileNotFoundError:
        pass
