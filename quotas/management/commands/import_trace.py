"""`python manage.py import_trace TRACE --out scenario.json [options]`: a job history (a CSV shaped like
the ITP trace, or Slurm's `sacct --parsable2`) as a simulator scenario, to replay with `manage.py
simulate`. The same options and answers as `python -m quotas.engine.importtrace` (bad rows counted and
reported by line; bad input: exit code 2 with a message, nothing written)."""

import sys

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Turn a job trace (ITP-shaped CSV or sacct --parsable2) into a simulator scenario."

    def run_from_argv(self, argv):
        # The importer's own parser, so both entry points take the same options and say the same.
        from quotas.engine.importtrace import main

        sys.exit(main(argv[2:], prog=f"{argv[0]} {argv[1]}"))

    def handle(self, *args, **options):  # pragma: no cover - run_from_argv is the entry point
        from quotas.engine.importtrace import main

        return str(main(list(args)))
