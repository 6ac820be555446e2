"""Dependencies go one way: no circle of imports between the project's own files (function-level
imports count; tests and migrations aside). Each app's room is then plain: `quotas.engine` is pure and
imports no app; `jobs` tells the world that a job changed through `jobs.signals` (the scheduling side
subscribes), never by calling the pass; the Celery tasks modules are the top, which nothing below imports
(work is queued by task name)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "quotas", "jobs", "gpunodes", "bench", "directory", "notify")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            rel = path.relative_to(root)
            if "migrations" in rel.parts:
                continue
            name = ".".join(rel.with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its file (top level or inside functions)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [resolve(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, base] if base else parts)
                # `from pkg import mod` names a module; `from mod import name` the module itself.
                targets = [
                    resolve(f"{base}.{a.name}") if f"{base}.{a.name}" in modules else resolve(base)
                    for a in node.names
                ]
            else:
                continue
            graph[module].update(t for t in targets if t and t != module)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_circle_between_project_files():
    found = circles(import_graph(project_modules()))
    assert not found, "import circles (each a set of modules that import each other):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_the_engine_imports_no_app():
    graph = import_graph(project_modules())
    outside = {
        (m, t)
        for m, ts in graph.items()
        if m.startswith("quotas.engine")
        for t in ts
        if not t.startswith("quotas.engine")
    }
    assert not outside, f"the pure engine imports app modules: {sorted(outside)}"


def test_the_check_finds_a_circle(tmp_path):
    """The check itself can fail: two files of a package that import each other inside functions."""
    pkg = tmp_path / "jobs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from jobs import b\n")
    (pkg / "b.py").write_text("def g():\n    from jobs.a import f\n")
    for other in PACKAGES:
        (tmp_path / other).mkdir(exist_ok=True)
    assert circles(import_graph(project_modules(tmp_path))) == [["jobs.a", "jobs.b"]]
