import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from gpunodes.addresses import valid_address
from gpunodes.agent.main import UNSAFE_FLAG, Agent, job_uids
from gpunodes.models import node_name_validator
from quotas.models import gpu_type_validator


class Command(BaseCommand):
    help = "Run the GPU host agent: a Celery worker on the queue node.NAME plus heartbeats."

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="node name (its queue is node.NAME)")
        parser.add_argument("--fake-gpus", type=int, help="simulate N GPUs instead of asking NVML")
        parser.add_argument("--gpu-type", help="GPU type (default: from the real GPUs' model name)")
        parser.add_argument("--concurrency", type=int, default=4)
        parser.add_argument(
            "--uid-range",
            help="uids for the attempts of a root agent, one each, FIRST-LAST (default: JOB_UID_RANGE)",
        )
        parser.add_argument(
            UNSAFE_FLAG,
            action="store_true",
            dest="unsafe_run_as_self",
            help="a non-root agent runs jobs as its own user: every job can read and change what the agent "
            "can (single-user demos only; logged loudly)",
        )
        parser.add_argument(
            "--pass-env",
            default="",
            help="comma-separated names of the agent's environment variables that jobs also get "
            "(besides PATH, LANG, LC_*, TZ, TERM)",
        )
        parser.add_argument(
            "--workdir", help="directory jobs start in (default: each attempt's private directory)"
        )
        parser.add_argument(
            "--join-token",
            default=os.environ.get("NODE_JOIN_TOKEN", ""),
            help="join READY at once instead of PENDING until an admin accepts the node (default: "
            "NODE_JOIN_TOKEN)",
        )
        parser.add_argument(
            "--advertise-address",
            help="the address this node's peers reach it at: rank 0's MASTER_ADDR of a multi-node job "
            "and GPUQUOTA_HOSTS (default: the host's primary address, that of its default route)",
        )
        parser.add_argument(
            "--fake-gpu-faults",
            help="with --fake-gpus: a file of GPU faults to inject, JSON lines such as "
            '{"gpu": 2, "xid": 79} (default: fake-gpu-faults.jsonl in the agent\'s state directory)',
        )

    def handle(
        self,
        *args,
        name,
        fake_gpus,
        gpu_type,
        concurrency,
        uid_range,
        unsafe_run_as_self,
        pass_env,
        workdir,
        join_token,
        advertise_address,
        fake_gpu_faults,
        **options,
    ):
        from django.conf import settings
        from django.core.exceptions import ValidationError

        try:
            node_name_validator(name)
            if gpu_type:
                gpu_type_validator(gpu_type)
        except ValidationError as e:
            raise CommandError(e.messages[0]) from e
        if fake_gpus is not None and fake_gpus <= 0:
            raise CommandError("--fake-gpus must be at least 1")
        if advertise_address is not None and not valid_address(advertise_address):
            raise CommandError(
                f"--advertise-address must be an IP address or a host name, not {advertise_address!r}"
            )
        if fake_gpu_faults and fake_gpus is None:
            raise CommandError("--fake-gpu-faults needs --fake-gpus (real GPUs report their own faults)")
        try:
            uids = job_uids(
                uid_range=uid_range or settings.JOB_UID_RANGE, unsafe_run_as_self=unsafe_run_as_self
            )
            agent = Agent(
                name=name,
                gpu_type=gpu_type,
                fake_gpus=fake_gpus,
                uids=uids,
                workdir=workdir,
                pass_env=tuple(n.strip() for n in pass_env.split(",") if n.strip()),
                join_token=join_token,
                advertise_address=advertise_address,
                fake_gpu_faults=Path(fake_gpu_faults) if fake_gpu_faults else None,
            )
        except (ValueError, RuntimeError) as e:
            raise CommandError(str(e)) from e
        agent.run(concurrency=concurrency)
