"""The layout document (quotas.layoutdoc): read as YAML or JSON with comments, checked whole with every
problem under its path, written back in a stable order that reads back the same, and diffed field by
field. No database."""

from datetime import UTC, datetime, timedelta

import pytest
import yaml

from quotas import layoutdoc

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

DOC = """
# the layout (a comment)
format: 1
teams:
  - slug: vision
    name: Vision
    members:
      - {user: bob, role: member}
      - {user: dave, role: manager}   # a comment after a value
  - {slug: language, name: Language, members: []}
shares:
  - name: vision-main
    team: vision
    capacity: {a10g: 4, h100: 0}
  - name: language-main
    team: language
    description: "Language: the big one"
    capacity: {a10g: 2}
    strategy: LEND
"""


def parsed(text=DOC):
    data, errors = layoutdoc.read(text)
    assert not errors, errors
    layout, errors = layoutdoc.parse(data, now=NOW)
    return layout, errors


def problems(text):
    data, errors = layoutdoc.read(text)
    if errors:
        return errors
    return layoutdoc.parse(data, now=NOW)[1]


def test_it_reads_yaml_with_comments_and_fills_in_the_defaults():
    layout, errors = parsed()
    assert errors == {}
    main = layout.shares["vision-main"]
    assert main.capacity == {"a10g": 4}  # a type at 0 is no capacity
    assert (main.values["strategy"], main.values["borrow_limit"], main.values["state"]) == (
        "LEND_AND_BORROW",
        -1,
        "ENABLED",
    )
    assert layout.teams["vision"].members == (("bob", "member"), ("dave", "manager"))


def test_json_is_read_too_and_gives_the_same_layout():
    data, _ = layoutdoc.read(DOC)
    as_json, errors = layoutdoc.read(__import__("json").dumps(data))
    assert not errors and as_json == data


def test_the_written_yaml_reads_back_the_same_document_in_a_stable_order():
    layout, _ = parsed()
    data = layout.to_data()
    text = layoutdoc.render_yaml(data, notes={"vision-main": ["temporary: until Friday"]})
    assert yaml.safe_load(text) == data
    assert text == layoutdoc.render_yaml(
        layoutdoc.parse(yaml.safe_load(text), now=NOW)[0].to_data(),
        notes={"vision-main": ["temporary: until Friday"]},
    )
    assert [s["name"] for s in data["shares"]] == ["language-main", "vision-main"]  # by name
    # Every setting, but those written only where they are not the default (allowed_images).
    shown = [f for f in layoutdoc.FIELDS_BY_NAME if f not in layoutdoc.OMITTED_WHEN_DEFAULT]
    assert list(data["shares"][0]) == ["name", "team", *shown]
    assert "    # temporary: until Friday" in text


@pytest.mark.parametrize(
    "value",
    [
        "yes",
        "no",
        "on",
        "null",
        "123",
        "1e3",
        "2026-12-01",
        "a: b",
        "# x",
        "",
        " lead",
        "ünïcödé",
        "-x",
        "0x1f",
    ],
)
def test_text_that_yaml_would_read_as_something_else_is_quoted(value):
    layout, _ = parsed()
    data = layout.to_data()
    data["shares"][0]["description"] = value
    data["teams"][0]["name"] = value or "x"
    assert yaml.safe_load(layoutdoc.render_yaml(data)) == data


def test_every_problem_is_reported_at_once_each_with_its_path():
    text = """
teams:
  - {slug: vision, name: Vision, members: [{user: bob, role: boss}]}
shares:
  - {name: Bad_Name, team: vision}
  - {name: ok-1, team: nope}
  - {name: ok-2, team: vision, capacity: {a10g: -2}}
  - {name: ok-3, team: vision, strategy: RESERVE, borrow_limit: 50}
  - {name: ok-4, team: vision, capcity: {a10g: 1}}
  - {name: ok-4, team: vision}
  - {name: ok-5, team: vision, in_share_preemption: "yes please"}
"""
    errors = problems(text)
    assert errors == {
        "teams[0].members[0].role": ['must be member or manager (got "boss")'],
        "shares[0].name": ['required: use 1 to 63 lower-case letters, digits or hyphens (got "Bad_Name")'],
        "shares[1].team": ['no team "nope" in this layout\'s teams'],
        "shares[2].capacity.a10g": ["must be a whole number of GPUs, 0 or more (got -2)"],
        "shares[3].borrow_limit": [
            "only a LEND_AND_BORROW share borrows: leave borrow_limit at -1 (or out) for a RESERVE share"
        ],
        "shares[4].capcity": ['unknown field (did you mean "capacity"?)'],
        "shares[5].name": ['"ok-4" is listed twice (also shares[4])'],
        "shares[6].in_share_preemption": ['must be true or false (got "yes please")'],
    }


@pytest.mark.parametrize(
    "text, path, message",
    [
        ("teams: []\nshares: []\nextra: 1", "extra", "unknown field"),
        ("teams: []", "shares", "required"),
        ("format: 2\nteams: []\nshares: []", "format", "must be 1"),
        ("- a\n- b", "document", "a layout is a mapping"),
        ("teams: [\nshares", "document", "not valid YAML"),
        ("teams: []\nteams: []\nshares: []", "document", '"teams" is given twice'),
        ("teams: &t []\nshares: *t", "document", "aliases (*name) are not allowed"),
        ("", "document", "empty"),
        ("teams: {}\nshares: []", "teams", "must be a list"),
        (
            "teams:\n  - {slug: v, name: V}\n  - {slug: v, name: W}\nshares: []",
            "teams[1].slug",
            "listed twice",
        ),
        (
            "teams:\n  - {slug: v, name: V}\n  - {slug: w, name: V}\nshares: []",
            "teams[1].name",
            "the name of teams[0]",
        ),
        (
            "teams: [{slug: v, name: V, members: [{user: a}, {user: a}]}]\nshares: []",
            "teams[0].members[1].user",
            "twice",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, capacity: [1]}]",
            "shares[0].capacity",
            "a mapping of GPU type",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, capacity: {A10G: 1}}]",
            "shares[0].capacity.A10G",
            "not a GPU type",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, capacity: {a10g: true}}]",
            "shares[0].capacity.a10g",
            "whole number",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, borrow_limit: -2}]",
            "shares[0].borrow_limit",
            "-1 (no limit)",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, state: PAUSED}]",
            "shares[0].state",
            "ENABLED, DISABLED",
        ),
        (
            'teams: [{slug: v}]\nshares: [{name: s, team: v, description: "a\\u0007b"}]',
            "shares[0].description",
            "printable",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, until: 2026-12-04}]",
            "shares[0].until",
            "give a time too",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, until: 2026-11-30T18:00}]",
            "shares[0].until",
            "has passed",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, until: 3y}]",
            "shares[0].until",
            "a duration from now",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, until: 400d}]",
            "shares[0].until",
            "at most a year",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, previous_name: Bad!}]",
            "shares[0].previous_name",
            "lower-case",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, previous_name: a}, {name: t, team: v, previous_name: a}]",
            "shares[1].previous_name",
            "renamed by shares[0] too",
        ),
        (
            "teams: [{slug: v}]\nshares: [{name: s, team: v, previous_name: a}, {name: a, team: v}]",
            "shares[0].previous_name",
            "also listed by that name",
        ),
        ("team_part: [v]\nteams: [{slug: v}]\nshares: []", "team_part", "plan the whole layout"),
    ],
)
def test_each_bad_document_is_refused_under_its_path(text, path, message):
    errors = problems(text)
    assert path in errors, errors
    assert any(message in m for m in errors[path]), errors[path]


def test_a_billion_laughs_is_refused_before_it_is_expanded():
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}" if i > 1 else "*a"] * 9) + "]")
    errors = problems("\n".join(lines))
    assert "aliases" in errors["document"][0]


def test_a_document_nested_too_deeply_is_refused_not_a_crash():
    errors = problems("[" * 100_000 + "]" * 100_000)
    assert list(errors) == ["document"]


def test_until_takes_a_time_or_a_duration_from_now():
    assert layoutdoc.parse_until("30d", NOW) == (NOW + timedelta(days=30), None)
    assert layoutdoc.parse_until("1d12h", NOW) == (NOW + timedelta(hours=36), None)
    assert layoutdoc.parse_until("2026-12-04T18:00+00:00", NOW) == (
        datetime(2026, 12, 4, 18, tzinfo=UTC),
        None,
    )
    # a YAML timestamp is read as a datetime already; a time without a zone is the server's (UTC here)
    when, _ = layoutdoc.parse_until(datetime(2026, 12, 4, 18), NOW)
    assert when == datetime(2026, 12, 4, 18, tzinfo=UTC)


def test_the_hash_is_of_the_layout_not_of_its_spelling():
    layout, _ = parsed()
    respelled = DOC.replace("capacity: {a10g: 4, h100: 0}", "capacity:\n      a10g: 4").replace(
        "# the layout (a comment)", ""
    )
    again, _ = parsed(respelled)
    assert layout.hash() == again.hash()
    again.shares["vision-main"].values["capacity"]["a10g"] = 5
    assert layout.hash() != again.hash()


def test_the_diff_is_share_by_share_and_field_by_field():
    current, _ = parsed()
    text = (
        DOC.replace("capacity: {a10g: 4, h100: 0}", "capacity: {a10g: 2, h100: 8}\n    state: DISABLED")
        .replace("  - name: language-main", "  - name: lang\n    previous_name: language-main")
        .replace("      - {user: bob, role: member}\n", "")
        + "  - {name: audio, team: language, capacity: {a10g: 1}}\n"
    )
    target, errors = parsed(text)
    assert not errors
    changes = layoutdoc.diff(current, target)
    by_name = {c["name"]: c for c in changes}
    assert [c["name"] for c in changes] == ["vision", "audio", "lang", "vision-main"]  # teams, then shares
    assert by_name["vision"]["fields"] == [{"field": "members.bob", "before": "member", "after": None}]
    assert by_name["audio"]["labels"] == ["added"]
    assert by_name["lang"]["labels"] == ["renamed"] and by_name["lang"]["renamed_from"] == "language-main"
    assert by_name["lang"]["fields"] == [{"field": "name", "before": "language-main", "after": "lang"}]
    assert by_name["vision-main"]["labels"] == ["disabled", "changed"]
    assert by_name["vision-main"]["fields"] == [
        {"field": "capacity.a10g", "before": 4, "after": 2},
        {"field": "capacity.h100", "before": 0, "after": 8},
        {"field": "state", "before": "ENABLED", "after": "DISABLED"},
    ]
    assert layoutdoc.describe(by_name["vision-main"]) == (
        "share vision-main disabled, changed: capacity.a10g 4 → 2, capacity.h100 0 → 8, state ENABLED → DISABLED"
    )
    assert layoutdoc.diff(current, current) == []
    back = layoutdoc.diff(target, current)  # no previous_name: a new name is another share
    assert {c["name"]: c["action"] for c in back if c["kind"] == "share"} == {
        "audio": "removed",
        "lang": "removed",
        "language-main": "added",
        "vision-main": "changed",
    }


def test_a_new_share_setting_is_one_line_of_the_field_table(monkeypatch):
    """A share setting added later (here a made-up `max_jobs`): one Field, and the document reads, writes
    and diffs it (min_runtime_s came so)."""
    field = layoutdoc.Field("max_jobs", 0, layoutdoc._whole(0, "a count, 0 or more"))
    monkeypatch.setattr(layoutdoc, "SHARE_FIELDS", (*layoutdoc.SHARE_FIELDS, field))
    monkeypatch.setattr(layoutdoc, "FIELDS_BY_NAME", {f.name: f for f in layoutdoc.SHARE_FIELDS})
    monkeypatch.setattr(layoutdoc, "SHARE_KEYS", (*layoutdoc.SHARE_KEYS, "max_jobs"))
    current, _ = parsed()
    assert current.shares["vision-main"].values["max_jobs"] == 0
    target, errors = parsed(DOC.replace("capacity: {a10g: 2}", "capacity: {a10g: 2}\n    max_jobs: 600"))
    assert not errors
    [change] = layoutdoc.diff(current, target)
    assert change["fields"] == [{"field": "max_jobs", "before": 0, "after": 600}]
    assert "max_jobs: 600" in layoutdoc.render_yaml(target.to_data())
    bad = problems(DOC.replace("capacity: {a10g: 2}", "capacity: {a10g: 2}\n    max_jobs: -1"))
    assert bad == {"shares[1].max_jobs": ["must be a count, 0 or more (got -1)"]}


def test_a_shares_protection_window_is_in_the_document():
    """min_runtime_s (SEMANTICS rule 10) is a field of the document, checked against MAX_MIN_RUNTIME_S."""
    current, _ = parsed()
    assert current.shares["vision-main"].values["min_runtime_s"] == 0
    target, errors = parsed(DOC.replace("capacity: {a10g: 2}", "capacity: {a10g: 2}\n    min_runtime_s: 600"))
    assert not errors
    [change] = layoutdoc.diff(current, target)
    assert change["fields"] == [{"field": "min_runtime_s", "before": 0, "after": 600}]
    bad = problems(DOC.replace("capacity: {a10g: 2}", "capacity: {a10g: 2}\n    min_runtime_s: 86401"))
    assert bad == {"shares[1].min_runtime_s": ["must be 0 to 86,400 seconds, MAX_MIN_RUNTIME_S (got 86401)"]}
