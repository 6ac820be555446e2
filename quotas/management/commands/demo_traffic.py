"""Keep the demo cluster busy so that `make run` shows borrowing, reclaim and in-share pre-emption.

A fixed cycle of waves, one every `--every` seconds, submitted as each team's demo user through the same
service as the API: the LEND_AND_BORROW share over-submits and borrows idle GPUs, the LEND share's owner
comes back and reclaims them, the RESERVE share (in-share pre-emption on) sends urgent work that pre-empts
its own lower-priority job. A share that already has work waiting is skipped, so the queue stays short.
"""

import time

from django.core.management.base import BaseCommand

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_submit
from quotas.models import Share

TRAIN = ["python3", "examples/train.py", "--step-seconds", "0.5"]
# (share, job name, gpus, priority, steps)
WAVES = [
    [("language-research", "sweep", 2, 0, 120), ("language-research", "sweep", 2, 0, 120)],
    [("platform-batch", "render", 2, 0, 60)],
    [("vision-prod", "urgent-eval", 2, 50, 40)],
    [("language-research", "finetune", 2, 0, 90)],
]


class Command(BaseCommand):
    help = "Submit demo jobs in waves that exercise lending, borrowing, reclaim and pre-emption."

    def add_arguments(self, parser):
        parser.add_argument("--every", type=float, default=25.0, help="seconds between waves")
        parser.add_argument("--waves", type=int, default=0, help="stop after this many waves (0: forever)")
        parser.add_argument("--delay", type=float, default=15.0, help="seconds before the first wave")

    def handle(self, *args, every: float, waves: int, delay: float, **options):
        time.sleep(delay)
        done = 0
        while not waves or done < waves:
            for share_name, name, gpus, priority, steps in WAVES[done % len(WAVES)]:
                self._submit(share_name, f"{name}-{done + 1}", gpus, priority, steps)
            done += 1
            if not waves or done < waves:
                time.sleep(every)

    def _submit(self, share_name: str, name: str, gpus: int, priority: int, steps: int) -> None:
        share = Share.objects.select_related("team").filter(name=share_name).first()
        if share is None or not share.is_enabled:
            return
        if Job.objects.filter(share=share, state=JobState.QUEUED).count() >= 2:
            return  # plenty waiting already
        user = share.team.members.order_by("pk").first()
        if user is None:
            return
        job = job_submit(
            user=user,
            share=share,
            name=name,
            gpus=gpus,
            gpu_type="a10g",
            priority=priority,
            command=[*TRAIN, "--steps", str(steps)],
            preemption_grace_s=10,
        )
        self.stdout.write(f"demo: submitted job {job.pk} {name} to {share_name} as {user}")
