"""TopasOpenAILLM (labels, static prefix, max_tokens, records), the provider registry hook
and the retry patch, against a loopback HTTP server that records requests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from topas_agents import label
from topas_agents.integrations.metagpt.environment import metagpt_available, prepare_metagpt
from topas_agents.server.tokens import message_tokens

if not metagpt_available():
    pytest.skip("metagpt is not installed", allow_module_level=True)

pytestmark = pytest.mark.metagpt
PRD = ("\n## context\nmake a {v} game\n\n-----\n\n## format example\n[CONTENT]\n{{\"a\": 1}}\n[/CONTENT]\n\n"
       "## constraint\nFormat: output wrapped inside [CONTENT][/CONTENT] like format example, nothing else.\n")


@pytest.fixture(scope="module")
def mg(tmp_path_factory: pytest.TempPathFactory):
    root = prepare_metagpt(tmp_path_factory.mktemp("mgroot"), log_level="ERROR").root
    from topas_agents.integrations.metagpt import context, provider, recorder

    return root, context, provider, recorder


@pytest.fixture()
def server() -> Iterator[tuple[str, list[tuple[dict, dict]]]]:
    seen: list[tuple[dict, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
            data = json.dumps({
                "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def _llm(mg, url, **options):
    root, context, provider, recorder = mg
    rec = recorder.CallRecorder(clock=iter(range(100)).__next__)
    llm = provider.TopasOpenAILLM(context.llm_config(url), provider.ProviderOptions(**options), rec)
    llm.system_prompt = "You are a Product Manager, named Alice. "
    return llm, rec


async def test_calls_carry_the_label_and_lead_with_the_static_prefix(mg, server):
    url, seen = server
    llm, rec = _llm(mg, url, send_max_tokens=False, client_max_retries=0)
    assert llm.aclient.max_retries == 0
    with label(task_id="t1", stage="write_prd", agent="product_manager", workflow="metagpt-sop"):
        assert await llm.aask(PRD.format(v="snake")) == "ok"
        await llm.aask(PRD.format(v="tank"))
    (h1, b1), (h2, b2) = seen
    system = b1["messages"][0]["content"]
    assert system.startswith("You are a Product Manager") and "## format example" in system
    assert b1["messages"][1]["content"] == "## context\nmake a snake game\n"
    assert b2["messages"][0] == b1["messages"][0]  # same static prefix for another task's prompt
    assert "max_tokens" not in b1 and not b1.get("stream")
    prefix = message_tokens(system)
    assert b1["topas"] == {"task_id": "t1", "stage": "write_prd", "agent": "product_manager",
                           "workflow": "metagpt-sop", "prefix_tokens": prefix}
    assert h1["x-topas-task-id"] == "t1" and h1["x-topas-stage"] == "write_prd"
    assert h1["x-topas-agent"] == "product_manager" and h1["x-topas-prefix-tokens"] == str(prefix)
    r0, r1 = rec.records
    assert (r0.round, r1.round) == (0, 1) and r0.template == "context_first"
    assert (r0.prefix_tokens, r0.input_tokens, r0.output_tokens) == (prefix, 1000 - prefix, 20)
    assert (r0.t_submit, r0.t_done) == (0, 1)


async def test_stock_layout_and_max_tokens_when_restructuring_is_off(mg, server):
    url, seen = server
    llm, rec = _llm(mg, url, restructure=False)
    with label(task_id="t2", stage="write_prd", agent="product_manager"):
        await llm.aask(PRD.format(v="snake"))
    (_, body), = seen
    assert body["messages"][1]["content"] == PRD.format(v="snake")  # untouched
    assert body["max_tokens"] == 4096
    assert body["topas"]["prefix_tokens"] == message_tokens("You are a Product Manager, named Alice. ")
    assert rec.records[0].template is None


async def test_no_label_in_force_means_an_unlabelled_call(mg, server):
    url, seen = server
    llm, rec = _llm(mg, url)
    await llm.aask("hello")
    (headers, body), = seen
    assert "topas" not in body and not any(k.startswith("x-topas") for k in headers)
    assert rec.records == [] and rec.unlabelled == 1


def test_registry_hook_is_explicit_and_reversible(mg):
    from metagpt.configs.llm_config import LLMConfig
    from metagpt.provider.llm_provider_registry import create_llm_instance
    from metagpt.provider.openai_api import OpenAILLM

    _, _, provider, _ = mg
    cfg = LLMConfig(api_type="openai", base_url="http://127.0.0.1:9/v1", api_key="sk-x", model="m")
    assert type(create_llm_instance(cfg)) is OpenAILLM  # importing our modules changed nothing
    with provider.topas_provider():
        assert type(create_llm_instance(cfg)) is provider.TopasOpenAILLM
    assert type(create_llm_instance(cfg)) is OpenAILLM


def test_fast_retries_is_scoped_and_reentrant(mg):
    from metagpt.actions.action_node import ActionNode
    from tenacity.stop import stop_after_attempt

    from topas_agents.errors import ConfigError
    from topas_agents.integrations.metagpt.patches import fast_retries

    retrying = ActionNode._aask_v1.retry
    stock = (retrying.stop, retrying.wait)
    with fast_retries(2, 0.0):
        assert isinstance(retrying.stop, stop_after_attempt) and retrying.stop.max_attempt_number == 2
        with fast_retries(2, 0.0):
            pass
        assert retrying.stop.max_attempt_number == 2  # inner exit does not restore early
        with pytest.raises(ConfigError, match="active"), fast_retries(3, 0.0):
            pass
    assert (retrying.stop, retrying.wait) == stock
