"""The GPU smoke's CPU-testable parts: the offline tiny-model builder (loaded by transformers
and by SGLang's own ModelConfig) and the smoke client's argument handling and call plan."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.sglang
pytest.importorskip("sglang")

from topas_agents.labels import Label  # noqa: E402
from topas_agents.server.sglang import make_tiny_model, smoke_client  # noqa: E402
from topas_agents.workflow import load_workflow  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: Any) -> Any:
    return make_tiny_model.build(tmp_path_factory.mktemp("tiny") / "model")


def test_tiny_model_dir_loads_in_transformers_and_sglang(tiny: Any) -> None:
    from sglang.srt.configs.model_config import ModelConfig
    from transformers import AutoTokenizer

    assert sorted(p.name for p in tiny.iterdir()) == [
        "chat_template.jinja", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    cfg = json.loads((tiny / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(tiny)
    ids = tok.apply_chat_template([{"role": "system", "content": "You plan."}, {"role": "user", "content": "hi"}],
                                  add_generation_prompt=True, tokenize=True)["input_ids"]
    assert max(ids) < cfg["vocab_size"] == 512 and ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert cfg["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>")
    model = ModelConfig(str(tiny))  # what SGLang's scheduler builds first
    assert model.hf_config.architectures == ["Qwen2ForCausalLM"] and model.context_len == 8192
    assert model.head_dim == 64 and model.num_key_value_heads == 2


def test_tiny_model_cli_and_limits(tmp_path: Any, capsys: Any) -> None:
    assert make_tiny_model.main([str(tmp_path / "m"), "--vocab", "400", "--context", "2048"]) == 0
    assert json.loads((tmp_path / "m" / "config.json").read_text())["max_position_embeddings"] == 2048
    with pytest.raises(ValueError, match="vocab"):
        make_tiny_model.build(tmp_path / "x", vocab=100)


def test_smoke_client_arguments(capsys: Any) -> None:
    args = smoke_client.parse_args(["--base-url", "http://h:1/v1"])
    assert (args.workflow, args.tasks, args.max_tokens, args.scale, args.model) == ("chain3", 2, 32, 0.25, None)
    for bad in (["--tasks", "0"], ["--scale", "1.5"], ["--max-tokens", "0"], ["--timeout", "0"]):
        with pytest.raises(SystemExit):
            smoke_client.parse_args(["--base-url", "http://h:1/v1", *bad])
        assert bad[0] in capsys.readouterr().err
    with pytest.raises(SystemExit):
        smoke_client.parse_args(["--base-url", "h:1"])
    with pytest.raises(SystemExit):
        smoke_client.parse_args([])
    assert "--base-url" in capsys.readouterr().err


def test_smoke_client_plans_labelled_calls(tiny: Any) -> None:
    from transformers import AutoTokenizer

    args = smoke_client.parse_args(["--base-url", "http://h:1/v1", "--max-tokens", "8", "--scale", "0.1"])
    wf = load_workflow("chain3")
    tok = AutoTokenizer.from_pretrained(tiny)
    p0, p1 = (smoke_client.plan_calls(wf, f"task{i}", args, tok) for i in range(2))
    assert list(p0) == ["s1", "s2", "s3"] and all(len(calls) == 1 for calls in p0.values())
    c0, c1 = p0["s2"][0], p1["s2"][0]
    assert c0.label == Label("task0", "s2", "b", "chain3", c0.label.prefix_tokens) and c0.max_tokens == 8
    assert c0.messages[0] == c1.messages[0] and c0.messages[1] != c1.messages[1]  # shared prefix only
    full = tok.apply_chat_template(list(c0.messages), tokenize=True)["input_ids"]
    other = tok.apply_chat_template(list(c1.messages), tokenize=True)["input_ids"]
    shared = next(i for i, (a, b) in enumerate(zip(full, other, strict=False)) if a != b)
    assert c0.label.prefix_tokens <= shared  # the labelled prefix is really shared
    assert smoke_client.plan_calls(wf, "t", args)["s1"][0].label.prefix_tokens is None  # no tokenizer
