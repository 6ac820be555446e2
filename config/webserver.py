"""The web server as the README's production setup runs it (granian), for those that start one: the
benchmarks and the fault tests' cluster. README "Production setup" says why these settings."""

from __future__ import annotations


def granian_argv(
    python: str, *, host: str, port: int, workers: int, threads: int, log_level: str | None = None
) -> list[str]:
    return [
        python,
        "-m",
        "granian",
        "--interface",
        "wsgi",
        "config.wsgi:application",
        "--workers",
        str(workers),
        "--blocking-threads",
        str(threads),
        "--runtime-threads",
        "1",
        "--respawn-failed-workers",
        # A worker that does not stop on SIGTERM (one stuck after a sibling was killed mid-burst did, for
        # good) is killed after this: a stop of the web server is bounded.
        "--workers-kill-timeout",
        "5",
        "--no-ws",
        "--host",
        host,
        "--port",
        str(port),
        *(["--log-level", log_level] if log_level else []),
    ]
