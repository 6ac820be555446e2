"""The sign-in file of a local install: `var/credentials.txt` (mode 0600) keeps the passwords that
`ensure_admin` and `seed_demo` generate, and `manage.py credentials` prints it last in `make run`, so a
password shown once is not lost under the log, and a second `make run` still says how to get in."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

HEADER = "# gpuquota sign-in (make run). Change a password: python manage.py changepassword USER\n"


def credentials_path() -> Path:
    return Path(settings.VAR_DIR) / "credentials.txt"


def read_credentials() -> list[tuple[str, str, str]]:
    """(username, password, what) for each user in the file, in the order written."""
    path = credentials_path()
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            username, password, what = (line.split(None, 2) + ["", ""])[:3]
            rows.append((username, password, what))
    return rows


def remember_credentials(username: str, password: str, what: str) -> Path:
    """Add or replace one user's line; the file is written whole under a temporary name, mode 0600."""
    rows = [r for r in read_credentials() if r[0] != username] + [(username, password, what)]
    path = credentials_path()
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(HEADER + "".join(f"{u}  {p}  {w}\n" for u, p, w in rows))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path
