from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from gpunodes.models import node_name_validator
from gpunodes.signing import CONTROL, make_credentials


class Command(BaseCommand):
    help = (
        "Make a signing key and certificate for the control side (NAME 'control') or a node. Copy the "
        "node's NAME.key and NAME.pem to its host, NAME.pem into the control side's trusted directory, "
        "and control.pem into every agent's trusted directory (README, 'Security model')."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="'control', or the node's name")
        parser.add_argument("--out", required=True, help="directory to write NAME.key (0600) and NAME.pem")
        parser.add_argument("--days", type=int, default=3650)

    def handle(self, *args, name, out, days, **options):
        if name != CONTROL:
            try:
                node_name_validator(name)
            except ValidationError as e:
                raise CommandError(e.messages[0]) from e
        key, cert = make_credentials(name, Path(out), days=days)
        self.stdout.write(f"{key}\n{cert}\n")
