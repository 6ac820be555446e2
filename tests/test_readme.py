"""The README says what `make run` and the tests really do: where screenshots go, the demo process
and how to leave it out."""

import shutil
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_says_where_browser_screenshots_go():
    from tests.browser import conftest

    assert Path(settings.VAR_DIR) / "screenshots" == conftest.SCREENSHOTS
    assert "`$GPUQUOTA_VAR_DIR/screenshots/` (`var/test/screenshots/` with `make test`)" in README


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_run_demo_0_leaves_the_demo_process_out_as_the_readme_says():
    assert "`demo`" in README and "`make run DEMO=0`" in README
    procfile = (ROOT / "Procfile.dev").read_text()
    assert any(line.startswith("demo:") for line in procfile.splitlines())
    dry = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "run", "DEMO=0"], cwd=ROOT, capture_output=True, text=True
    )
    assert "config.procman Procfile.dev --without demo" in dry.stdout
    dry = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "run"], cwd=ROOT, capture_output=True, text=True
    )
    assert "--without demo" not in dry.stdout
