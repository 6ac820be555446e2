"""The engine compiled, where a C compiler is at hand: the same modules, built by mypyc into C extensions.

One implementation: mypyc compiles these Python files as they are (their annotations become the C
types), and Python runs the files themselves wherever no build is there, is stale or is turned off.
`python -m quotas.engine.build_native` (make engine; make run and make test try it, and go on as Python
when it cannot be made) writes the extensions under build/engine.<python's tag>/ with the digest of the
sources it compiled; `activate()`, called when quotas.engine is imported, puts that folder ahead of the
sources only while the digest still matches them, so an edited file is never shadowed by an old build.
GPUQUOTA_ENGINE=python turns the build off for a process (tests that patch the engine's insides do).
A build is also kept in a cache of builds outside the checkout (`cache_dir()`, by its digest and the
versions of mypy and its runtime library), so another checkout of the same sources on this machine (a
second clone, a CI's clean checkout) takes it in a second instead of compiling it again; a build of other
sources is never taken from it, as it is never used from build/.

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


CACHE_KEPT = 3  # builds kept in the cache (about 10 MB each); the least recently made go first


def cache_dir() -> Path | None:
    """The cache of builds: GPUQUOTA_ENGINE_CACHE, else $XDG_CACHE_HOME/gpuquota/engine or
    ~/.cache/gpuquota/engine; GPUQUOTA_ENGINE_CACHE=off: none."""
    given = os.environ.get("GPUQUOTA_ENGINE_CACHE", "").strip()
    if given.lower() == "off":
        return None
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "gpuquota" / "engine"


def _toolchain() -> str:
    """What a build was made with besides the sources: mypyc's version and its runtime library's (an
    extension needs the runtime it was compiled against)."""
    from importlib.metadata import PackageNotFoundError, version

    said = []
    for name in ("mypy", "librt"):
        try:
            said.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            said.append(f"{name} absent")
    return ", ".join(said)


def _cache_entry(digest: str) -> Path | None:
    cache = cache_dir()
    if cache is None:
        return None
    key = hashlib.sha256(f"{build_dir().name}\0{digest}\0{_toolchain()}".encode()).hexdigest()[:24]
    return cache / key


def sources_digest() -> str:
    """sha256 over the engine's sources: the compiled modules and those they read types from (every
    module of the package, by name). A build is used only for these very files."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
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
    entry = _cache_entry(digest)
    cached = _manifest(entry) if entry is not None else {}
    if entry is not None and cached.get("digest") == digest:
        try:
            shutil.copytree(entry, work / "lib")
        except OSError:
            shutil.rmtree(work / "lib", ignore_errors=True)  # (a cache it cannot read: compiled below)
        else:
            (work / "lib" / "manifest.json").write_text(json.dumps({**cached, "from_cache": str(entry)}))
            return _put_in_place(work, where)
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
            {
                "digest": digest,
                "modules": list(MODULES),
                "seconds": round(time.monotonic() - started, 1),
                "toolchain": _toolchain(),
            }
        )
    )
    if entry is not None:
        _keep(lib, entry)
    return _put_in_place(work, where)


def _put_in_place(work: Path, where: Path) -> Path:
    old = where.with_name(where.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if where.exists():
        where.rename(old)
    (work / "lib").rename(where)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return where


def _keep(lib: Path, entry: Path) -> None:
    """Copy a fresh build into the cache (whole or not at all: it is renamed into place), and let only
    the CACHE_KEPT most recent builds stay. A cache it cannot write is no error: the build is made."""
    part = entry.with_name(f"{entry.name}.part{os.getpid()}")
    try:
        shutil.rmtree(part, ignore_errors=True)
        shutil.copytree(lib, part)
        shutil.rmtree(entry, ignore_errors=True)
        part.rename(entry)
        kept = sorted(
            (p for p in entry.parent.iterdir() if (p / "manifest.json").is_file()),
            key=lambda p: (p / "manifest.json").stat().st_mtime,
            reverse=True,
        )
        for stale in kept[CACHE_KEPT:]:
            shutil.rmtree(stale, ignore_errors=True)
    except OSError:
        shutil.rmtree(part, ignore_errors=True)
