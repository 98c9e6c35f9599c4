"""Scheduler side of the SGLang adapter on real SGLang objects (CPU): Snapshot construction,
admission order, prefix pinning, preemption, retraction order, LPM beyond 128 waiting, and
the real policies end to end."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("published", "no_adapter")]
pytest.importorskip("sglang")

from test_sglang_fixtures import (  # noqa: E402
    NOOP,
    AddReqResult,
    Decision,
    ScheduleBatch,
    ScriptedPolicy,
    World,
    applied_hooks,
    finish,
    make_adapter,
    make_req,
    no_adapter,  # noqa: F401 (fixture, used by pytestmark)
    published,  # noqa: F401 (fixture, used by pytestmark)
    sglang_prefill,
)

from topas_agents.labels import Label  # noqa: E402
from topas_agents.policies import make_policy  # noqa: E402
from topas_agents.server.sglang import plugin  # noqa: E402
from topas_agents.server.sglang.labels_http import encode_label  # noqa: E402

PREFIX = {"a": list(range(1000, 1032)), "b": list(range(2000, 2032)), "c": list(range(3000, 3032))}


def key(task: str, stage: str, agent: str, prefix: int | None = 32, workflow: str | None = None) -> str:
    return encode_label(Label(task, stage, agent, workflow, prefix))


def labelled(rid: str, task: str, agent: str, stage: str = "s1", extra: int = 8, max_new: int = 8,
             workflow: str | None = None) -> Any:
    ids = PREFIX[agent] + [10_000 + hash((rid, i)) % 5000 for i in range(extra)]
    return make_req(rid, ids, max_new=max_new, routing_key=key(task, stage, agent, workflow=workflow))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def arrive(adapter: Any, world: World, *reqs: Any) -> None:
    for r in reqs:  # what the _create_generation_req AFTER hook + _add_request_to_queue do
        adapter.on_new_request(r)
        world.sched._add_request_to_queue(r)


def step(adapter: Any, world: World, **kw: Any) -> list[Any]:
    return adapter.on_prefill(sglang_prefill(world, **kw), world.sched, world.running)


def test_snapshot_from_real_reqs_and_radix_tree() -> None:
    world, policy, clock = World(), ScriptedPolicy(NOOP), Clock()
    adapter = make_adapter(policy, clock=clock)
    r1, r2 = labelled("r1", "t1", "a"), labelled("r2", "t2", "b", extra=12, max_new=16)
    arrive(adapter, world, r1, r2)
    assert r1.topas_label == Label("t1", "s1", "a", None, 32)
    clock.t = 1.5
    assert step(adapter, world) == []  # NOOP: SGLang admits nothing although both fit
    snap = policy.snaps[0]
    assert snap.now == 1.5 and snap.kv_budget == 2048 and snap.running == ()
    v1, v2 = snap.waiting
    assert (v1.rid, v1.task_id, v1.stage, v1.agent, v1.prefix_tokens, v1.input_tokens, v1.max_new_tokens) == \
        ("r1", "t1", "s1", "a", 32, 8, 8)
    assert (v2.prefix_tokens, v2.input_tokens, v2.max_new_tokens, v2.generated, v2.round) == (32, 12, 16, 0, 0)
    assert {p.agent: (p.tokens, p.location, p.running) for p in snap.prefixes} == \
        {"a": (32, "none", 0), "b": (32, "none", 0)}
    assert {t.task_id: t.active_stages for t in snap.tasks} == {"t1": (("s1", 0.0),), "t2": (("s1", 0.0),)}
    assert [r.rid for r in world.sched.waiting_queue] == ["r1", "r2"]


def test_admit_order_is_applied_to_the_real_waiting_queue() -> None:
    # LPM inside SGLang would put r3 (longest cached prefix) first; the decision says r2, r1.
    world = World(schedule_policy="lpm")
    world.insert(PREFIX["c"] + [1, 2, 3])
    policy = ScriptedPolicy(Decision(admit=("r2", "r1")))
    adapter = make_adapter(policy)
    reqs = [labelled("r1", "t1", "a"), labelled("r2", "t2", "b"), labelled("r3", "t3", "c")]
    arrive(adapter, world, *reqs)
    plugin.install(adapter)
    with applied_hooks([(plugin.PRIORITY_TARGET, plugin.after_calc_priority, "AFTER")]):
        ran = plugin.around_prefill(sglang_prefill(world), world.sched, world.running)
    assert [r.rid for r in ran] == ["r2", "r1"]  # PrefillAdder's can_run_list, in decision order
    assert [r.rid for r in world.running.reqs] == ["r2", "r1"]
    assert [r.rid for r in world.sched.waiting_queue] == ["r3"]


def test_sglang_limits_still_apply_head_of_line() -> None:
    world = World(size=128)  # the policy's model thinks there is room: SGLang knows better
    adapter = make_adapter(ScriptedPolicy(Decision(admit=("big", "small"))), kv_budget=None)
    adapter._kv_pool = 10**6
    big = make_req("big", range(1, 200), routing_key=key("t1", "s1", "a", prefix=None))
    small = make_req("small", range(300, 310), routing_key=key("t2", "s1", "b", prefix=None))
    arrive(adapter, world, big, small)
    assert step(adapter, world) == []  # big does not fit the real pool: SGLang stops there
    assert [r.rid for r in world.sched.waiting_queue] == ["big", "small"]


def test_prefix_pin_survives_eviction_until_prefix_out() -> None:
    world, policy = World(), ScriptedPolicy()
    adapter = make_adapter(policy)
    world.insert(PREFIX["a"] + [7, 7, 7])  # an earlier request of agent a left its prompt cached
    world.insert([5] * 40)  # unrelated cached tokens
    arrive(adapter, world, labelled("r1", "t1", "a"))
    policy.decisions = [Decision(prefix_in=("a",))]
    step(adapter, world)
    assert world.tree.protected_size() == 32  # exactly the prefix path is locked
    policy.decisions = [NOOP]
    step(adapter, world)
    assert policy.snaps[-1].prefix("a").location == "gpu"
    world.evict_all()
    assert world.device_match(PREFIX["a"]) == 32  # pinned prefix spared
    assert world.device_match([5] * 40) == 0  # the rest evicted
    policy.decisions = [Decision(prefix_out=("a",))]
    adapter._state_key = None  # force a decision without a queue change
    step(adapter, world)
    assert world.tree.protected_size() == 0
    world.evict_all()
    assert world.device_match(PREFIX["a"]) == 0
    assert world.alloc.available_size() == 2048


def test_admission_makes_the_prefix_resident_and_pinned() -> None:
    world, policy = World(), ScriptedPolicy(Decision(admit=("r1",)))
    adapter = make_adapter(policy)
    arrive(adapter, world, labelled("r1", "t1", "a"))
    step(adapter, world)  # admitted; the prefill put its prompt in the tree
    arrive(adapter, world, labelled("r2", "t2", "b"))
    step(adapter, world)  # next decision pins a's prefix
    snap = policy.snaps[-1]
    assert snap.prefix("a").location == "gpu" and snap.prefix("a").running == 1
    assert snap.prefix("b").location == "none"
    assert [v.rid for v in snap.running] == ["r1"] and snap.kv_used == 32 + 16
    adapter.close()  # uninstall releases every pin
    assert not any(p.lock for p in adapter.residency.agents.values())


def test_preemption_goes_through_sglang_retraction() -> None:
    world, policy = World(), ScriptedPolicy(Decision(admit=("r1", "r2")))
    adapter = make_adapter(policy)
    r1, r2 = labelled("r1", "t1", "a"), labelled("r2", "t2", "b")
    arrive(adapter, world, r1, r2)
    step(adapter, world)
    assert world.tree.protected_size() == 80  # both prompts locked by their running requests
    policy.decisions = [Decision(preempt=("r2",))]
    adapter._state_key = None
    step(adapter, world)
    assert [r.rid for r in world.running.reqs] == ["r1"]
    assert [r.rid for r in world.sched.waiting_queue] == ["r2"]
    assert r2.is_retracted and r2.retraction_count == 1 and r2.kv.req_pool_idx is None
    # r2's lock is released; r1's 40-token path stays locked and so does agent b's 32-token
    # prefix: admitting r2 made it resident and preemption does not evict prefixes.
    assert world.tree.protected_size() == 40 + 32
    policy.decisions = [NOOP]
    step(adapter, world)
    (view,) = policy.snaps[-1].waiting
    assert (view.rid, view.preemptions) == ("r2", 1)
    assert adapter.stats["preempted"] == 1


def test_retraction_order_hook_keeps_policy_admitted_first() -> None:
    world = World()
    adapter = make_adapter(ScriptedPolicy(Decision(admit=("z", "y", "x"))))
    reqs = [labelled(r, f"t{r}", "a", extra=n) for r, n in (("x", 4), ("y", 8), ("z", 12))]
    arrive(adapter, world, *reqs)
    step(adapter, world)
    batch = world.running.reqs
    with applied_hooks([(plugin.RETRACT_TARGET, plugin.after_retraction_order, "AFTER")]):
        stock = ScheduleBatch._get_decode_retraction_order(batch)
        plugin.install(adapter)
        ours = ScheduleBatch._get_decode_retraction_order(batch)
    assert [batch[i].rid for i in stock] == ["x", "y", "z"]  # SGLang: shortest input kept first
    assert [batch[i].rid for i in ours] == ["z", "y", "x"]  # policy admission order kept first


def test_lpm_keeps_prefix_order_with_200_waiting() -> None:
    # SGLang's own LPM falls back to FCFS above 128 waiting; ours must not.
    def scenario(with_plugin: bool) -> list[str]:
        world = World(size=8192, schedule_policy="lpm")
        adapter = make_adapter(make_policy("lpm"), name="lpm", kv_budget=32 + 20 * 16)
        arrive(adapter, world, labelled("warm", "t0", "a"))
        step(adapter, world)  # a's prefix cached (stock) / resident and then pinned (ours)
        cold = [labelled(f"c{i:03d}", f"tc{i}", "b") for i in range(100)]
        hot = [labelled(f"h{i:03d}", f"th{i}", "a") for i in range(100)]
        if with_plugin:
            arrive(adapter, world, *cold, *hot)
            plugin.install(adapter)
            with applied_hooks([(plugin.PRIORITY_TARGET, plugin.after_calc_priority, "AFTER")]):
                ran = plugin.around_prefill(sglang_prefill(world), world.sched, world.running)
            plugin.uninstall()
        else:
            for r in cold + hot:
                world.sched._add_request_to_queue(r)
            ran = sglang_prefill(world)(world.sched, world.running)
        return [r.rid for r in ran]

    stock, ours = scenario(False), scenario(True)
    assert len(stock) == 200 and stock[:3] == ["c000", "c001", "c002"]  # FCFS fallback
    assert len(ours) == 19 and all(rid.startswith("h") for rid in ours)  # budget: 19 more fit
    assert ours == sorted(ours)


def test_a_failing_policy_leaves_sglang_scheduling_on_its_own_until_it_is_asked_again(tmp_path: Any) -> None:
    # before: it admitted nothing (every call hung), and an unconsumed stage-done event re-ran
    # the failing policy at every scheduler pass (thousands of errors a second)
    world, clock = World(), Clock()
    policy = ScriptedPolicy()
    policy.fn = lambda snap: Decision(admit=("nope",))  # not waiting: the check refuses it
    log = tmp_path / "decisions.jsonl"
    adapter = make_adapter(policy, clock=clock, decision_log=str(log), redecide_s=0.5)
    arrive(adapter, world, labelled("r1", "t1", "a"))
    assert [r.rid for r in step(adapter, world)] == ["r1"]  # SGLang's own order: the call runs
    arrive(adapter, world, labelled("r2", "t2", "b"))
    for _ in range(20):  # scheduler passes inside the back-off: the policy is not asked
        step(adapter, world)
    assert adapter.stats["decision_errors"] == 1 and len(policy.snaps) == 1
    assert {r.rid for r in world.running.reqs} == {"r1", "r2"}
    clock.t = 0.5  # asked again, and it decides now
    policy.fn = lambda snap: Decision(admit=tuple(v.rid for v in snap.waiting))
    arrive(adapter, world, labelled("r3", "t3", "c"))
    assert [r.rid for r in step(adapter, world)] == ["r3"]
    assert adapter.stats["decision_errors"] == 1 and adapter.stats["decisions"] == 1
    adapter.close()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records[0]["event"] == "error" and "not waiting" in records[0]["error"]
    assert [r["event"] for r in records].count("error") == 1
    assert records[-1]["event"] == "decision" and records[-1]["sglang_admitted"] == ["r3"]


def test_a_request_aborted_while_waiting_ends_as_an_abort(tmp_path: Any) -> None:
    # SGLang drops a waiting request whose client left without a finish reason: logged "NoneType"
    world, log = World(), tmp_path / "decisions.jsonl"
    adapter = make_adapter(ScriptedPolicy(), decision_log=str(log))  # admits nothing
    r1 = labelled("r1", "t1", "a")
    arrive(adapter, world, r1)
    step(adapter, world)
    world.sched.waiting_queue.remove(r1)
    step(adapter, world)
    adapter.close()
    (end,) = [json.loads(x) for x in log.read_text().splitlines() if json.loads(x)["event"] == "end"]
    assert (end["rid"], end["ok"], end["reason"]) == ("r1", False, "FINISH_ABORT")


def test_stage_done_events_and_finishes_reach_the_policy(tmp_path: Any) -> None:
    wf = tmp_path / "two.yaml"
    wf.write_text("name: two\nagents: [{name: a, prefix_tokens: 32}, {name: b, prefix_tokens: 32}]\n"
                  "stages:\n  - {name: s1, agent: a, input_tokens: 8, output_tokens: 8}\n"
                  "  - {name: s2, agent: b, after: [s1], input_tokens: 8, output_tokens: 8}\n")
    world, clock = World(), Clock()
    policy = ScriptedPolicy()
    policy.fn = lambda snap: Decision(admit=tuple(v.rid for v in snap.waiting))
    adapter = make_adapter(policy, clock=clock, workflows=(str(wf),))
    r1 = labelled("r1", "t1", "a", workflow="two")
    arrive(adapter, world, r1)
    step(adapter, world)
    clock.t = 2.0
    finish(world, r1)
    arrive(adapter, world, labelled("r2", "t1", "b", stage="s2", workflow="two"))
    step(adapter, world)
    snap = policy.snaps[-1]
    (event,) = snap.events
    assert (event.task_id, event.workflow, event.stage, event.agent, event.service_s, event.rounds) == \
        ("t1", "two", "s1", "a", 2.0, 1)
    (task,) = snap.tasks
    assert task.done_stages == {"s1"} and task.attained_s == 2.0 and task.workflow == "two"
    assert [v.rid for v in snap.waiting] == ["r2"] and snap.running == ()
    assert [r.rid for r in world.running.reqs] == ["r2"]


@pytest.mark.parametrize("name", ["fcfs", "lpm", "parrot", "las", "spf", "topas"])
def test_real_policies_drive_real_sglang_admission(name: str) -> None:
    world, clock = World(size=4096), Clock()
    adapter = make_adapter(make_policy(name), clock=clock, name=name, workflows=("chain3",),
                           kv_budget=2048)
    for t in range(2):  # two chain3 tasks: stage s1 (agent a), then s2 (agent b)
        arrive(adapter, world, labelled(f"t{t}s1", f"t{t}", "a", workflow="chain3"))
    for _ in range(5):
        clock.t += 0.25
        step(adapter, world)
        for r in list(world.running.reqs):
            if r.rid.endswith("s1"):
                finish(world, r)
                task = r.rid[:2]
                arrive(adapter, world, labelled(f"{task}s2", task, "b", stage="s2", workflow="chain3"))
    assert adapter.stats["decision_errors"] == 0 and adapter.stats["decisions"] >= 2
    assert adapter.stats["admitted"] == 4  # both tasks' s1 and s2, admitted by SGLang's adder
    assert sorted(r.rid for r in world.running.reqs) == ["t0s2", "t1s2"]


def test_host_tier_branches_call_load_back() -> None:
    # HiCache needs CUDA (init_hicache builds pinned host pools), so this checks only our
    # branching on a real UnifiedRadixCache whose host tier is simulated: a prefix found on
    # host is reported "cpu" and prefix_in loads it back (H->D) and pins the loaded node.
    world = World()
    world.insert(PREFIX["a"])
    tree, loads = world.tree, []
    real_match = tree.match_prefix

    def match_on_host(params: Any) -> Any:  # the device copy "was demoted": device 0, host 32
        m = real_match(params)
        return m._replace(device_prefix_len=0, host_hit_length=m.device_prefix_len,
                          best_match_node=m.last_device_node)

    tree.cache_controller = object()
    tree.match_prefix = match_on_host
    tree.load_back = lambda node, mem_quota=None, req=None: loads.append(node) or True
    adapter = make_adapter(ScriptedPolicy(NOOP))
    arrive(adapter, world, labelled("r1", "t1", "a"))
    adapter.bind(world.sched)
    adapter.residency.sync()
    assert adapter.residency.location("a") == "cpu"
    assert adapter.residency.prefix_in("a") == "load_back" and len(loads) == 1
    assert adapter.residency.location("a") == "gpu" and tree.protected_size() == 32
    adapter.residency.prefix_out("a")
    assert tree.protected_size() == 0


def test_deferred_reasons_name_why_sglang_left_admitted_requests_waiting() -> None:
    from topas_agents.server.sglang.apply import deferred_reasons

    a, b, c = (make_req(rid, [1, 2, 3]) for rid in "abc")
    full, free = types.SimpleNamespace(batch_is_full=True), types.SimpleNamespace(batch_is_full=False)
    assert deferred_reasons([a, b], [a, b], [AddReqResult.CONTINUE] * 2, free) == {}
    assert deferred_reasons([a, b, c], [a], [AddReqResult.CONTINUE, AddReqResult.NO_TOKEN], full) == {
        "b": "kv_full", "c": "head_of_line"}
    assert deferred_reasons([a, b], [a], [AddReqResult.CONTINUE, AddReqResult.OTHER], free) == {"b": "prefill_budget"}
    assert deferred_reasons([a], [], [], full) == {"a": "batch_full"}
    assert deferred_reasons([a], [], [], free) == {"a": "not_attempted"}


def test_kv_budget_above_the_pool_overcommits() -> None:
    world = World(size=512)
    adapter = make_adapter(ScriptedPolicy(NOOP), kv_budget=5000)
    adapter.bind(world.sched)
    assert adapter.kv_budget == 5000 and make_adapter(ScriptedPolicy(NOOP), kv_budget=100).kv_budget == 100
    plain = make_adapter(ScriptedPolicy(NOOP))
    plain.bind(world.sched)
    assert plain.kv_budget == 512
