"""The label protocol (topas_agents.labels): body/header parsing, validation, context labels."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topas_agents.errors import LabelError
from topas_agents.labels import BODY_KEY, HEADERS, Label, current_fields, current_label, label, parse_label

FULL = {"task_id": "t1", "stage": "plan", "agent": "pm", "workflow": "sop", "prefix_tokens": 128}


def test_body_label_parses_every_field() -> None:
    lab = parse_label({BODY_KEY: FULL})
    assert lab == Label("t1", "plan", "pm", "sop", 128)
    assert lab.to_body() == FULL


def test_headers_label_parses_and_converts_prefix_tokens() -> None:
    headers = {HEADERS[k]: str(v) for k, v in FULL.items()}
    assert parse_label({}, headers) == Label("t1", "plan", "pm", "sop", 128)
    lowered = {k.lower(): v for k, v in headers.items()}
    assert parse_label(None, lowered) == Label("t1", "plan", "pm", "sop", 128)


def test_body_wins_over_headers_whole_not_mixed() -> None:
    headers = Label("h", "hs", "ha", "hw", 7).to_headers()
    lab = parse_label({BODY_KEY: {"task_id": "b", "stage": "bs", "agent": "ba"}}, headers)
    assert lab == Label("b", "bs", "ba")  # no workflow/prefix taken from the headers


def test_unlabelled_is_none() -> None:
    assert parse_label({"model": "x"}, {"Content-Type": "application/json"}) is None
    assert parse_label({BODY_KEY: None}, {}) is None


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"stage": "s", "agent": "a"}, "task_id"),
        ({"task_id": "", "stage": "s", "agent": "a"}, "task_id"),
        ({"task_id": "  ", "stage": "s", "agent": "a"}, "task_id"),
        ({"task_id": 3, "stage": "s", "agent": "a"}, "task_id"),
        ({"task_id": "t", "stage": ["s"], "agent": "a"}, "stage"),
        ({"task_id": "t", "stage": "s"}, "agent"),
        ({"task_id": "t", "stage": "s", "agent": "a", "workflow": 1}, "workflow"),
        ({"task_id": "t", "stage": "s", "agent": "a", "prefix_tokens": -1}, "prefix_tokens"),
        ({"task_id": "t", "stage": "s", "agent": "a", "prefix_tokens": True}, "prefix_tokens"),
        ({"task_id": "t", "stage": "s", "agent": "a", "prefix_tokens": "12x"}, "prefix_tokens"),
        ({"task_id": "t", "stage": "s", "agent": "a", "prefix_tokens": "\u00b2"}, "prefix_tokens"),
        ({"task_id": "t", "stage": "s", "agent": "a", "prefix_tokens": 1.5}, "prefix_tokens"),
        ({"task_id": "t", "stage": "s", "agent": "a", "colour": "red"}, "colour"),
        ({"task_id": "x" * 300, "stage": "s", "agent": "a"}, "task_id"),
        ({"task_id": "t\n", "stage": "s", "agent": "a"}, "task_id"),  # not sendable as a header
        ({"task_id": "t", "stage": "s\x00", "agent": "a"}, "stage"),
        ({"task_id": "t", "stage": "s", "agent": "a\x85"}, "agent"),  # C1 control
        ({"task_id": " t", "stage": "s", "agent": "a"}, "task_id"),  # a header would arrive as "t"
        ({"task_id": "t", "stage": "s", "agent": "a", "workflow": "w "}, "workflow"),
    ],
)
def test_malformed_labels_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(LabelError) as info:
        parse_label({BODY_KEY: data})
    assert info.value.field == field
    assert field in str(info.value)


def test_label_must_be_an_object() -> None:
    with pytest.raises(LabelError) as info:
        parse_label({BODY_KEY: "t1"})
    assert info.value.field == BODY_KEY


def test_partial_headers_are_malformed() -> None:
    with pytest.raises(LabelError) as info:
        parse_label({}, {HEADERS["task_id"]: "t"})
    assert info.value.field == "stage"


# what a label's text fields may hold: no control characters or lone surrogates, no whitespace
# around it (an HTTP header could not carry the label as given)
ID_TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=20).filter(
    lambda s: s.strip() == s and bool(s))


@given(st.builds(Label, ID_TEXT, ID_TEXT,
                 st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True),
                 st.none() | st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
                 st.none() | st.integers(0, 10**6)))
def test_body_round_trip(lab: Label) -> None:
    if len(lab.task_id) > 256 or len(lab.stage) > 256:
        return
    assert parse_label({BODY_KEY: lab.to_body()}) == lab


@given(st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True), st.none() | st.integers(0, 10**6))
def test_header_round_trip(task_id: str, prefix: int | None) -> None:
    lab = Label(task_id, "s", "a", None, prefix)
    assert parse_label(None, lab.to_headers()) == lab


def test_context_label_nests_and_resets() -> None:
    assert current_label() is None
    with label(task_id="t", stage="s1", agent="a") as outer:
        assert current_label() == outer
        with label(stage="s2") as inner:
            assert inner == Label("t", "s2", "a")
        assert current_label() == outer
    assert current_label() is None


def test_context_label_validates() -> None:
    with pytest.raises(LabelError), label(task_id="t", stage=""):
        pass
    with label(task_id="t", stage="s", agent="a"), pytest.raises(LabelError), label(prefix_tokens=-3):
        pass
    assert current_label() is None and current_fields() == {}


def test_partial_label_is_a_task_scope_until_stage_and_agent_arrive() -> None:
    with label(task_id="t", workflow="w") as scope:
        assert scope is None and current_label() is None  # calls here go unlabelled
        assert current_fields() == {"task_id": "t", "workflow": "w"}
        with label(stage="s", agent="a") as full:
            assert full == current_label() == Label("t", "s", "a", "w")
        with label(agent="a") as still_partial:
            assert still_partial is None and current_fields() == {"task_id": "t", "workflow": "w", "agent": "a"}
    assert current_fields() == {}


async def test_context_labels_are_isolated_between_tasks() -> None:
    async def work(i: int) -> Label | None:
        with label(task_id=f"t{i}", stage="s", agent="a"):
            await asyncio.sleep(0.01 * (3 - i))
            return current_label()

    results = await asyncio.gather(*(work(i) for i in range(3)))
    assert [r.task_id for r in results] == ["t0", "t1", "t2"]
    assert current_label() is None


@pytest.mark.parametrize("body", [[], "x", 3])
def test_a_body_that_is_not_an_object_is_a_label_error(body):
    with pytest.raises(LabelError, match="must be a JSON object"):  # AttributeError before
        parse_label(body)
