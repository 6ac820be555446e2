"""Compile the engine (quotas/engine/native.py says how and why): `python -m quotas.engine.build_native
[build [--optional] | status | clean]`."""

from __future__ import annotations

import argparse
import shutil
import sys

from quotas.engine.native import ROOT, _manifest, build, build_dir, turned_off, usable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m quotas.engine.build_native", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser("build", help="compile the engine (needs a C compiler and mypy)")
    b.add_argument(
        "--optional",
        action="store_true",
        help="where it cannot be compiled, say why and exit 0: the engine then runs as Python",
    )
    sub.add_parser("status", help="say whether this checkout's engine runs compiled")
    sub.add_parser("clean", help="remove this checkout's build (the cache of builds stays: native.cache_dir)")
    args = parser.parse_args(argv)
    if args.command in (None, "build"):
        try:
            where = build()
        except (RuntimeError, OSError) as exc:
            print(f"{exc}\nThe engine runs as Python (the same decisions, slower).", file=sys.stderr)
            return 0 if getattr(args, "optional", False) else 1
        manifest = _manifest(where)
        how = (
            f"taken from the cache of builds, {manifest['from_cache']}"
            if manifest.get("from_cache")
            else f"{manifest.get('seconds', 0)} s to build"
        )
        print(f"engine compiled: {where.relative_to(ROOT)} ({how})")
        return 0
    if args.command == "clean":
        shutil.rmtree(build_dir(), ignore_errors=True)
        print(f"removed {build_dir().relative_to(ROOT)}")
        return 0
    where = usable()
    if where is not None:
        print(f"compiled: {where.relative_to(ROOT)}")
    elif turned_off():
        print("python: GPUQUOTA_ENGINE=python")
    elif _manifest(build_dir()):
        print("python: the build is of other sources (make engine)")
    else:
        print("python: not built (make engine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
