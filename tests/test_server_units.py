"""Units of the embedded server: tokenizer, request parsing, responders, task tracking."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.errors import (
    ConfigError,
    TaskClosedError,
    TaskWorkflowMismatchError,
    TopasError,
    UnknownStageError,
    UnknownTaskError,
)
from topas_agents.server.api_errors import ApiError, from_task_error
from topas_agents.server.config import ServerConfig, parse_policy_options
from topas_agents.server.protocol import Message, parse_chat, parse_completion
from topas_agents.server.responders import (
    EchoResponder,
    LoremResponder,
    ReplayResponder,
    ResponseContext,
    make_responder,
)
from topas_agents.server.tokens import chat_tokens, count_tokens, pieces, truncate
from topas_agents.task_tracker import StageDoneAction, TaskDoneAction, TaskTracker, ancestors
from topas_agents.workflow import load_workflow

# ---------------------------------------------------------------------------- tokens


@given(st.text())
def test_pieces_are_lossless(text: str) -> None:
    assert "".join(pieces(text)) == text


@given(st.text(), st.integers(0, 50))
def test_truncate_is_a_prefix_with_that_many_tokens(text: str, n: int) -> None:
    cut = truncate(text, n)
    assert text.startswith(cut)
    assert count_tokens(cut) == min(n, count_tokens(text))


def test_token_counts_are_plausible_and_deterministic() -> None:
    prose = "The quick brown fox jumps over the lazy dog. " * 20
    assert 3.5 <= len(prose) / count_tokens(prose) <= 5.5
    assert count_tokens("") == 0
    assert chat_tokens(["hi"]) == count_tokens("hi") + 4 + 2


# ---------------------------------------------------------------------------- protocol


def test_parse_chat_extracts_prompt_and_system_prefix() -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": "You are a careful architect."},
                                       {"role": "user", "content": [{"type": "text", "text": "design it"},
                                                                    {"type": "image_url", "image_url": {}}]}],
            "max_tokens": 20, "stream": True, "stream_options": {"include_usage": True}}
    call = parse_chat(body)
    assert call.messages[1] == Message("user", "design it")
    assert call.system_tokens == count_tokens("You are a careful architect.") + 4
    assert call.prompt_tokens > call.system_tokens
    assert (call.max_tokens, call.stream, call.include_usage) == (20, True, True)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        # an unknown part type was served as "(empty prompt)"
        ({"messages": [{"role": "user", "content": [{"type": "zzz"}]}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "9.5"}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        # sampling parameters SGLang refuses (type or range) are refused here, not served
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": -0.5}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": [1]}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "inf"}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p"),
        ({"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}, "top_p"),
        ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 2.5}, "presence_penalty"),
        ({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"messages": [{"role": "user", "content": "x"}], "seed": 1.5}, "seed"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": ["a", 3]}, "stop"),
    ],
)
def test_parse_chat_rejects_malformed_bodies(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_chat(body)
    assert info.value.status == 400 and info.value.param == param


def test_sampling_parameters_in_range_are_accepted() -> None:
    base = {"messages": [{"role": "user", "content": "x"}]}
    for extra in ({"temperature": 0}, {"temperature": 1.7, "top_p": 1}, {"top_p": 0.01, "seed": -3},
                  {"frequency_penalty": -2, "presence_penalty": 2.0}, {"stop": "END"}, {"stop": []},
                  {"temperature": None, "top_p": None, "seed": None, "stop": None},
                  {"temperature": "0.7", "seed": "3"}):  # SGLang's pydantic models take these too
        assert parse_chat(base | extra).messages[0].content == "x"
        assert parse_completion({"prompt": "x"} | extra).prompt_tokens >= 1


def test_parse_completion_prompt_forms() -> None:
    assert parse_completion({"prompt": "hello world"}).prompt_tokens == 2
    assert parse_completion({"prompt": ["hello"]}).messages[0].content == "hello"
    assert parse_completion({"prompt": [1, 2, 3, 4]}).prompt_tokens == 4
    for bad in ({}, {"prompt": ["a", "b"]}, {"prompt": 3}):
        with pytest.raises(ApiError):
            parse_completion(bad)
    with pytest.raises(ApiError):
        parse_completion([1, 2])


# ---------------------------------------------------------------------------- responders

METAGPT_PROMPT = """
## context
Create a 2048 game

-----

## format example
[CONTENT]
{
    "Language": "en_us",
    "Original Requirements": "Create a 2048 game",
    "Requirement Pool": [["P0", "The main code ..."]]
}
[/CONTENT]

## nodes: "<node>: <type>  # <instruction>"
- Language: <class 'str'>  # Provide the language used in the project.

## constraint
Format: output wrapped inside [CONTENT][/CONTENT] like format example, nothing else.
"""


def _ctx(text: str, *, system: str = "", target: int | None = None, stage: str = "s", round_: int = 0
         ) -> ResponseContext:
    msgs = ((Message("system", system),) if system else ()) + (Message("user", text),)
    return ResponseContext("chat", msgs, text, "t", stage, "a", round_, True, target)


def test_echo_returns_the_metagpt_format_example() -> None:
    out = EchoResponder().respond(_ctx(METAGPT_PROMPT))
    assert out.startswith("[CONTENT]\n") and out.endswith("\n[/CONTENT]")
    data = json.loads(out[len("[CONTENT]"):-len("[/CONTENT]")])
    assert data["Original Requirements"] == "Create a 2048 game"


def test_echo_writes_a_valid_python_program_when_code_is_asked() -> None:
    out = EchoResponder().respond(_ctx("## Code: game.py\nWrite code with triple quotes, ```python ...```"))
    code = out.split("```python\n", 1)[1].rsplit("```", 1)[0]
    compile(code, "game.py", "exec")
    assert code.startswith("# game.py")


def test_echo_summarises_other_prompts_and_can_be_extended() -> None:
    long = "word " * 100
    out = EchoResponder().respond(_ctx(long))
    assert out.startswith("Echo: word") and out.endswith("...") and len(out.split()) < 40
    custom = EchoResponder().with_rule("lgtm", lambda c: "LGTM" if "review" in c.last_user else None)
    assert custom.respond(_ctx("please review")) == "LGTM"
    assert custom.respond(_ctx("hi")) == "Echo: hi"
    assert [n for n, _ in custom.rules] == ["content_block", "metagpt", "code", "lgtm", "summary"]


def test_lorem_has_the_requested_length() -> None:
    assert count_tokens(LoremResponder().respond(_ctx("x", target=37))) == 37
    assert count_tokens(LoremResponder().respond(_ctx("x"))) == 64


def test_lorem_makes_the_tool_call_a_request_forces() -> None:
    # it answered text to tool_choice "required": an agent loop that forces a call broke
    import dataclasses

    from topas_agents.server.openai_format import ToolCall, parse_tools

    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    for choice, call in (("required", True), ({"type": "function", "function": {"name": "search"}}, True),
                         ("auto", False), ("none", False)):
        ctx = dataclasses.replace(_ctx("x", target=8), tools=parse_tools({"tools": tools, "tool_choice": choice}))
        reply = LoremResponder().respond(ctx)
        assert isinstance(reply, ToolCall) == call and (not call or reply.name == "search")


def test_replay_matches_by_stage_agent_round_then_in_order(tmp_path) -> None:
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"stage": "s", "agent": "a", "round": 1, "content": "second round"},
        {"content": "any 1"},
        {"content": "any 2"},
    ]) + "\n")
    rep = ReplayResponder.from_file(f)
    assert rep.respond(_ctx("x", round_=1)) == "second round"
    assert [rep.respond(_ctx("x", stage="z")) for _ in range(4)][:3] == ["second round", "any 1", "any 2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"content": "ok"}\n{"nope": 1}\n')
    with pytest.raises(ConfigError, match=":2:"):
        ReplayResponder.from_file(bad)
    with pytest.raises(ConfigError):
        make_responder(ServerConfig(responder="nope"))


@pytest.mark.parametrize(("content", "match"), [
    # before: RecursionError / ValueError / UnicodeDecodeError / IsADirectoryError tracebacks
    ("[" * 100_000 + "]" * 100_000 + "\n", ":1: invalid JSON: too deeply nested"),
    ('{"content": "x", "n": ' + "9" * 5000 + "}\n", ":1: invalid JSON"),
    (b"\xff\xfe\x00", "cannot read replay file"),
    (None, "cannot read replay file"),
])
def test_a_bad_replay_file_is_one_config_error(tmp_path, content, match) -> None:
    f = tmp_path / "r.jsonl"
    if content is None:
        f.mkdir()
    elif isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(content)
    with pytest.raises(ConfigError, match=match):
        ReplayResponder.from_file(f)


# ---------------------------------------------------------------------------- config


def test_config_validates() -> None:
    for kw in ({"time_scale": 0}, {"port": 70000}, {"kv_budget": 0}, {"responder": "replay"},
               {"engine": "vllm"}, {"stream_interval_s": 0}):
        with pytest.raises(ConfigError):
            ServerConfig(**kw)
    assert parse_policy_options(["a=1", "b = x"]) == (("a", "1"), ("b", "x"))
    with pytest.raises(ConfigError):
        parse_policy_options(["novalue"])


# ---------------------------------------------------------------------------- tracker


def _tracker() -> TaskTracker:
    return TaskTracker(idle_timeout_s=10.0, max_history=100)


def test_call_for_a_stage_closes_its_ancestors() -> None:
    wf = load_workflow("dag4")
    tr = _tracker()
    assert tr.commit_call("t", "s_a", wf, "dag4", False, 0.0, 0.0) == []
    tr.end_call("t", "s_a", True, 1.0, 1.0)  # requests: 1 -> s_a done
    assert tr.active["t"].stages["s_a"].done
    tr.commit_call("t", "s_b", wf, "dag4", False, 2.0, 2.0)
    acts = tr.commit_call("t", "s_d", wf, "dag4", False, 3.0, 3.0)
    # s_b still has a call in flight: it closes when that call ends; s_c was skipped
    assert acts == [StageDoneAction("t", "s_c")]
    assert tr.active["t"].stages["s_b"].closing
    assert tr.end_call("t", "s_b", True, 4.0, 4.0) == [StageDoneAction("t", "s_b")]
    acts = tr.end_call("t", "s_d", True, 5.0, 5.0)
    assert acts == [StageDoneAction("t", "s_d"), TaskDoneAction("t")]
    task = tr.finished["t"]
    assert task.done_reason == "workflow" and task.jct_s == 5.0


def test_without_a_workflow_only_explicit_done_or_idleness_finishes() -> None:
    tr = _tracker()
    tr.commit_call("t", "x", None, None, False, 0.0, 0.0)
    assert tr.end_call("t", "x", True, 1.0, 1.0) == []
    tr.commit_call("t", "y", None, None, False, 2.0, 2.0)
    assert tr.task_done("t", 2.5, 2.5) == []  # y in flight: closes when it ends
    with pytest.raises(TaskClosedError) as closed:
        tr.check_call("t", None)
    assert from_task_error(closed.value).status == 409
    assert from_task_error(closed.value).param == "topas.task_id"
    assert tr.end_call("t", "y", True, 3.0, 3.0) == [StageDoneAction("t", "x"), StageDoneAction("t", "y"),
                                                     TaskDoneAction("t")]
    assert tr.finished["t"].done_reason == "explicit"
    tr.commit_call("u", "x", None, None, False, 0.0, 0.0)
    tr.end_call("u", "x", True, 4.0, 4.0)
    assert tr.expire_idle(20.0, 13.9) == []
    assert tr.expire_idle(20.0, 14.0) == [StageDoneAction("u", "x"), TaskDoneAction("u")]
    assert tr.finished["u"].finish_s == 4.0  # the last call's finish, not the timeout


def test_unlabelled_call_is_a_single_stage_task_and_inferred_tasks_reopen() -> None:
    tr = _tracker()
    tr.commit_call("u1", "default", None, None, True, 0.0, 0.0)
    assert tr.end_call("u1", "default", True, 2.0, 2.0)[-1] == TaskDoneAction("u1")
    wf = load_workflow("chain3")
    for s in ("s1", "s2", "s3"):
        tr.commit_call("c", s, wf, "chain3", False, 0.0, 0.0)
        tr.end_call("c", s, True, 1.0, 1.0)
    assert tr.finished["c"].done_reason == "workflow"
    tr.check_call("c", "chain3")  # a retry after inference is allowed: the task reopens
    tr.commit_call("c", "s3", wf, "chain3", False, 2.0, 2.0)
    assert tr.active["c"].reopened == 1 and tr.jct_count == 1
    # its JCT leaves the recent ones too (stats' percentiles read them): only u1's is left
    assert [(c.task_id, c.jct_s) for c in tr.jcts] == [("u1", 2.0)]
    tr.end_call("c", "s3", True, 6.0, 6.0)  # concluded again: its new JCT alone counts
    assert [(c.task_id, c.jct_s) for c in tr.jcts] == [("u1", 2.0), ("c", 6.0)] and tr.jct_sum == 8.0
    tr.check_call("c", "chain3")
    tr.commit_call("c", "s3", wf, "chain3", False, 7.0, 7.0)
    with pytest.raises(TaskWorkflowMismatchError) as mismatch:
        tr.check_call("c", "other")
    err = from_task_error(mismatch.value)
    assert (err.status, err.param) == (400, "topas.workflow")
    with pytest.raises(UnknownTaskError) as unknown:
        tr.task_done("nope", 3.0, 3.0)
    assert (from_task_error(unknown.value).status, from_task_error(unknown.value).param) == (404, "task_id")
    with pytest.raises(UnknownStageError) as no_stage:
        tr.stage_done("c", "s9", 3.0, 3.0)
    assert (from_task_error(no_stage.value).status, from_task_error(no_stage.value).param) == (400, "stage")
    assert all(isinstance(e.value, TopasError) for e in (mismatch, unknown, no_stage))  # core errors, not HTTP


def test_a_task_the_client_says_failed_has_no_jct() -> None:
    # a MetaGPT run that raised sent its done call like a finished one: a short JCT
    wf = load_workflow("chain3")
    tr = _tracker()
    tr.commit_call("f", "s1", wf, "chain3", False, 0.0, 0.0)
    tr.end_call("f", "s1", True, 1.0, 1.0)
    tr.commit_call("f", "s2", wf, "chain3", False, 1.0, 1.0)
    assert tr.task_done("f", 1.5, 1.5, failed=True) == []  # s2 in flight: ends when it does
    assert tr.end_call("f", "s2", False, 2.0, 2.0)[-1] == TaskDoneAction("f")
    task = tr.finished["f"]
    assert (task.done_reason, task.jct_s, tr.failed, tr.jct_count, tr.abandoned) == ("failed", None, 1, 0, 0)
    assert tr.task_done("f", 3.0, 3.0) == [] and task.done_reason == "failed"  # a later plain done: still failed
    # concluded by inference first (every stage ran), then failed in the client: its JCT is taken back
    for s in ("s1", "s2", "s3"):
        tr.commit_call("g", s, wf, "chain3", False, 0.0, 0.0)
        tr.end_call("g", s, True, 4.0, 4.0)
    assert tr.finished["g"].done_reason == "workflow" and tr.jct_count == 1
    tr.task_done("g", 5.0, 5.0, failed=True)
    assert (tr.finished["g"].done_reason, tr.finished["g"].jct_s, tr.jct_count, tr.jct_sum, tr.failed) == (
        "failed", None, 0, 0.0, 2)
    assert [c.task_id for c in tr.jcts] == [] and tr.reopens_total == 1  # the histogram saw it: counted
    # closed like a task marked done: a further call is refused (it reopened the task)
    with pytest.raises(TaskClosedError):
        tr.check_call("f", "chain3")
    # a task that never had a finished call stays abandoned, whatever the done call says
    tr.commit_call("h", "s1", wf, "chain3", False, 0.0, 0.0)
    tr.end_call("h", "s1", False, 1.0, 1.0)
    tr.expire_idle(30.0, 30.0)
    tr.task_done("h", 31.0, 31.0, failed=True)
    assert (tr.finished["h"].done_reason, tr.abandoned, tr.failed) == ("abandoned", 1, 2)
    with pytest.raises(TaskClosedError):  # the client closed it: no reuse (a later call reopened it)
        tr.check_call("h", "chain3")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["s_a", "s_b", "s_c", "s_d"]), min_size=1, max_size=12), st.randoms())
def test_called_stages_ancestors_are_always_done(stages: list[str], rnd: random.Random) -> None:
    wf = load_workflow("dag4")
    tr = _tracker()
    in_flight: list[str] = []
    emitted: list[str] = []
    for i, s in enumerate(stages):
        if "t" in tr.finished:
            break
        emitted += [a.stage for a in tr.commit_call("t", s, wf, "dag4", False, i, i)
                    if isinstance(a, StageDoneAction)]
        in_flight.append(s)
        if rnd.random() < 0.6:
            done = in_flight.pop(rnd.randrange(len(in_flight)))
            emitted += [a.stage for a in tr.end_call("t", done, True, i, i) if isinstance(a, StageDoneAction)]
        task = tr.active.get("t") or tr.finished["t"]
        for called in set(stages[: i + 1]):
            for anc in ancestors(wf, called):
                st_ = task.stages[anc]
                assert st_.done or st_.closing
    assert len(emitted) == len(set(emitted))  # each stage is reported done at most once


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=st.text(alphabet=st.sampled_from(list("ab1 _;\n\t.Zé9x")), max_size=200), slice_chars=st.integers(1, 20))
def test_sliced_token_counting_is_exact(text, slice_chars):
    """Big prompts are counted slice by slice (GIL released between slices): same count."""
    assert count_tokens(text, slice_chars) == len(pieces(text))


def test_echo_of_a_giant_word_is_bounded():
    from topas_agents.server.responders import ResponseContext, summary_rule

    ctx = ResponseContext("chat", (), "x" * 10**6 + " tail", "t", "s", "a", 0, False, None)
    assert len(summary_rule(ctx)) < 100


def test_the_sop_without_qa_loads_by_name_where_servers_take_workflows_at_start(tmp_path):
    # `topas run sop` labels its calls metagpt-sop-noqa; SGLang (plugin) takes workflows at start
    # only, by name or path, and that name was unknown there: every call was a 400 unknown workflow
    from topas_agents.server import ServerConfig, start_server_in_thread
    from topas_agents.workflow import builtin_workflows, load_workflow

    noqa, sop = load_workflow("metagpt-sop-noqa"), load_workflow("metagpt-sop")
    assert [s.name for s in noqa.stages] == [s.name for s in sop.stages if s.name != "qa"]
    assert {a.name for a in noqa.agents} == {a.name for a in sop.agents} - {"qa_engineer"}
    assert all(noqa.stage(s.name) == s for s in sop.stages if s.name != "qa")
    assert "metagpt-sop-noqa" not in builtin_workflows()  # not a workload of its own
    handle = start_server_in_thread(ServerConfig(time_scale=1000.0, workflows=("metagpt-sop-noqa",)))
    try:
        import httpx

        assert httpx.get(f"{handle.base_url}/v1/topas/workflows").json()["workflows"] == ["metagpt-sop-noqa"]
    finally:
        handle.stop()
