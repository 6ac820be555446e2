"""The engine compiled, where a C compiler is at hand: the same modules, built by mypyc into C extensions.

One implementation: mypyc compiles these Python files as they are (their annotations become the C
types), and Python runs the files themselves wherever no build is there, is stale or is turned off.
`python -m quotas.engine.build_native` (make engine; make run and make test try it, and go on as Python
when it cannot be made) writes the extensions under build/engine.<python's tag>/ with the digest of the
sources it compiled; `activate()`, called when quotas.engine is imported, puts that folder ahead of the
sources only while the digest still matches them, so an edited file is never shadowed by an old build.
GPUQUOTA_ENGINE=python turns the build off for a process (tests that patch the engine's insides do).

Not compiled: this module, the scenario format, the importers, the report, the forecast and tracegen
(little of a replay's time), and pyclasses (classes built on Python's own dict, Mapping and
RuntimeError: mypyc makes no native class of them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent.parent
# In dependency order (a module's bases before it); every one of them is compiled together.
MODULES = (
    "views",
    "tree",
    "timeline",
    "runtimes",
    "measures",
    "state",
    "passfields",
    "reasons",
    "placement",
    "cover",
    "victims",
    "fairshare",
    "borrowing",
    "reclaim",
    "rules",
    "policy",
    "simulate",
)
OFF = "python"  # GPUQUOTA_ENGINE's value that keeps the engine as Python


def build_dir() -> Path:
    tag = (sysconfig.get_config_var("EXT_SUFFIX") or ".so").removesuffix(".so").strip(".")
    return ROOT / "build" / f"engine.{tag}"


def sources_digest() -> str:
    """sha256 over the compiled modules' sources, in order: a build is used only for these very files."""
    h = hashlib.sha256()
    for name in MODULES:
        h.update(name.encode() + b"\0" + (PACKAGE / f"{name}.py").read_bytes() + b"\0")
    return h.hexdigest()


def _manifest(where: Path) -> dict:
    try:
        return json.loads((where / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def turned_off() -> bool:
    """GPUQUOTA_ENGINE=python: this process runs the engine's sources as Python, built or not."""
    return os.environ.get("GPUQUOTA_ENGINE", "").strip().lower() == OFF


def usable() -> Path | None:
    """The build folder, when there is a build of exactly today's sources and it is not turned off."""
    if turned_off():
        return None
    where = build_dir()
    manifest = _manifest(where)
    if not manifest or manifest.get("digest") != sources_digest():
        return None
    return where


def activate(package_path: list[str]) -> bool:
    """Put a usable build ahead of the sources on the package's path (quotas/engine/__init__.py)."""
    where = usable()
    if where is None:
        return False
    engine = str(where / "quotas" / "engine")
    if engine not in package_path:
        package_path.insert(0, engine)
    if str(where) not in sys.path:
        sys.path.append(str(where))  # (where mypyc puts a build's shared library when it makes one)
    return True


# separate=True: a C extension per module, compiled side by side on every core (73 s here, where one
# shared extension of all of them took 105 s on one core).
_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
target, paths = sys.argv[1], sys.argv[2:]
sys.argv = [sys.argv[0], "build_ext", "--build-lib", target + "/lib", "--build-temp", target + "/tmp",
            "--parallel", str({jobs})]
setup(name="gpuquota-engine", packages=[], py_modules=[],
      ext_modules=mypycify(paths, opt_level="3", separate=True, target_dir=target + "/c"))
"""


def build() -> Path:
    """Compile the modules into a fresh folder and put it in place (a failed build leaves the last one,
    which activate() ignores once the sources differ). Raises RuntimeError with the compiler's words."""
    where = build_dir()
    digest = sources_digest()
    if _manifest(where).get("digest") == digest:
        return where
    work = where.with_name(f"{where.name}.work{os.getpid()}")  # (two builds at once do not share it)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    paths = [str((PACKAGE / f"{m}.py").relative_to(ROOT)) for m in MODULES]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _SETUP.format(jobs=os.cpu_count() or 1), str(work), *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"the engine could not be compiled:\n{tail}")
    if sources_digest() != digest:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError("the engine's sources changed while it was compiled: build again")
    lib = work / "lib"
    (lib / "manifest.json").write_text(
        json.dumps(
            {"digest": digest, "modules": list(MODULES), "seconds": round(time.monotonic() - started, 1)}
        )
    )
    old = where.with_name(where.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if where.exists():
        where.rename(old)
    lib.rename(where)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return where
