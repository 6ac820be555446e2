"""Print the Redis ACL line of a node's user (README, "Redis"), with a fresh password unless one is
given, and the REDIS_URL its agent uses."""

import secrets

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from config.redisbroker import node_acl
from gpunodes.models import node_name_validator


class Command(BaseCommand):
    help = (
        "Print `ACL SETUSER node-NAME ...` for a node's Redis user (only the commands its agent uses, on "
        "its own keys) and the REDIS_URL of its agent. Run the line on the Redis server (redis-cli)."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="the node's name (gpu_agent --name)")
        parser.add_argument("--password", help="its password (default: a fresh random one)")
        parser.add_argument("--host", default="REDIS-HOST:6379", help="host:port in the agent's REDIS_URL")

    def handle(self, *args, name, password, host, **options):
        try:
            node_name_validator(name)
        except ValidationError as e:
            raise CommandError(e.messages[0], returncode=2) from e
        if password is not None and (not password or any(c.isspace() or c in "<>@:/'\"\\" for c in password)):
            raise CommandError("--password: no spaces, '<', '>', '@', ':' or '/'", returncode=2)
        password = password or secrets.token_urlsafe(24)
        self.stdout.write(f"ACL SETUSER node-{name} {' '.join(node_acl(name, password))}\n")
        self.stdout.write(f"REDIS_URL=redis://node-{name}:{password}@{host}/0\n")
