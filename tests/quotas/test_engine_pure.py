"""The engine is pure: it imports without Django configured and pulls in no Django at all."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = (
    "views",
    "state",
    "rules",
    "policy",
    "forecast",
    "scenario",
    "simulate",
    "report",
    "tracegen",
    "importtrace",
)


def test_engine_imports_without_django():
    code = (
        "import sys\n"
        + "".join(f"import quotas.engine.{m}\n" for m in MODULES)
        + "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith(('django.', 'rest_framework', 'celery')))\n"
        + "print(','.join(bad))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


def test_simulator_command_line_still_answers_at_the_spec_name(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "quotas.simulate", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "SCENARIO" in out.stdout.upper()
