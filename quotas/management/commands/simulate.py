"""`python manage.py simulate SCENARIO.json --out RESULT.json [--report REPORT.html]`, and
`--compare A.json B.json` / `--variant`: the same CLI as `python -m quotas.simulate`."""

import sys

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Replay a scenario through the scheduling policy in virtual time (see SCENARIO.md)."

    def run_from_argv(self, argv):
        # Hand the arguments to the simulator's own parser so both entry points behave the same.
        from quotas.engine.simulate import main

        sys.exit(main(argv[2:]))

    def handle(self, *args, **options):  # pragma: no cover - run_from_argv is the entry point
        from quotas.engine.simulate import main

        return str(main(list(args)))
