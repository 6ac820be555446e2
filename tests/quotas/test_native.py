"""The engine compiled (quotas/engine/native.py) is the same engine: a replay gives the very same result
JSON compiled and as Python, a build is used only for the sources it was made from (taken from the cache
of builds only for those too), and the classes whose __init__ is written out to be compiled say their
fields again exactly."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quotas.engine import native, tracegen

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT.parent / "shared" / "scenarios"

needs_build = pytest.mark.skipif(
    native.usable() is None and not native.turned_off(),
    reason="no compiled build of these sources here (make engine; needs a C compiler)",
)


def _replay(path: Path, engine: str | None) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUQUOTA_ENGINE"}
    env["PYTHONHASHSEED"] = "0"
    if engine:
        env["GPUQUOTA_ENGINE"] = engine
    code = (
        "import sys, quotas.engine as e; from quotas.engine.simulate import main; "
        "print('ENGINE', 'compiled' if e.COMPILED else 'python', file=sys.stderr); "
        "sys.exit(main([sys.argv[1], '--out', sys.argv[2]]))"
    )
    out = path.with_suffix(f".{engine or 'default'}.out.json")
    done = subprocess.run(
        [sys.executable, "-c", code, str(path), str(out)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = next(line for line in done.stderr.splitlines() if line.startswith("ENGINE "))
    return said.split()[1], out.read_text()


def _scenarios(tmp_path: Path) -> list[Path]:
    paths = sorted(SCENARIOS.glob("*.json"))
    # A busy tracegen trace: pre-emption, borrowing, gangs, checkpoints and priorities at once.
    data = tracegen.generate(teams=6, gpus=96, jobs=1500, seed=5)
    generated = tmp_path / "tracegen.json"
    generated.write_text(json.dumps(data))
    return [*paths, generated]


@needs_build
def test_a_replay_gives_the_same_result_json_compiled_and_as_python(tmp_path):
    for path in _scenarios(tmp_path):
        copy = tmp_path / path.name
        copy.write_text(path.read_text())
        compiled, a = _replay(copy, None)
        python, b = _replay(copy, native.OFF)
        assert (compiled, python) == ("compiled", "python")
        assert a == b, f"{path.name}: the compiled engine decided otherwise than the engine as Python"


def _fake_package(tmp_path: Path, monkeypatch) -> Path:
    """An engine package of placeholder modules, with its own build folder and cache of builds."""
    package = tmp_path / "quotas" / "engine"
    package.mkdir(parents=True)
    for name in native.MODULES:
        (package / f"{name}.py").write_text(f"# {name}\n")
    monkeypatch.setattr(native, "PACKAGE", package)
    monkeypatch.setattr(native, "ROOT", tmp_path)
    monkeypatch.delenv("GPUQUOTA_ENGINE", raising=False)
    monkeypatch.setenv("GPUQUOTA_ENGINE_CACHE", str(tmp_path / "cache"))
    return package


def _compiler(calls: list[str]):
    """subprocess.run standing in for the compiler: writes an empty build where the real one would."""

    def run(argv, **kwargs):
        work = Path(argv[3])
        (work / "lib" / "quotas" / "engine").mkdir(parents=True)
        calls.append(str(work))
        return subprocess.CompletedProcess(argv, 0, "", "")

    return run


def test_a_build_of_other_sources_is_not_used(tmp_path, monkeypatch):
    package = _fake_package(tmp_path, monkeypatch)
    where = native.build_dir()
    (where / "quotas" / "engine").mkdir(parents=True)
    (where / "manifest.json").write_text(json.dumps({"digest": native.sources_digest()}))
    path: list[str] = []
    assert native.activate(path) and path == [str(where / "quotas" / "engine")]

    (package / "rules.py").write_text("# rules, edited after the build\n")
    path = []
    assert native.usable() is None and not native.activate(path) and path == []

    (where / "manifest.json").write_text(json.dumps({"digest": native.sources_digest()}))
    monkeypatch.setenv("GPUQUOTA_ENGINE", "python")
    assert native.usable() is None and not native.activate([])


def test_a_build_is_taken_from_the_cache_of_builds_for_the_same_sources_only(tmp_path, monkeypatch):
    package = _fake_package(tmp_path, monkeypatch)
    calls: list[str] = []
    monkeypatch.setattr(native.subprocess, "run", _compiler(calls))
    where = native.build()
    assert len(calls) == 1 and native.usable() == where

    # Another checkout of the same sources (here: this one's build gone) takes it without compiling.
    shutil.rmtree(where)
    assert native.usable() is None
    assert native.build() == where and len(calls) == 1
    assert native.usable() == where and "from_cache" in json.loads((where / "manifest.json").read_text())

    # Other sources are compiled, never taken from the cache; only CACHE_KEPT builds are kept.
    for n in range(native.CACHE_KEPT + 1):
        (package / "rules.py").write_text(f"# rules, edit {n}\n")
        native.build()
    assert len(calls) == 2 + native.CACHE_KEPT
    assert (
        len([p for p in (tmp_path / "cache").iterdir() if (p / "manifest.json").exists()])
        == native.CACHE_KEPT
    )

    # A cache entry that says it is of other sources is not used, even under the right key.
    (package / "rules.py").write_text("# rules, once more\n")
    entry = native._cache_entry(native.sources_digest())
    entry.mkdir(parents=True)
    (entry / "manifest.json").write_text(json.dumps({"digest": "of something else"}))
    native.build()
    assert len(calls) == 3 + native.CACHE_KEPT


def test_no_cache_of_builds_when_it_is_turned_off(tmp_path, monkeypatch):
    _fake_package(tmp_path, monkeypatch)
    monkeypatch.setenv("GPUQUOTA_ENGINE_CACHE", "off")
    calls: list[str] = []
    monkeypatch.setattr(native.subprocess, "run", _compiler(calls))
    where = native.build()
    shutil.rmtree(where)
    native.build()
    assert len(calls) == 2 and native.cache_dir() is None


def _written_out_inits() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for name in native.MODULES:
        tree = ast.parse((native.PACKAGE / f"{name}.py").read_text())
        for node in tree.body:
            if (
                isinstance(node, ast.ClassDef)
                and any(
                    getattr(getattr(d, "func", None), "id", "") == "dataclass" for d in node.decorator_list
                )
                and any(isinstance(f, ast.FunctionDef) and f.name == "__init__" for f in node.body)
            ):
                found.append((name, node))
    return found


def _as_init_takes(field: ast.AnnAssign) -> tuple[str, str, str | None]:
    """A field as a dataclass's own __init__ takes it: name, annotation, default (a default_factory's is
    None there, its annotation `| None`)."""
    name, annotation, value = field.target.id, ast.unparse(field.annotation), field.value
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
        for kw in value.keywords:
            if kw.arg == "default":
                return name, annotation, ast.unparse(kw.value)
            if kw.arg == "default_factory":
                return name, f"{annotation} | None", "None"
        return name, annotation, None
    return name, annotation, None if value is None else ast.unparse(value)


def test_a_dataclass_with_its_init_written_out_takes_its_fields_in_order_with_their_defaults():
    """Views made often (quotas/engine/views.py) write their __init__ out, to be compiled: it must say the
    dataclass's fields again, in order, with the same annotations and defaults (what a dataclass's own
    __init__ would take), and set each one."""
    classes = _written_out_inits()
    names = {node.name for _, node in classes}
    assert {"RunningView", "QueuedView", "Admission", "Preemption", "Plan", "AttemptRecord"} <= names
    for module, node in classes:
        fields = [
            _as_init_takes(f)
            for f in node.body
            if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
        ]
        init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
        args = init.args.args[1:]
        defaults = [None] * (len(args) - len(init.args.defaults)) + list(init.args.defaults)
        params = [
            (arg.arg, ast.unparse(arg.annotation), None if default is None else ast.unparse(default))
            for arg, default in zip(args, defaults, strict=True)
        ]
        assert params == fields, f"{module}.{node.name}.__init__ differs from its fields"
        sets = [
            s.targets[0].attr
            for s in init.body
            if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Attribute)
        ]
        assert sets == [n for n, _, _ in fields], f"{module}.{node.name}.__init__ does not set every field"
