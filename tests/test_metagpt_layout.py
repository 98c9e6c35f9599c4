"""Prompt restructuring (static prefix first) on MetaGPT 0.8.2's real prompt templates."""

from __future__ import annotations

import pytest

from topas_agents.integrations.metagpt.environment import metagpt_available, prepare_metagpt
from topas_agents.integrations.metagpt.layout import keep, restructure, static_prefix_tokens
from topas_agents.server.tokens import message_tokens

if not metagpt_available():
    pytest.skip("metagpt is not installed", allow_module_level=True)

pytestmark = pytest.mark.metagpt
SYSTEM = "You are a Engineer, named Alex, your goal is write elegant code. "


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory):
    """name -> function(variant) -> (prompt text, dynamic strings that must stay dynamic)."""
    prepare_metagpt(tmp_path_factory.mktemp("mgroot"), log_level="ERROR")
    from metagpt.actions import (
        debug_error,
        run_code,
        summarize_code,
        write_code,
        write_code_review,
        write_test,
    )
    from metagpt.actions.design_api_an import DESIGN_API_NODE
    from metagpt.actions.write_prd_an import WRITE_PRD_NODE
    from metagpt.roles.engineer import IS_PASS_PROMPT

    from topas_agents.integrations.metagpt.team_leader import tl_prompt

    def review(v: str, fn: str) -> str:
        ctx = write_code_review.PROMPT_TEMPLATE.format(context=f"## System Design\n{v}design\n", code=f"x = '{v}'",
                                                       filename=fn)
        cr = write_code_review.EXAMPLE_AND_INSTRUCTION.format(
            format_example=write_code_review.FORMAT_EXAMPLE.format(filename=fn), filename=fn)
        return f"{ctx}\n{cr}"

    def rewrite(v: str, fn: str) -> str:
        ctx = write_code_review.PROMPT_TEMPLATE.format(context=f"## Task\n{v}task\n", code=f"y = '{v}'", filename=fn)
        return f"{ctx}\n## Code Review Result\nLBTM {v}\n{write_code_review.REWRITE_CODE_TEMPLATE.format(filename=fn)}"

    return {
        "prd": lambda v: (WRITE_PRD_NODE.compile(context=f"### Original Requirements\n{v} game", schema="json",
                                                 mode="auto"), [f"{v} game"]),
        "design": lambda v: (DESIGN_API_NODE.compile(context=f'{{"Original Requirements": "{v}"}}', schema="json",
                                                     mode="auto"), [v]),
        "write_code": lambda v: (write_code.PROMPT_TEMPLATE.format(
            design=f"{v}-design", task=f"{v}-task", code="", logs="", summary_log="", feedback="",
            filename=f"{v}.py"), [f"{v}-design", f"{v}-task", f"## Code: {v}.py"]),
        "code_review": lambda v: (review(v, f"{v}.py"), [f"{v}design", f"x = '{v}'", f"`{v}.py`"]),
        "code_rewrite": lambda v: (rewrite(v, f"{v}.py"), [f"{v}task", f"LBTM {v}", f"`{v}.py`"]),
        "summarize_code": lambda v: (summarize_code.PROMPT_TEMPLATE.format(
            system_design=f"{v}-sd", task=f"{v}-t", code_blocks=f"```python\n{v}\n```",
            format_example=summarize_code.FORMAT_EXAMPLE), [f"{v}-sd", f"{v}-t"]),
        "is_pass": lambda v: (IS_PASS_PROMPT.format(context=f"summary {v}"), [f"summary {v}"]),
        "run_code": lambda v: (run_code.PROMPT_TEMPLATE.format(context=f"stderr {v}"), [f"stderr {v}"]),
        "write_test": lambda v: (write_test.PROMPT_TEMPLATE.format(
            code_to_test=f"def {v}(): pass", test_file_name=f"test_{v}.py", source_file_path=f"/s/{v}.py",
            workspace="/w"), [f"def {v}(): pass"]),
        "debug_error": lambda v: (debug_error.PROMPT_TEMPLATE.format(code=f"c_{v}", test_code=f"t_{v}",
                                                                     logs=f"log_{v}"), [f"c_{v}", f"log_{v}"]),
        "tl": lambda v: (tl_prompt(f"make {v}", "Product Manager", f"prd {v}", "Bob"), [f"make {v}", f"prd {v}"]),
    }


EXPECTED = {"prd": "context_first", "design": "context_first", "tl": "context_first", "write_code": "write_code",
            "code_review": "code_review", "code_rewrite": "code_rewrite", "summarize_code": "summarize_code",
            "is_pass": "is_pass", "run_code": "run_code", "write_test": "write_test", "debug_error": "debug_error"}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_static_text_moves_into_an_identical_system_prefix(prompts, kind):
    shaped = {}
    for variant in ("alpha", "omega"):
        text, dynamic = prompts[kind](variant)
        s = restructure([{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}])
        assert s.template == EXPECTED[kind]
        system, user = s.messages[0]["content"], s.messages[1]["content"]
        assert system.startswith(SYSTEM.rstrip())
        for d in dynamic:  # dynamic content stays in the user message, never in the prefix
            assert d in user, (kind, d)
            assert variant not in system, (kind, variant)
        # nothing is lost: every original line survives, except separators, lines naming the
        # file (<FILENAME>) and the is_pass question's "above" (now below)
        kept = set(system.splitlines()) | set(user.splitlines())
        fn = f"{variant}.py"
        missing = [ln for ln in text.splitlines() if ln.strip("-") and ln not in kept and fn not in ln
                   and not ln.startswith("Does the above log")]
        assert missing == [], (kind, missing[:3])
        assert s.prefix_tokens == message_tokens(system)
        shaped[variant] = s
    # the static prefix is byte-identical across tasks: cacheable per agent
    assert shaped["alpha"].messages[0] == shaped["omega"].messages[0]
    # and it is larger than the stock layout's prefix (the system message alone)
    text, _ = prompts[kind]("alpha")
    stock = keep([{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}])
    assert stock.template is None and stock.prefix_tokens == message_tokens(SYSTEM)
    assert shaped["alpha"].prefix_tokens > stock.prefix_tokens


def test_unknown_prompts_and_other_shapes_are_left_alone():
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "just a question"}]
    s = restructure(msgs)
    assert s.template is None and s.messages == msgs and s.messages is not msgs
    multi = msgs + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    assert restructure(multi).messages == multi
    assert static_prefix_tokens(multi) == message_tokens(SYSTEM)
    assert static_prefix_tokens([{"role": "user", "content": "x"}]) == 0
