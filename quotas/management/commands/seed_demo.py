"""Demo data: three teams with a share in each strategy, two fake GPU nodes, a few jobs, and a small
organisation tree (two departments, weights, a lend limit, a one-day half-life) for /organisation/.

Idempotent: everything is looked up by its natural key first, so a second run changes nothing.
"""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from gpunodes.choices import NodeState
from gpunodes.models import Node
from gpunodes.services import fake_inventory, node_register
from jobs.models import Job
from jobs.services import job_submit
from quotas.choices import Role, Strategy
from quotas.credentials import remember_credentials
from quotas.models import FairSharing, Group, Membership, Share, ShareCapacity, Team

GPU_TYPE = "a10g"
NODES = [("gpu-1", 4), ("gpu-2", 4)]
TEAMS = [
    # team name, slug, member, share name, strategy, borrow limit, in-share pre-emption, a10g capacity
    ("Vision", "vision", "bob", "vision-prod", Strategy.RESERVE, -1, True, 2),
    ("Language", "language", "carol", "language-research", Strategy.LEND_AND_BORROW, 100, False, 3),
    ("Platform", "platform", "dave", "platform-batch", Strategy.LEND, -1, False, 3),
]
# The organisation tree (README "Groups and fair sharing"): department research lends at most half of
# its idle GPUs outside and competes with weight 2 against infra's 1; inside it, language-research
# (weight 2) against vision-prod (1). Borrowing history halves every day.
GROUPS = [
    # name, parent, weight, borrow limit, lend limit
    ("research", None, 2, -1, 50),
    ("infra", None, 1, -1, -1),
]
SHARE_TREE = {
    "vision-prod": ("research", 1),
    "language-research": ("research", 2),
    "platform-batch": ("infra", 1),
}
HALF_LIFE_S = 86400
TRAIN = ["python3", "examples/train.py"]
JOBS = [
    # share, name, gpus, priority, steps
    ("language-research", "bert-finetune", 2, 0, 120),
    ("language-research", "llm-eval", 2, 0, 90),
    ("language-research", "tokenizer-sweep", 1, 0, 60),
    ("platform-batch", "nightly-render", 1, 0, 80),
    ("vision-prod", "detector-train", 2, 5, 150),
]


class Command(BaseCommand):
    help = "Create the demo teams, shares, fake nodes and jobs (idempotent)."

    @transaction.atomic
    def handle(self, *args, **options):
        User = get_user_model()
        created = []
        for node_name, gpus in NODES:
            if not Node.objects.filter(name=node_name).exists():
                # LOST until its agent registers and heartbeats: nothing is scheduled on a ghost.
                node_register(
                    name=node_name,
                    gpu_type=GPU_TYPE,
                    gpus=fake_inventory(node_name, gpus),
                    state=NodeState.LOST,
                    labels={"demo": "true"},
                )
                created.append(f"node {node_name}")
        for team_name, slug, username, share_name, strategy, limit, preempt, cap in TEAMS:
            team, new = Team.objects.get_or_create(slug=slug, defaults={"name": team_name})
            if new:
                created.append(f"team {slug}")
            user = User.objects.filter(username=username).first()
            if user is None:
                password = secrets.token_urlsafe(9)
                user = User.objects.create_user(
                    username=username, password=password, email=f"{username}@example.com"
                )
                remember_credentials(username, password, f"team {slug}")
                created.append(f"user {username}")
            Membership.objects.get_or_create(team=team, user=user, defaults={"role": Role.MANAGER})
            share, new = Share.objects.get_or_create(
                name=share_name,
                defaults={
                    "team": team,
                    "strategy": strategy,
                    "borrow_limit": limit,
                    "in_share_preemption": preempt,
                    "description": f"{team_name} demo share",
                },
            )
            if new:
                ShareCapacity.objects.create(share=share, gpu_type=GPU_TYPE, max_gpus=cap)
                created.append(f"share {share_name}")
        created += self._tree()
        for share_name, job_name, gpus, priority, steps in JOBS:
            share = Share.objects.select_related("team").get(name=share_name)
            if Job.objects.filter(share=share, name=job_name).exists():
                continue
            owner = share.team.members.order_by("pk").first()
            job_submit(
                user=owner,
                share=share,
                name=job_name,
                gpus=gpus,
                gpu_type=GPU_TYPE,
                priority=priority,
                command=[*TRAIN, "--steps", str(steps)],
                preemption_grace_s=10,
            )
            created.append(f"job {job_name}")
        if created:
            self.stdout.write(self.style.SUCCESS("seeded: " + ", ".join(created)))
        else:
            self.stdout.write("demo data already present; nothing changed")

    def _tree(self) -> list[str]:
        """The groups, once: a share is put in its group only when the group is new (an edited tree stays)."""
        created = []
        for name, parent, weight, borrow, lend in GROUPS:
            group, new = Group.objects.get_or_create(
                name=name,
                defaults={
                    "parent": Group.objects.filter(name=parent).first() if parent else None,
                    "weight": weight,
                    "borrow_limit": borrow,
                    "lend_limit": lend,
                },
            )
            if new:
                created.append(f"group {name}")
                for share_name, (group_name, share_weight) in SHARE_TREE.items():
                    if group_name == name:
                        Share.objects.filter(name=share_name, group=None).update(
                            group=group, weight=share_weight
                        )
        if not FairSharing.objects.filter(pk=1).exists():
            FairSharing.objects.create(pk=1, fair_share_half_life_s=HALF_LIFE_S)
            created.append("fair sharing (half-life 1 day)")
        return created
