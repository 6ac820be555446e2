"""The pure scheduling engine: plain data in, decisions out; no Django, no ORM, no I/O.

- policy: `plan(snapshot)` (one scheduling pass, SEMANTICS.md rules 1-11) and `Engine` (the same pass
  state kept between passes and told each change), with its parts: views (the plain data in and out, and
  the usage/lending accounting), tree (the organisation tree: GroupSpec, validate_tree, nets, the
  decayed history, organisation_view), state (a GPU type's pass state) and rules (one pass over it, made
  of cover, placement, victims, reclaim, borrowing, fairshare and reasons);
- forecast: queue positions and ETAs, by replaying the policy forward in virtual time;
- scenario, simulate, report, tracegen, importtrace: the scenario format, the discrete-event
  simulator, its HTML report, the synthetic trace generator, and the importer of real job histories
  (an ITP-shaped CSV, Slurm's sacct) into scenarios.

Django-side modules read the database into `policy.Snapshot`s (quotas.scheduler.load_snapshot) and
call in here; nothing in this package imports Django (tests/quotas/test_engine_pure.py checks it).
"""

from quotas.engine import native as _native

# The compiled build of these very sources, where there is one (native.py); else the sources run as Python.
COMPILED = _native.activate(__path__)
