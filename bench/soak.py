"""Soak `make run`: the demo stays up for hours with the pages open (issue 13's "done when").

Run beside a `make run` in CHECKOUT (default: this one), from that checkout, so the settings, the
SQLite database and the file broker are the demo's own:

    .venv/bin/python -m bench.soak --hours 2 --log var/soak.log

It opens headless Chromium (Debian's /usr/bin/chromium) as the admin on the overview and as a demo
user on their team page and leaves both open (their htmx polls run as a user's would). Each minute it
records: responses that failed (>= 500 or no answer) and JavaScript errors on the two pages; the control
queue's lag (a probe heartbeat of a cordoned node put on the control queue, seconds until handled);
READY nodes; jobs finished in the minute; the process manager's restarts (from the make run log).
It exits 1 when any minute had a failed response, a JavaScript error, a lag over 1 s, fewer READY
nodes than at the start or no finished job, and prints a summary either way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
PROBE = "soak-probe"


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # Playwright's sync API keeps an event loop on this thread; our ORM reads are plain blocking calls.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    import django

    django.setup()


def probe_lag(timeout: float = 30.0) -> float | None:
    """Seconds from a probe heartbeat put on the control queue until the control worker handled it."""
    from config.celery import CONTROL_QUEUE, app
    from gpunodes.models import Node
    from gpunodes.services import fake_inventory

    sent = time.time()
    app.send_task(
        "gpunodes.tasks.node_heartbeat",
        kwargs={
            "name": PROBE,
            "gpu_type": "a10g",
            "inventory": [g.__dict__ for g in fake_inventory(PROBE, 1)],
            "running": [],
            "boot_id": "00000000000000-soak",
            "sent_at": sent,
        },
        queue=CONTROL_QUEUE,
    )
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        seen = Node.objects.filter(name=PROBE).values_list("last_heartbeat", flat=True).first()
        if seen and seen.timestamp() >= sent:
            return seen.timestamp() - sent
        time.sleep(0.02)
    return None


def sign_in(context, username: str, password: str, path: str):
    page = context.new_page()
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")
    page.goto(path)
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--run-log", default="", help="make run's output, to count restarts")
    parser.add_argument("--log", default="", help="also append each sample here (JSON lines)")
    args = parser.parse_args(argv)

    setup_django()
    from django.utils import timezone
    from playwright.sync_api import sync_playwright

    from gpunodes.choices import NodeState
    from gpunodes.models import Node
    from gpunodes.services import fake_inventory, node_register
    from jobs.models import Job
    from quotas.credentials import read_credentials
    from quotas.models import Share

    node_register(name=PROBE, gpu_type="a10g", gpus=fake_inventory(PROBE, 1), state=NodeState.CORDONED)
    creds = read_credentials()
    admin = next((u, p) for u, p, what in creds if what.startswith("admin"))
    member = next((u, p) for u, p, what in creds if not what.startswith("admin"))
    team = (
        Share.objects.filter(team__members__username=member[0]).values_list("team__slug", flat=True).first()
    )

    failures: list[str] = []
    js_errors: list[str] = []

    def watch(page, who):
        page.on("pageerror", lambda e: js_errors.append(f"{who}: {e}"))
        page.on(
            "response",
            lambda r: r.status >= 500 and failures.append(f"{who}: {r.status} {r.url}"),
        )
        page.on("requestfailed", lambda r: failures.append(f"{who}: failed {r.url} {r.failure}"))

    samples = []
    bad = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        pages = []
        for who, (user, password), path in (
            ("admin", admin, "/"),
            ("member", member, f"/teams/{team}/" if team else "/"),
        ):
            context = browser.new_context(base_url=args.url)
            page = sign_in(context, user, password, path)
            watch(page, who)
            pages.append(page)
        ready0 = Node.objects.filter(state=NodeState.READY).count()
        started = time.monotonic()
        last = timezone.now()
        while time.monotonic() - started < args.hours * 3600:
            # the pages' own htmx polls run while we wait
            pages[0].wait_for_timeout(args.every * 1000)
            now = timezone.now()
            finished = Job.objects.filter(finished_at__gt=last, finished_at__lte=now).count()
            last = now
            restarts = 0
            if args.run_log and Path(args.run_log).exists():
                restarts = len(
                    re.findall(r"restarting it in", Path(args.run_log).read_text(errors="replace"))
                )
            sample = {
                "minute": round((time.monotonic() - started) / 60, 1),
                "lag_s": probe_lag(),
                "ready_nodes": Node.objects.filter(state=NodeState.READY).count(),
                "finished": finished,
                "failed_responses": len(failures),
                "js_errors": len(js_errors),
                "restarts": restarts,
            }
            samples.append(sample)
            problems = []
            if sample["lag_s"] is None or sample["lag_s"] > 1.0:
                problems.append(f"lag {sample['lag_s']}")
            if sample["ready_nodes"] < ready0:
                problems.append(f"{sample['ready_nodes']} READY of {ready0}")
            if not finished:
                problems.append("no job finished")
            if failures or js_errors:
                problems.append(f"{failures[-3:]} {js_errors[-3:]}")
            if problems:
                bad.append((sample["minute"], problems))
            line = json.dumps(sample | {"problems": problems})
            print(line, flush=True)
            if args.log:
                with open(args.log, "a") as f:
                    f.write(line + "\n")
        browser.close()

    lags = sorted(s["lag_s"] for s in samples if s["lag_s"] is not None)
    summary = {
        "minutes": len(samples),
        "jobs_finished": sum(s["finished"] for s in samples),
        "lag_median_s": round(lags[len(lags) // 2], 3) if lags else None,
        "lag_max_s": round(lags[-1], 3) if lags else None,
        "failed_responses": len(failures),
        "js_errors": len(js_errors),
        "restarts": samples[-1]["restarts"] if samples else 0,
        "bad_minutes": len(bad),
    }
    print("SUMMARY " + json.dumps(summary), flush=True)
    for minute, problems in bad[:20]:
        print(f"  minute {minute}: {'; '.join(problems)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
