"""Real SGLang replicas behind SGLang's real gateway: `topas serve --replicas 2 --engine sglang`.

Two SGLang servers with the Topas plugin (on CPU where there is no CUDA: tests/sglang_cpu),
smg 1.13.0 in front of them and the Topas front before smg, started by the product's own
launcher (`run_replicas`). What each replica's scheduler did is read from its own decision
log (`--decision-log F` becomes F.replica-<i>.jsonl). Checked here, with real engines:
labels reach every replica's scheduler through the gateway (chat and completions, streaming
or not, body or header labels) and a task's calls stay on one replica; the front says what
SGLang replicas lack instead of aggregating 404s, and merges the replicas' SGLang metrics;
a replica SIGKILLed mid-stream loses no
client call (the streams it cut are resumed, byte for byte, on the other replica), and the
supervisor brings it back into smg's rotation.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
pytest.importorskip("sglang")
pytest.importorskip("smg")

import httpx  # noqa: E402
import openai  # noqa: E402
from sglang_cpu import serving  # noqa: E402

from topas_agents import label  # noqa: E402
from topas_agents.cluster.stream_retry import ResumingStream  # noqa: E402
from topas_agents.integrations.openai_client import labelled  # noqa: E402
from topas_agents.server.sglang import launch, make_tiny_model  # noqa: E402

REPLICAS = 2
KV_TOKENS = 16000  # room for six concurrent 200-token streams beside the three prefixes
STAGES = (("s1", "a"), ("s2", "b"), ("s3", "c"))
# Two SGLang starts share two cores (44-47 s measured on quiet cores, more under load), and a
# restart competes with the survivor's decoding.
STARTUP_TIMEOUT_S = 2 * serving.STARTUP_TIMEOUT_S


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from topas_agents.server.cluster.launcher import free_base_port, run_replicas

    tmp = tmp_path_factory.mktemp("sglang-cluster")
    model = tmp / "model"
    make_tiny_model.build(model)
    shim = launch.write_entry_point_shim(tmp / "shim")
    wf = serving.write_workflow(tmp)
    t0 = time.monotonic()
    # in os.environ while the cluster lives: the launcher and its supervisor start every
    # replica (and every restart) with the current environment
    with pytest.MonkeyPatch.context() as env:
        for key, value in serving.serving_env(shim).items():
            env.setenv(key, value)
        handle = run_replicas(REPLICAS, port=free_base_port(REPLICAS + 3), engine="sglang",
                              serve_args=("--policy", "topas", "--workflow", str(wf),
                                          "--decision-log", str(tmp / "decisions.jsonl")),
                              engine_args=serving.engine_args(model, KV_TOKENS, ["--enable-metrics"]),
                              startup_timeout_s=STARTUP_TIMEOUT_S, log_dir=tmp / "logs")
        print(f"\n{REPLICAS} SGLang replicas behind smg healthy after {time.monotonic() - t0:.1f} s")
        try:
            yield Cluster(handle, [tmp / f"decisions.replica-{i}.jsonl" for i in range(1, REPLICAS + 1)])
        finally:
            handle.stop()
    assert all(not child.alive() for child in handle.children)


class Cluster(NamedTuple):
    handle: Any  # the launcher's ClusterHandle
    logs: list[Path]  # replica i's decision log at logs[i - 1]

    @property
    def url(self) -> str:
        return self.handle.url

    @property
    def base_url(self) -> str:
        return self.handle.base_url


def _records(path: Path, event: str) -> list[dict[str, Any]]:
    """The log's `event` records; a last line still being written is left for the next read."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for k, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if k != len(lines) - 1:
                raise
    return [r for r in rows if r.get("event") == event]


def _ends(cluster: Any, prefix: str) -> dict[str, list[tuple[int, dict]]]:
    """task id -> [(replica, `end` record)] for the tasks whose id starts with `prefix`."""
    out: dict[str, list[tuple[int, dict]]] = {}
    for i, log in enumerate(cluster.logs, start=1):
        for rec in _records(log, "end"):
            if rec["task"].startswith(prefix):
                out.setdefault(rec["task"], []).append((i, rec))
    return out


def _wait_for(check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def _call(client: httpx.Client, url: str, task: str, stage: str, agent: str, *, endpoint: str,
          stream: bool, how: str) -> None:
    lab = {"task_id": task, "stage": stage, "agent": agent, "workflow": "tiny3"}
    body: dict = {"model": "any-name", "max_tokens": 6, "ignore_eos": True, "stream": stream}
    text = f"{task} {stage} please answer"
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    headers = {}
    if how == "body":
        body["topas"] = lab
    else:  # the front lifts them into the body: smg forwards the body, not X-Topas-* headers
        headers = {"X-Topas-Task-Id": task, "X-Topas-Stage": stage, "X-Topas-Agent": agent,
                   "X-Topas-Workflow": "tiny3"}
    r = client.post(url + ("/chat/completions" if endpoint == "chat" else "/completions"), json=body,
                    headers=headers)
    assert r.status_code == 200, r.text
    if stream:
        assert r.text.rstrip().endswith("data: [DONE]"), r.text[-200:]


COMBOS = (("body", "chat", True), ("headers", "chat", False), ("body", "completion", False),
          ("headers", "completion", True))


def test_labels_reach_every_replicas_scheduler_and_tasks_stay_whole(cluster: Any) -> None:
    errors: list[BaseException] = []

    def run_task(task: str, how: str, endpoint: str, stream: bool) -> None:
        try:
            with httpx.Client(timeout=120) as client:
                for stage, agent in STAGES:
                    _call(client, cluster.url, task, stage, agent, endpoint=endpoint, stream=stream, how=how)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    for how, endpoint, stream in COMBOS:  # two tasks at a time: smg's min_load spreads them
        threads = [threading.Thread(target=run_task, args=(f"lab-{how}-{endpoint}-{int(stream)}-{t}",
                                                           how, endpoint, stream)) for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
    assert not errors, errors
    expected = {f"lab-{h}-{e}-{int(s)}-{t}" for h, e, s in COMBOS for t in range(2)}
    def all_ended() -> dict | None:  # end records follow the responses
        ends = _ends(cluster, "lab-")
        return ends if sum(map(len, ends.values())) >= 3 * len(expected) else None

    ends = _wait_for(all_ended, 30) or _ends(cluster, "lab-")
    assert set(ends) == expected, ends
    for task, recs in ends.items():
        # the label reached the scheduler intact: its stages, in order, each ended once
        assert [r["stage"] for _, r in recs] == ["s1", "s2", "s3"], (task, recs)
        assert all(r["ok"] and r["output_tokens"] == 6 for _, r in recs), recs
        assert len({replica for replica, _ in recs}) == 1, f"{task} split across replicas"
    assert {recs[0][0] for recs in ends.values()} == set(range(1, REPLICAS + 1))  # both served tasks
    for log in cluster.logs:
        assert not _records(log, "error")


def test_the_front_says_what_sglang_replicas_lack(cluster: Any) -> None:
    health = httpx.get(cluster.base_url + "/health", timeout=30).json()
    assert health["status"] == "ok" and health["replicas_up"] == REPLICAS
    for method, path in (("GET", "/v1/topas/stats"), ("POST", "/v1/topas/workflows"),
                         ("POST", "/v1/topas/tasks/lab-x/done")):
        r = httpx.request(method, cluster.base_url + path, content=b"name: x", timeout=30)
        assert r.status_code == 501 and "decision log" in r.json()["error"]["message"], r.text


def test_every_replicas_sglang_metrics_in_one_view(cluster: Any) -> None:
    # SGLang serves /metrics with --enable-metrics; the front labels each sample with its replica
    text = httpx.get(cluster.base_url + "/metrics", timeout=30).text
    samples = [line for line in text.splitlines() if line.startswith("sglang:prompt_tokens_total")]
    assert {line.split('replica="')[1].split('"')[0] for line in samples} == {"1", "2"}, text[:2000]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in samples) > 0  # the labelled calls above
    assert sum(line.startswith("# TYPE sglang:prompt_tokens_total ") for line in text.splitlines()) == 1


def _prompt(task: str) -> list[dict]:
    return [{"role": "user", "content": f"failover {task} tell me a story"}]


def test_replica_death_loses_no_call_and_the_replica_comes_back(cluster: Any) -> None:
    tasks = [f"fo-{t}" for t in range(6)]
    client = labelled(openai.OpenAI(base_url=cluster.url, api_key="unused", timeout=120))
    # 200 tokens (about 10 s on two CPU cores): long enough that the victim is still generating
    # at the kill (64 were not)
    greedy = {"max_tokens": 200, "temperature": 0, "extra_body": {"ignore_eos": True}}
    # the reference text of each call (greedy decoding; every replica loads the same dummy weights)
    expected = {t: client.raw.chat.completions.create(model="m", messages=_prompt(t), **greedy)
                .choices[0].message.content for t in tasks}
    # Readers never pause: a paused reader does not pause the server, which then sends the whole
    # stream into the socket before the kill (measured in CI: with every reader held at a barrier,
    # the chosen replica's streams had all been sent by the kill, and none was cut).
    lock = threading.Lock()
    streaming: dict[str, float] = {}  # task -> when its third chunk arrived
    finished: set[str] = set()
    got: dict[str, tuple[str, int]] = {}
    errors: list[BaseException] = []

    def run(task: str) -> None:
        try:
            with label(task_id=task, stage="s1", agent="a", workflow="tiny3"):
                stream = client.chat.completions.create(model="m", messages=_prompt(task), stream=True, **greedy)
                assert isinstance(stream, ResumingStream)
                parts = []
                for n, chunk in enumerate(stream):
                    parts.extend(c.delta.content or "" for c in chunk.choices)
                    if n == 2:
                        with lock:
                            streaming[task] = time.monotonic()
                got[task] = ("".join(parts), stream.resumed)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            with lock:
                finished.add(task)

    def in_flight() -> list[set[str]]:  # per replica: its tasks streaming now (admitted there)
        with lock:
            live = set(streaming) - finished
        return [live & {a["task"] for d in _records(log, "decision") for a in d["admit"]} for log in cluster.logs]

    def time_to_kill() -> bool:
        # a replica with live streams, once every task streams (or ended), or once that replica's
        # streams are 4 s in (a 200-token stream lasts about 10 s): the kill cuts them mid-stream
        live = in_flight()
        with lock:
            everyone = set(streaming) | finished == set(tasks)
            oldest = min((streaming[t] for t in set().union(*live)), default=time.monotonic())
        return any(live) and (everyone or time.monotonic() - oldest > 4)

    threads = [threading.Thread(target=run, args=(t,)) for t in tasks]
    for th in threads:
        th.start()
    assert _wait_for(time_to_kill, 180), (in_flight(), streaming, finished)
    live = in_flight()
    victim = max(range(REPLICAS), key=lambda i: len(live[i]))
    old = cluster.handle.replicas[victim]
    old.kill()
    for th in threads:
        th.join(300)

    assert not errors, errors
    assert {t: text for t, (text, _) in got.items()} == expected  # every call whole, nothing twice
    assert sum(resumed for _, resumed in got.values()) >= 1  # the kill cut streams, and they resumed
    def ended_by_replica() -> dict[int, set[str]]:  # replica index -> its fo- tasks that ended ok
        return {i: {r["task"] for r in _records(log, "end") if r["task"].startswith("fo-") and r["ok"]}
                for i, log in enumerate(cluster.logs)}

    # a scheduler writes its end record when it next steps, which may be after the client got
    # the last chunk (measured in CI: the replayed streams' records came later)
    _wait_for(lambda: set().union(*ended_by_replica().values()) == set(tasks), 60)
    ended = ended_by_replica()
    assert set().union(*ended.values()) == set(tasks), ended
    # a cut stream was re-issued: the survivor rebuilt its task from the label and finished it
    # (a victim's stream whose last byte left before the kill ended on the victim)
    assert {t for t, (_, resumed) in got.items() if resumed} <= ended[1 - victim]

    events = cluster.handle.supervisor.wait_for(1, timeout_s=STARTUP_TIMEOUT_S)
    assert [(e.replica, e.outcome, e.old_pid) for e in events] == [(victim + 1, "restarted", old.pid)]
    # new tasks: every call succeeds; smg routes some to the restarted replica once its health
    # probe passes (bounded: health interval + breaker timeout)
    back = cluster.logs[victim]
    before = len(_records(back, "end"))
    deadline = time.monotonic() + 90
    sent = 0
    while len(_records(back, "end")) == before and time.monotonic() < deadline:
        out = client.chat.completions.create(model="m", messages=_prompt(f"back-{sent}"), max_tokens=4,
                                             extra_body={"topas": {"task_id": f"back-{sent}", "stage": "s1",
                                                                   "agent": "a", "workflow": "tiny3"}})
        assert out.choices[0].message.content
        sent += 1
        time.sleep(0.2)  # the end record follows the response
    assert len(_records(back, "end")) > before, f"no call reached the restarted replica in {sent} calls"
