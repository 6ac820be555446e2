"""The layout through the API: GET /api/v1/layout/ (JSON, YAML), POST /api/v1/layout/plan/ (every problem
under its path, a 400, never a 500; the diff and what it does now), POST .../plans/ID/apply/ (exactly
what was planned, or a 409 when the layout changed since), versions and rollback."""

import json

import pytest
import yaml

from jobs.choices import EventKind
from jobs.models import JobEvent
from quotas.choices import ShareState
from quotas.models import AuditEntry, LayoutPlan, LayoutVersion, Share
from tests.api.conftest import client_for, run, submit
from tests.conftest import make_share

pytestmark = pytest.mark.django_db

URL = "/api/v1/layout/"


@pytest.fixture
def world(alice, bob, charlie, vision_share, language_share, nodes):
    return {"alice": alice, "bob": bob}


def export(client, fmt="yaml"):
    r = client.get(URL, {"format": fmt})
    assert r.status_code == 200, r.content
    return r.content.decode() if fmt == "yaml" else r.json()


def plan(client, document, **extra):
    return client.post(f"{URL}plan/", {"document": document, "whatif": False, **extra}, format="json")


def apply(client, plan_id, *, confirm=False):
    """confirm: the plan over-commits a GPU type, and goes ahead anyway."""
    return client.post(f"{URL}plans/{plan_id}/apply/", {"confirm": True} if confirm else None, format="json")


def without_comments(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_layout_reads_as_json_and_as_yaml_with_comments(as_alice, world):
    data = export(as_alice, "json")
    assert data["format"] == 1
    assert [t["slug"] for t in data["teams"]] == ["language", "vision"]
    vision = next(t for t in data["teams"] if t["slug"] == "vision")
    assert vision["members"] == [{"user": "bob", "role": "member"}]
    assert data["shares"][1] == {
        "name": "vision-main",
        "team": "vision",
        "description": "",
        "capacity": {"a10g": 4},
        "strategy": "LEND_AND_BORROW",
        "borrow_limit": -1,
        "in_share_preemption": False,
        "min_runtime_s": 0,
        "state": "ENABLED",
    }
    text = export(as_alice)
    assert text.startswith("# Exported ") and yaml.safe_load(text) == data
    r = as_alice.get(URL, HTTP_ACCEPT="application/yaml")
    assert r["Content-Type"].startswith("application/yaml") and yaml.safe_load(r.content) == data


def test_export_then_plan_of_the_same_file_shows_no_change(as_alice, world):
    r = plan(as_alice, export(as_alice))
    assert r.status_code == 201, r.json()
    body = r.json()
    assert (body["changed"], body["changes"], body["summary"]) == (False, [], "no change")
    r = apply(as_alice, body["id"])
    assert r.status_code == 200 and r.json()["applied"] is False and r.json()["version"] is None
    assert not LayoutVersion.objects.exists()


def test_export_edit_plan_apply_export_gives_the_edited_file(as_alice, world):
    text = export(as_alice)
    edited = (
        text.replace("    capacity: {a10g: 4}", "    capacity: {a10g: 3, h100: 2}")
        .replace("    strategy: LEND\n", "    strategy: RESERVE\n")
        .replace("      - {user: bob, role: member}", "      - {user: bob, role: manager}")
    )
    edited += '  - name: vision-batch\n    team: vision\n    description: "batch: nights"\n    capacity: {a10g: 1}\n'
    edited += (
        "    strategy: LEND\n    borrow_limit: -1\n    in_share_preemption: true\n    min_runtime_s: 600\n"
    )
    edited += "    state: ENABLED\n"
    assert edited != text
    r = plan(as_alice, edited)
    assert r.status_code == 201, r.json()
    body = r.json()
    assert (
        body["summary"]
        == "3 shares: 1 added (vision-batch), 2 changed (language-main, vision-main); 1 team: 1 changed (vision)"
    )
    r = apply(as_alice, body["id"], confirm=True)  # h100: no READY node has it
    assert r.status_code == 200, r.content
    assert r.json()["version"] == 1 and r.json()["detail"].startswith("Applied as version 1")
    after = export(as_alice)
    # The same document; the same lines too, but for the comments (and the new share in its place by name).
    assert yaml.safe_load(after) == yaml.safe_load(edited) | {"shares": yaml.safe_load(after)["shares"]}
    assert sorted(without_comments(after)) == sorted(without_comments(edited))
    assert {s["name"] for s in yaml.safe_load(after)["shares"]} == {
        "language-main",
        "vision-batch",
        "vision-main",
    }
    assert plan(as_alice, after).json()["changed"] is False


def test_a_plan_shows_the_diff_field_by_field_and_what_happens_now(as_alice, world, bob, vision_share, nodes):
    running = submit(bob, vision_share, gpus=4, name="big-run")
    run(running, nodes[0], [0, 1, 2, 3])
    queued = submit(bob, vision_share, gpus=4, name="waits")
    data = export(as_alice, "json")
    main = data["shares"][1]
    main.update(capacity={"a10g": 2}, strategy="RESERVE")  # 4 running, 2 own: borrowed; 4 queued: never
    data["shares"][0]["capacity"] = {"a10g": 40}  # language-main: beyond the 8 READY a10g
    r = plan(as_alice, data)
    assert r.status_code == 201, r.json()
    body = r.json()
    change = next(c for c in body["changes"] if c["name"] == "vision-main")
    assert change["fields"] == [
        {"field": "capacity.a10g", "before": 4, "after": 2},
        {"field": "strategy", "before": "LEND_AND_BORROW", "after": "RESERVE"},
    ]
    assert (
        change["words"]
        == "share vision-main changed: capacity.a10g 4 → 2, strategy LEND_AND_BORROW → RESERVE"
    )
    now = body["now"]
    assert [b["job"] for b in now["borrowed"]] == [running.pk] and "reclaimable" in now["borrowed"][0][
        "words"
    ]
    [never] = now["never_runnable"]
    assert (never["share"], never["gpus"], never["count"]) == ("vision-main", 4, 1)
    assert [j["job"] for j in never["jobs"]] == [queued.pk]
    assert "vision-main is RESERVE with 2 a10g: a 4-GPU job can never start there" in never["words"]
    [over] = now["overcommit"]
    assert over["words"].startswith(
        "a10g: the shares would hold 42 GPUs (now 6), 8 are READY, over-committed by 34"
    )
    # Applied (over-committed: confirmed): the queued job is told, in its own history.
    r = apply(as_alice, body["id"], confirm=True)
    assert r.json()["told"] == 1
    event = JobEvent.objects.get(job=queued, kind=EventKind.SHARE_CHANGED)
    assert event.reason.startswith("layout version 1: vision-main is RESERVE with 2 a10g")


def test_a_rename_keeps_the_share_its_jobs_and_its_history(as_alice, world, bob, vision_share):
    job = submit(bob, vision_share)
    data = export(as_alice, "json")
    data["shares"][1].update(name="vision-train", previous_name="vision-main")
    body = plan(as_alice, data).json()
    [change] = body["changes"]
    assert (change["name"], change["renamed_from"], change["labels"]) == (
        "vision-train",
        "vision-main",
        ["renamed"],
    )
    assert apply(as_alice, body["id"]).status_code == 200
    share = Share.objects.get(pk=vision_share.pk)
    assert share.name == "vision-train" and share.jobs.get() == job


def _errors(client, document):
    r = plan(client, document)
    assert r.status_code == 400, r.content
    return r.json()


def _edit(client, **change):
    data = export(client, "json")
    data["shares"][1].update(change)
    return data


@pytest.mark.parametrize(
    "edit, path, message",
    [
        (lambda d: d["shares"][1].update(colour="red"), "shares[1].colour", "unknown field"),
        (lambda d: d["shares"][1].update(team="nope"), "shares[1].team", 'no team "nope"'),
        (lambda d: d["shares"][1].update(name="Vision Main"), "shares[1].name", "lower-case letters"),
        (
            lambda d: d["shares"][1].update(capacity={"a10g": -4}),
            "shares[1].capacity.a10g",
            "0 or more (got -4)",
        ),
        (
            lambda d: d["shares"][1].update(strategy="RESERVE", borrow_limit=50),
            "shares[1].borrow_limit",
            "only a LEND_AND_BORROW share borrows",
        ),
        (
            lambda d: d["shares"].append(dict(d["shares"][1])),
            "shares[2].name",
            '"vision-main" is listed twice',
        ),
        (
            lambda d: (
                d["shares"][1].update(name="language-main", previous_name="vision-main") or d["shares"].pop(0)
            ),
            "shares[0].name",
            'a share named "language-main" exists now',
        ),
        (
            lambda d: d["teams"][1]["members"].append({"user": "zed"}),
            "teams[1].members[1].user",
            'no user named "zed"',
        ),
        (lambda d: d["shares"][1].update(until="2020-01-01T00:00"), "shares[1].until", "has passed"),
        (
            # `name` exists: the rename it asks for was ignored without a word (issue 42.6).
            lambda d: d["shares"][1].update(previous_name="nope"),
            "shares[1].previous_name",
            'no share is named "nope" now: nothing to rename',
        ),
    ],
    ids=[
        "unknown-field",
        "unknown-team",
        "bad-name",
        "negative-capacity",
        "borrow-limit-on-reserve",
        "duplicate-name",
        "rename-onto-an-existing-name",
        "unknown-user",
        "until-in-the-past",
        "previous-name-of-no-share",
    ],
)
def test_each_invalid_layout_is_a_400_with_the_path(as_alice, world, edit, path, message):
    data = export(as_alice, "json")
    edit(data)
    errors = _errors(as_alice, data)
    assert path in errors, errors
    assert any(message in m for m in errors[path]), errors[path]
    assert not LayoutPlan.objects.exists()


def test_a_share_removed_with_jobs_is_refused_and_the_plan_says_which_blocks(
    as_alice, world, bob, vision, nodes
):
    busy = make_share(vision, "busy", capacity={"a10g": 1})
    submit(bob, busy)
    Share.objects.filter(pk=busy.pk).update(state=ShareState.DISABLED)
    make_share(vision, "idle", capacity={"a10g": 1})  # ENABLED: disable it first
    make_share(vision, "drained", capacity={"a10g": 1}, state=ShareState.DISABLED)  # may go
    data = export(as_alice, "json")
    data["shares"] = [s for s in data["shares"] if s["name"] not in ("busy", "idle", "drained")]
    errors = _errors(as_alice, data)
    assert list(errors) == ["shares"]
    [busy_words, idle_words] = errors["shares"]
    assert (
        busy_words.startswith('share "busy" cannot be removed') and "1 job(s) queued or running" in busy_words
    )
    assert idle_words.startswith('share "idle" cannot be removed') and "it is ENABLED" in idle_words


def test_a_drained_share_is_removed(as_alice, world, vision):
    make_share(vision, "drained", capacity={"a10g": 1}, state=ShareState.DISABLED)
    data = export(as_alice, "json")
    data["shares"] = [s for s in data["shares"] if s["name"] != "drained"]
    body = plan(as_alice, data).json()
    assert [(c["name"], c["labels"]) for c in body["changes"]] == [("drained", ["removed"])]
    assert apply(as_alice, body["id"]).status_code == 200
    assert not Share.objects.filter(name="drained").exists()


def test_every_problem_comes_at_once(as_alice, world):
    data = export(as_alice, "json")
    data["shares"][0].update(capacity={"a10g": -1})
    data["shares"][1].update(team="nope", colour="red")
    errors = _errors(as_alice, data)
    assert set(errors) == {"shares[0].capacity.a10g", "shares[1].team", "shares[1].colour"}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"document": "x: [", "whatif": False},
        {"document": 12},
        {"document": None},
        {"document": "teams: []\nshares: []", "rollback": 1},
        {"rollback": 0},
        {"rollback": 99},
        {"document": [1, 2]},
        {"document": {"teams": "x", "shares": {}}},
        {"document": "\u0000\u0001"},
    ],
)
def test_nonsense_is_a_400_never_a_500(as_alice, world, body):
    r = as_alice.post(f"{URL}plan/", body, format="json")
    assert r.status_code == 400, r.content


def test_two_admins_plan_from_the_same_layout_and_the_second_apply_is_refused(
    as_alice, world, django_user_model
):
    erin = django_user_model.objects.create_superuser("erin", "erin@example.com", "erin-pw-123")
    as_erin = client_for(erin)
    first = plan(as_alice, _edit(as_alice, capacity={"a10g": 3})).json()
    second = plan(as_erin, _edit(as_erin, description="erin's")).json()
    assert first["base_hash"] == second["base_hash"]
    assert apply(as_alice, first["id"]).status_code == 200
    r = apply(as_erin, second["id"])
    assert r.status_code == 409
    assert r.json()["detail"].startswith(
        "The layout changed since this plan was made (version 1 was applied by alice at "
    )
    assert "nothing was applied. Plan again" in r.json()["detail"]
    assert Share.objects.get(name="vision-main").description == ""
    assert LayoutVersion.objects.count() == 1
    # A plan is applied once.
    assert apply(as_alice, first["id"]).json()["detail"] == "This plan was applied already (version 1)."


def test_a_change_outside_a_plan_makes_the_plan_stale_too(as_alice, world, vision):
    body = plan(as_alice, _edit(as_alice, capacity={"a10g": 3})).json()
    as_alice.patch("/api/v1/teams/vision/", {"name": "Vision 2"}, format="json")
    r = apply(as_alice, body["id"])
    assert r.status_code == 409 and "changed outside a plan" in r.json()["detail"]


def test_an_apply_is_one_version_and_one_audit_entry_with_the_whole_diff(as_alice, world):
    data = export(as_alice, "json")
    data["shares"][0]["capacity"] = {"a10g": 1}
    data["shares"][1]["capacity"] = {"a10g": 3}
    body = plan(as_alice, data).json()
    apply(as_alice, body["id"])
    [entry] = AuditEntry.objects.filter(object_type="layout")
    assert (entry.actor_name, entry.action, entry.object_id) == ("alice", "apply", "1")
    assert [(c["object"], c["field"], c["before"], c["after"]) for c in entry.changes] == [
        ("share language-main (changed)", "capacity.a10g", 2, 1),
        ("share vision-main (changed)", "capacity.a10g", 4, 3),
    ]
    version = as_alice.get(f"{URL}versions/1/").json()
    assert (version["actor"], version["kind"], version["summary"]) == (
        "alice",
        "apply",
        "2 shares: 2 changed (language-main, vision-main)",
    )
    assert version["document"] == export(as_alice, "json")
    assert as_alice.get(f"{URL}versions/").json()["results"][0]["number"] == 1


def test_a_rollback_to_the_layout_before_version_1(as_alice, world):
    """There was no rollback past version 1: the layout the seed, the admin or the share form had left
    was nowhere (issue 42.6). Version 1 keeps it; `rollback: 0` plans back to it."""
    before = export(as_alice, "json")
    r = as_alice.post(f"{URL}plan/", {"rollback": 0, "whatif": False}, format="json")
    assert r.status_code == 400 and r.json() == {
        "rollback": ["no layout before version 1 on record (no version yet)"]
    }
    apply(as_alice, plan(as_alice, _edit(as_alice, capacity={"a10g": 3})).json()["id"])
    apply(as_alice, plan(as_alice, _edit(as_alice, description="second")).json()["id"])
    r = as_alice.post(f"{URL}plan/", {"rollback": 0, "whatif": False}, format="json")
    assert r.status_code == 201, r.json()
    back = r.json()
    assert back["rollback_to"] == 0
    assert apply(as_alice, back["id"]).json()["version"] == 3
    assert LayoutVersion.objects.get(number=3).note == "rollback to the layout before version 1"
    assert LayoutVersion.objects.get(number=3).kind == "rollback"
    assert export(as_alice, "json") == before
    # Kept once, on version 1 only.
    assert list(LayoutVersion.objects.filter(before__isnull=False).values_list("number", flat=True)) == [1]


def test_a_rollback_is_a_plan_like_any_other(as_alice, world):
    body = plan(as_alice, _edit(as_alice, capacity={"a10g": 3})).json()
    apply(as_alice, body["id"])
    body = plan(as_alice, _edit(as_alice, capacity={"a10g": 1}, description="second")).json()
    apply(as_alice, body["id"])
    r = as_alice.post(f"{URL}plan/", {"rollback": 1, "whatif": False}, format="json")
    assert r.status_code == 201, r.json()
    back = r.json()
    assert back["rollback_to"] == 1
    assert next(c for c in back["changes"] if c["name"] == "vision-main")["fields"] == [
        {"field": "description", "before": "second", "after": ""},
        {"field": "capacity.a10g", "before": 1, "after": 3},
    ]
    assert apply(as_alice, back["id"]).json()["version"] == 3
    assert LayoutVersion.objects.get(number=3).kind == "rollback"
    assert Share.objects.get(name="vision-main").capacity_map() == {"a10g": 3}


def test_a_plan_reads_back_with_its_whatif(as_alice, world, celery_eager, bob, vision_share):
    submit(bob, vision_share, gpus=4, max_runtime_s=600)
    r = as_alice.post(f"{URL}plan/", {"document": _edit(as_alice, capacity={"a10g": 1})}, format="json")
    body = r.json()
    assert body["whatif"]["state"] == "done", body["whatif"]
    again = as_alice.get(f"{URL}plans/{body['id']}/").json()
    result = again["whatif"]["result"]
    row = next(r for r in result["rows"] if r["share"] == "vision-main")
    assert row["changed"] and row["gpu_hours_run"][0] == pytest.approx(4 * 600 / 3600, abs=0.1)
    assert result["cluster"][0]["metric"] == "utilisation over the replayed window (%)"


def test_an_unknown_format_is_406_not_404(as_alice, world):
    r = as_alice.get(URL, {"format": "xml"})
    assert r.status_code == 406 and r.json()["detail"] == "format must be json or yaml."


HUGE = "9" * 5000
TOO_LONG = f"shares[1].capacity.a10g: a number of 5,000 digits: at most {2**31 - 1} (10 digits)"


@pytest.mark.parametrize("as_text", [True, False], ids=["document-as-text", "document-as-object"])
def test_a_number_too_long_for_python_is_a_400_under_document_with_its_path(as_alice, world, as_text):
    """Python refuses to read an integer of more than 4,300 digits (a ValueError: a 500, issue 41.9),
    in the YAML/JSON text of a document as in a JSON body that holds the document itself."""
    data = export(as_alice, "json")
    data["shares"][1]["capacity"] = {"a10g": 7}
    document = json.dumps(data).replace('"a10g": 7', f'"a10g": {HUGE}')
    inner = json.dumps(document) if as_text else document
    r = as_alice.post(
        f"{URL}plan/", '{"whatif": false, "document": ' + inner + "}", content_type="application/json"
    )
    assert r.status_code == 400, r.content
    assert r.json() == {"document": [TOO_LONG]}
    assert not LayoutPlan.objects.exists()


def test_a_plan_that_over_commits_is_applied_only_when_confirmed(as_alice, world):
    """The one-share form asks "Save anyway" for an over-commit; a layout plan applied one without a
    word (issue 42.6). 8 a10g are READY; vision-main's 4 -> 10 holds 12."""
    body = plan(as_alice, _edit(as_alice, capacity={"a10g": 10})).json()
    [over] = body["now"]["overcommit"]
    assert (over["assigned"], over["was"], over["ready"]) == (12, 6, 8)
    r = apply(as_alice, body["id"])
    assert r.status_code == 400
    [message] = r.json()["confirm"]
    assert message.startswith(
        "this plan over-commits a10g: the shares would hold 12 GPUs (now 6), 8 are READY"
    )
    assert message.endswith("Nothing was applied: confirm to apply it anyway")
    assert Share.objects.get(name="vision-main").capacity_map() == {"a10g": 4}
    assert (
        as_alice.post(f"{URL}plans/{body['id']}/apply/", {"confirm": "yes"}, format="json").status_code == 400
    )
    r = as_alice.post(f"{URL}plans/{body['id']}/apply/", {"confirm": True}, format="json")
    assert r.status_code == 200 and r.json()["version"] == 1
    # An over-commit a plan leaves as it is (or lowers) needs no confirmation.
    body = plan(as_alice, _edit(as_alice, description="still over")).json()
    assert apply(as_alice, body["id"]).status_code == 200
