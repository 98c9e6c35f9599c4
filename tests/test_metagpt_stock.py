"""`enable()`: a STOCK MetaGPT team (stock roles, stock Team) labelled with one call, checked
against what the embedded simulator server saw; and that every hook is undone."""

from __future__ import annotations

import pytest

from topas_agents.integrations.metagpt.environment import metagpt_available, prepare_metagpt

if not metagpt_available():
    pytest.skip("metagpt is not installed", allow_module_level=True)

pytestmark = pytest.mark.metagpt
SCALE = 400.0
SOP = ("write_prd", "write_design", "write_tasks", "write_code")
AGENTS = {"write_prd": "product_manager", "write_design": "architect", "write_tasks": "project_manager",
          "write_code": "engineer"}


@pytest.fixture(scope="module")
def mg(tmp_path_factory: pytest.TempPathFactory):
    root = prepare_metagpt(tmp_path_factory.mktemp("mgroot"), log_level="ERROR").root
    from topas_agents.integrations.metagpt import server_api, stock

    return root, stock, server_api


def _stock_team(tmp_path, name: str):
    """What a stock script builds (its own workspace so that tests do not share a project)."""
    from metagpt.config2 import Config
    from metagpt.configs.workspace_config import WorkspaceConfig
    from metagpt.context import Context
    from metagpt.roles import Architect, Engineer, ProductManager, ProjectManager
    from metagpt.team import Team

    config = Config.default()
    config.workspace = WorkspaceConfig(path=tmp_path / "ws")
    config.project_name = name
    team = Team(context=Context(config=config))
    team.hire([ProductManager(), Architect(), ProjectManager(), Engineer()])
    team.invest(10.0)
    return team


def _calls(stats: dict, task_id: str) -> list[dict]:
    return sorted((c for c in stats["calls"] if c["task_id"] == task_id), key=lambda c: c["arrival_s"])


def test_names_from_classes(mg):
    _, stock, _ = mg
    assert [stock.snake(n) for n in ("WritePRD", "QaEngineer", "WriteCode", "ProductManager")] == [
        "write_prd", "qa_engineer", "write_code", "product_manager"]


@pytest.mark.parametrize(("kwargs", "match"), [
    # before: each was accepted and failed only at Team.run or at the task-done call
    ({"base_url": "localhost:8000"}, "http:// or https://"),
    ({"base_url": 5}, "must be a string"),
    ({"workflow": ""}, "'workflow': must not be empty"),
    ({"workflow": 3}, "'workflow': must be a string"),
    ({"task_prefix": "a\nb"}, "control character"),
    ({"model": " m"}, "--model"),
    ({"names": {"agents": {}}}, "must be a StockNames"),
])
def test_enable_checks_its_arguments_first(mg, kwargs, match):
    _, stock, _ = mg
    with pytest.raises(stock.ConfigError, match=match):
        stock.enable(**kwargs)
    assert not stock._ACTIVE  # nothing was installed


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"agents": {"ProductManager": "Product Manager\n"}}, r"agents\['ProductManager'\].*control character"),
    ({"stages": {"PrepareDocuments": 5}}, r"stages\['PrepareDocuments'\].*must be a string"),
    ({"agents": [("A", "a")]}, "must be a mapping"),
])
def test_stock_names_are_label_text(mg, kwargs, match):
    _, stock, _ = mg
    with pytest.raises(stock.ConfigError, match=match):
        stock.StockNames(**kwargs)


def test_enable_is_reversible_and_exclusive(mg):
    _, stock, _ = mg
    from metagpt.configs.llm_config import LLMConfig, LLMType
    from metagpt.provider.llm_provider_registry import LLM_REGISTRY, create_llm_instance
    from metagpt.roles.role import Role
    from metagpt.team import Team

    before = (dict(LLM_REGISTRY.providers), Role.__dict__["run"], Team.__dict__["run"])
    with stock.enable(base_url="http://127.0.0.1:9/v1") as hooks:
        with pytest.raises(Exception, match="already enabled"):
            stock.enable()
        llm = create_llm_instance(LLMConfig(api_type="ollama", base_url="http://elsewhere:1", api_key="k",
                                            model="m"))
        assert isinstance(llm, stock.StockTopasLLM)  # base_url given: every api_type goes to Topas
        assert llm.config.base_url == "http://127.0.0.1:9/v1" and llm.config.api_type == LLMType.OPENAI
        assert Role.__dict__["run"] is not before[1] and Team.__dict__["run"] is not before[2]
    assert (dict(LLM_REGISTRY.providers), Role.__dict__["run"], Team.__dict__["run"]) == before
    hooks.disable()  # idempotent
    stock.enable().disable()  # a new enable works after disable


async def test_stock_team_is_labelled_per_role_and_action(mg, tmp_path):
    _, stock, server_api = mg
    from topas_agents.integrations.metagpt.patches import fast_retries

    with server_api.embedded_server(time_scale=SCALE) as server, fast_retries(1), \
            stock.enable(base_url=server.url, send_max_tokens=False) as hooks:
        team = _stock_team(tmp_path, "stock_a")
        await team.run(n_round=8, idea="Create a 2048 game.")
        team_b = _stock_team(tmp_path, "stock_b")
        await team_b.run(n_round=8, idea="Create a snake game.")
        stats = server_api.fetch_stats(server.url)
    assert len(hooks.task_ids) == 2 and len(set(hooks.task_ids)) == 2  # a fresh id per Team.run
    assert all(c["label"] is not None for c in stats["calls"])  # nothing unlabelled
    for task_id in hooks.task_ids:
        calls = _calls(stats, task_id)
        stages = list(dict.fromkeys(c["stage"] for c in calls))
        assert stages == list(SOP)
        for c in calls:
            assert c["label_source"] == "body" and c["agent"] == AGENTS[c["stage"]]
            assert c["label"]["prefix_tokens"] == c["prefix_tokens"] > 0  # static prefix first
        task = next(t for t in stats["tasks"]["items"] if t["task_id"] == task_id)
        assert task["done"] and task["done_reason"] == "explicit"  # closed when the run ended


async def test_caller_task_scope_is_used_and_left_open(mg, tmp_path):
    _, stock, server_api = mg
    from topas_agents import label
    from topas_agents.integrations.metagpt.patches import fast_retries
    from topas_agents.integrations.task import task

    with server_api.embedded_server(time_scale=SCALE) as server, fast_retries(1), \
            stock.enable(base_url=server.url, send_max_tokens=False) as hooks:
        with label(task_id="mine-1"):  # task id only: the stock roles supply stage and agent
            await _stock_team(tmp_path, "stock_c").run(n_round=8, idea="Create a todo app.")
        open_task = next(t for t in server_api.fetch_stats(server.url)["tasks"]["items"]
                         if t["task_id"] == "mine-1")
        async with task(task_id="mine-2", base_url=server.url):
            await _stock_team(tmp_path, "stock_d").run(n_round=8, idea="Create a calculator.")
        stats = server_api.fetch_stats(server.url)
    assert hooks.task_ids == []
    assert not open_task["done"]  # the caller's scope: not closed by the hook
    assert {c["stage"] for c in _calls(stats, "mine-1")} == set(SOP)
    done = next(t for t in stats["tasks"]["items"] if t["task_id"] == "mine-2")
    assert done["done_reason"] == "explicit" and {c["stage"] for c in _calls(stats, "mine-2")} == set(SOP)


async def test_a_keyed_server_gets_the_done_call_with_the_roles_key(mg, tmp_path):
    # before: the task-done call went without the key the roles use, the server answered 401,
    # and each Team.run's task stayed open until the idle timeout
    _, stock, server_api = mg
    from topas_agents.integrations.metagpt.patches import fast_retries
    from topas_agents.server import ServerConfig, start_server_in_thread

    key = "sk-stock-keyed-01"
    server = start_server_in_thread(ServerConfig(time_scale=SCALE, api_keys=(key,), task_idle_timeout_s=0.0))
    try:
        with fast_retries(1), stock.enable(base_url=server.url, api_key=key, send_max_tokens=False) as hooks:
            await _stock_team(tmp_path, "stock_keyed").run(n_round=8, idea="Create a 2048 game.")
        stats = server_api.fetch_stats(server.url, api_key=key)
    finally:
        server.stop()
    (task_id,) = hooks.task_ids
    assert {c["stage"] for c in _calls(stats, task_id)} == set(SOP)
    task = next(t for t in stats["tasks"]["items"] if t["task_id"] == task_id)
    assert task["done_reason"] == "explicit"
