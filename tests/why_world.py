"""A small organisation for "why it waits" (issue 37, item 3) through the API and the CLI: group research
(borrow limit 20%: 1 of its 5 a10g) holds vision-main (4 a10g) and speech (1 a10g, team vision);
language-main (LEND, 2) is under the cluster and lends. vision-main runs 4 own and 1 borrowed a10g, so
research is at its limit; speech runs its 1 own. Each has a job waiting to borrow: vision-main's value
(1 taken / 4) is above speech's (0), so vision-main is also behind 1 share with a lower value.
language-main's queued job fits its own capacity: it does not wait to borrow."""

from quotas import layout
from tests.conftest import make_share

LIMIT_WORDS = "group research may take 1 a10g from outside: 1 taken"
BEHIND_WORDS = "behind 1 share with a lower fair-share value"


def build(alice, bob, charlie, vision_share, language_share, nodes) -> dict:
    from tests.api.conftest import run, submit

    speech = make_share(vision_share.team, "speech", capacity={"a10g": 1})
    data = layout.load_live().layout.to_data()
    data["groups"] = [{"name": "research", "borrow_limit": 20}]
    for s in data["shares"]:
        if s["name"] in ("vision-main", "speech"):
            s["group"] = "research"
    planned = layout.plan(source=data, actor=alice, run_whatif=False)
    layout.apply(plan_id=planned.pk, actor=alice)
    run(submit(bob, vision_share, gpus=4, name="own-run"), nodes[0], [0, 1, 2, 3])
    run(submit(bob, vision_share, gpus=1, name="borrowed-run"), nodes[1], [0], borrowed=True)
    run(submit(bob, speech, gpus=1, name="speech-own"), nodes[1], [1])
    return {
        "vision_waits": submit(bob, vision_share, gpus=1, name="vision-waits"),
        "speech_waits": submit(bob, speech, gpus=2, name="speech-waits"),
        "small": submit(charlie, language_share, gpus=1, name="small"),
    }
