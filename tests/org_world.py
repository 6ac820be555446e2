"""A small organisation for the organisation tests (web, API, CLI, metrics): group research (borrow limit
50%: 2 of its 4 a10g) holds vision-main (weight 2), group lang holds language-main (LEND, 2 a10g idle);
vision-main runs 4 own and 2 borrowed a10g and has a job waiting to borrow, so research is at its limit."""

from quotas import layout


def build(alice, bob, vision_share, language_share, nodes, *, half_life_s: int = 0):
    from tests.api.conftest import run, submit

    data = layout.load_live().layout.to_data()
    data["groups"] = [{"name": "lang"}, {"name": "research", "borrow_limit": 50}]
    for s in data["shares"]:
        s["group"] = "research" if s["name"] == "vision-main" else "lang"
        if s["name"] == "vision-main":
            s["weight"] = 2
    if half_life_s:
        data["settings"] = {"fair_share_half_life_s": half_life_s}
    planned = layout.plan(source=data, actor=alice, run_whatif=False)
    layout.apply(plan_id=planned.pk, actor=alice, **_confirm())
    own = submit(bob, vision_share, gpus=4, name="own-run")
    run(own, nodes[0], [0, 1, 2, 3])
    borrowed = submit(bob, vision_share, gpus=2, name="borrowed-run")
    run(borrowed, nodes[1], [0, 1], borrowed=True)
    waiting = submit(bob, vision_share, gpus=1, name="waits-to-borrow")
    return {"own": own, "borrowed": borrowed, "waiting": waiting}


def _confirm() -> dict:
    """apply()'s over-commit confirmation where this checkout has it (none is needed here)."""
    import inspect

    return {"overcommit_ok": True} if "overcommit_ok" in inspect.signature(layout.apply).parameters else {}
