"""The pure scheduling engine: plain data in, decisions out; no Django, no ORM, no I/O.

- policy: one scheduling pass (SEMANTICS.md rules 1-9) and the usage/lending accounting;
- forecast: queue positions and ETAs, by replaying the policy forward in virtual time;
- scenario, simulate, report, tracegen: the scenario format, the discrete-event simulator, its HTML
  report and the synthetic trace generator.

Django-side modules read the database into `policy.Snapshot`s (quotas.scheduler.load_snapshot) and
call in here; nothing in this package imports Django (tests/quotas/test_engine_pure.py checks it).
"""
