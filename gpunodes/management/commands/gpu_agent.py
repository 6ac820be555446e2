from django.core.management.base import BaseCommand, CommandError

from gpunodes.agent.main import Agent
from gpunodes.models import node_name_validator
from quotas.models import gpu_type_validator


class Command(BaseCommand):
    help = "Run the GPU host agent: a Celery worker on the queue node.NAME plus heartbeats."

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="node name (its queue is node.NAME)")
        parser.add_argument("--fake-gpus", type=int, help="simulate N GPUs instead of asking NVML")
        parser.add_argument("--gpu-type", help="GPU type (default: from the real GPUs' model name)")
        parser.add_argument("--concurrency", type=int, default=4)
        parser.add_argument("--run-as", help="run jobs as this unprivileged user (when started as root)")
        parser.add_argument("--workdir", help="working directory of the jobs (default: the current one)")

    def handle(self, *args, name, fake_gpus, gpu_type, concurrency, run_as, workdir, **options):
        import os

        from django.core.exceptions import ValidationError

        try:
            node_name_validator(name)
            if gpu_type:
                gpu_type_validator(gpu_type)
        except ValidationError as e:
            raise CommandError(e.messages[0]) from e
        if fake_gpus is not None and fake_gpus <= 0:
            raise CommandError("--fake-gpus must be at least 1")
        if os.geteuid() == 0 and not run_as:
            self.stderr.write("warning: running jobs as root; pass --run-as USER to drop privileges")
        try:
            agent = Agent(name=name, gpu_type=gpu_type, fake_gpus=fake_gpus, run_as=run_as, workdir=workdir)
        except (ValueError, RuntimeError) as e:
            raise CommandError(str(e)) from e
        agent.run(concurrency=concurrency)
