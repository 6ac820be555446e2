"""Seed a week of finished history for the what-if: `python manage.py seed_history --jobs 20000`.

A synthetic trace (quotas.engine.tracegen: Helios-shaped teams, job sizes, run times and bursty arrivals) with
its own cluster: teams, shares and LOST nodes named `hist-…` (no agent runs them, so no work is ever
placed there), and N jobs submitted over the last `--days` days, written with bulk inserts. Every job
is finished: SUCCEEDED with one attempt of its run time, or, when that run would end after now,
CANCELLED with max_runtime_s = its run time (what the what-if then replays it with).

Safe on a demo database: it adds only `hist-` rows, refuses while earlier `hist-` rows exist (unless
--replace, which deletes exactly those first), and refuses a GPU type that nodes not its own have.
Its shares and LOST nodes are part of the live layout and the nodes page while they exist (an
over-commit warning included: no READY node holds their GPUs): `--remove` deletes exactly what it
wrote, and nothing else, when the what-if has served.
"""

from __future__ import annotations

import math
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from gpunodes.choices import NodeState
from gpunodes.models import Gpu, Node
from jobs.choices import AttemptState, JobState, Outcome
from jobs.models import Attempt, Job
from quotas.engine import tracegen
from quotas.models import Share, ShareCapacity, Team

PREFIX = "hist-"
USER = "hist-seed"
BATCH = 2000
# tracegen's horizon is about 10.4 days for 20,000 jobs on 512 GPUs: this many GPUs per job make it a week.
GPUS_PER_JOB_WEEK = 512 * 10.43 / 7 / 20000


def default_gpus(jobs: int, days: float) -> int:
    gpus = jobs * GPUS_PER_JOB_WEEK * 7 / days
    return max(16, math.ceil(gpus / tracegen.NODE_GPUS) * tracegen.NODE_GPUS)


def generate(*, jobs: int, gpus: int, seed: int, gpu_type: str) -> dict:
    """tracegen's scenario, with fewer teams where a small cluster cannot give each its quota."""
    for teams in range(min(6, max(1, gpus // 16)), 0, -1):
        try:
            return tracegen.generate(teams=teams, gpus=gpus, jobs=jobs, seed=seed, gpu_type=gpu_type)
        except ZeroDivisionError:  # a team scaled to no GPUs
            continue
    raise CommandError(f"tracegen cannot shape {jobs} jobs on {gpus} GPUs")


def delete_seeded() -> dict[str, int]:
    """Delete what an earlier seed_history wrote (only `hist-` rows), under the layout lock (its shares
    are part of the layout: a plan made before is stale after). Returns how many of each went."""
    from quotas import layout

    layout.lock()
    shares = Share.objects.filter(name__startswith=PREFIX)
    counts = {
        "jobs": Job.objects.filter(share__in=shares).count(),
        "shares": shares.count(),
        "teams": Team.objects.filter(slug__startswith=PREFIX).count(),
        "nodes": Node.objects.filter(name__startswith=PREFIX).count(),
    }
    Job.objects.filter(share__in=shares).delete()
    ShareCapacity.objects.filter(share__in=shares).delete()
    shares.delete()
    Team.objects.filter(slug__startswith=PREFIX).delete()
    Node.objects.filter(name__startswith=PREFIX).delete()
    get_user_model().objects.filter(username=USER).delete()
    return counts


class Command(BaseCommand):
    help = "Seed a 7-day history of N finished jobs (own hist- teams, shares, nodes) for the what-if."

    def add_arguments(self, parser):
        parser.add_argument("--jobs", type=int, default=20000)
        parser.add_argument("--gpus", type=int, help="cluster size, a multiple of 8 (default: a busy week)")
        parser.add_argument("--days", type=float, default=7.0)
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--gpu-type", default="v100")
        parser.add_argument("--replace", action="store_true", help="delete an earlier seed_history first")
        parser.add_argument(
            "--remove",
            action="store_true",
            help="delete what an earlier seed_history wrote (its hist- jobs, shares, teams, nodes, user) and stop",
        )

    def handle(self, *args, jobs, gpus, days, seed, gpu_type, replace, remove=False, **options):
        if remove:
            with transaction.atomic():
                counts = delete_seeded()
            if not any(counts.values()):
                raise CommandError("no seeded history (hist- shares, teams or nodes) here: nothing to remove")
            self.stdout.write(
                self.style.SUCCESS(
                    f"removed the seeded history: {counts['jobs']} jobs, {counts['shares']} shares, "
                    f"{counts['teams']} teams, {counts['nodes']} nodes"
                )
            )
            return
        if jobs < 1 or not 0 < days <= 7:
            raise CommandError("--jobs must be at least 1 and --days between 0 and 7")
        gpus = gpus or default_gpus(jobs, days)
        if gpus % tracegen.NODE_GPUS:
            raise CommandError(f"--gpus must be a multiple of {tracegen.NODE_GPUS}")
        others = Node.objects.filter(gpu_type=gpu_type).exclude(name__startswith=PREFIX)
        if others.exists():
            raise CommandError(
                f"nodes not seeded here have GPU type {gpu_type} ({', '.join(others.values_list('name', flat=True)[:3])}): "
                "choose another --gpu-type, so the seeded history does not mix with their work"
            )
        seeded = (
            Share.objects.filter(name__startswith=PREFIX).exists()
            or Node.objects.filter(name__startswith=PREFIX).exists()
        )
        if seeded and not replace:
            raise CommandError(
                "a seeded history (hist- shares and nodes) is already here: --replace to seed again"
            )
        data = generate(jobs=jobs, gpus=gpus, seed=seed, gpu_type=gpu_type)
        with transaction.atomic():
            removed = delete_seeded()["jobs"] if seeded else 0
            written = self.write(data, days=days)
        self.stdout.write(
            self.style.SUCCESS(
                f"seeded {written} jobs over {days:g} days on {gpus} {gpu_type} GPUs "
                f"({len(data['nodes'])} LOST nodes, {len(data['shares'])} shares: "
                f"{', '.join(PREFIX + s['name'] for s in data['shares'])})"
                + (f"; {removed} jobs of the earlier seed deleted" if removed else "")
                + ". They are part of the live layout and the nodes page until `python manage.py "
                "seed_history --remove` deletes them."
            )
        )

    def write(self, data: dict, *, days: float) -> int:
        now = timezone.now()
        user = get_user_model().objects.create_user(username=USER, email="", is_active=False)
        user.set_unusable_password()
        user.save(update_fields=["password"])

        nodes = Node.objects.bulk_create(
            Node(
                name=PREFIX + n["name"],
                gpu_type=n["gpu_type"],
                state=NodeState.LOST,
                labels={"seeded": "history"},
            )
            for n in data["nodes"]
        )
        gpus = [
            Gpu(node=node, index=i, uuid=f"GPU-{node.name}-{i}", model="seeded")
            for node, n in zip(nodes, data["nodes"], strict=True)
            for i in range(n["gpus"])
        ]
        Gpu.objects.bulk_create(gpus, batch_size=BATCH)

        shares = {}
        for s in data["shares"]:
            team = Team.objects.create(slug=PREFIX + s["team"], name=f"History {s['team']}")
            shares[s["name"]] = Share.objects.create(
                name=PREFIX + s["name"],
                team=team,
                strategy=s["strategy"],
                borrow_limit=s["borrow_limit"],
                in_share_preemption=s["in_share_preemption"],
                description="seeded history (seed_history)",
            )
            ShareCapacity.objects.bulk_create(
                ShareCapacity(share=shares[s["name"]], gpu_type=t, max_gpus=n)
                for t, n in s["capacity"].items()
            )

        # The trace's arrivals, scaled onto the last `days` days (its last submission 10 minutes ago).
        trace = data["jobs"]
        span = max(1, max(j["submit_at"] for j in trace))
        scale = (days * 86400 - 600) / span
        start = now - timedelta(days=days)
        written = 0
        for k in range(0, len(trace), BATCH):
            batch = trace[k : k + BATCH]
            rows, runs = [], []
            for j in batch:
                submitted = start + timedelta(seconds=int(j["submit_at"] * scale))
                ends = submitted + timedelta(seconds=j["duration_s"])
                done = ends <= now
                rows.append(
                    Job(
                        share=shares[j["share"]],
                        submitted_by=user,
                        name=f"{PREFIX}{j['id']}",
                        gpu_type=j["gpu_type"],
                        gpus=j["gpus"],
                        priority=j["priority"],
                        command=["true"],
                        max_runtime_s=None if done else j["duration_s"],
                        max_preemptions=j["max_preemptions"],
                        state=JobState.SUCCEEDED if done else JobState.CANCELLED,
                        state_reason="" if done else "seeded history: it would still run",
                        submitted_at=submitted,
                        attempt_count=1 if done else 0,
                        finished_at=ends if done else now,
                        exit_code=0 if done else None,
                    )
                )
                runs.append((submitted, ends) if done else None)
            created = Job.objects.bulk_create(rows)
            if any(job.pk is None for job in created):  # a database that returns no ids
                by_name = dict(Job.objects.filter(name__in=[r.name for r in rows]).values_list("name", "pk"))
                for job in created:
                    job.pk = by_name[job.name]
            Attempt.objects.bulk_create(
                Attempt(
                    job_id=job.pk,
                    number=1,
                    state=AttemptState.ENDED,
                    outcome=Outcome.SUCCEEDED,
                    reason="ADMITTED_OWN",
                    admitted_at=run[0],
                    started_at=run[0],
                    ended_at=run[1],
                    exit_code=0,
                )
                for job, run in zip(created, runs, strict=True)
                if run is not None
            )
            written += len(created)
        return written
