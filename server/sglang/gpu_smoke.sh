#!/usr/bin/env bash
# GPU smoke test: Topas inside real SGLang 0.5.23, on a tiny random-weight model, offline.
#
#   server/sglang/gpu_smoke.sh [OUT_DIR]
#
# 1. checks/installs packages: sglang==0.5.23 (from $WHEEL_DIR if missing; no internet) and
#    this repo (editable, --no-deps); adds an entry-point shim if the plugin is not declared;
# 2. builds a tiny Qwen2-style model dir (config + tokenizer only; served --load-format dummy);
# 3. starts `topas serve --engine sglang --policy $POLICY --workflow $WORKFLOW` (our launcher)
#    with the decision log on, waits for /health;
# 4. runs $TASKS concurrent labelled $WORKFLOW tasks (openai client, extra_body topas) and
#    prints per-task JCT;
# 5. prints the scheduler's decisions and fails unless the plugin loaded in the scheduler
#    process, took decisions, admitted requests and logged no policy errors.
# Exits non-zero on any failure; every wait is bounded.
#
# 6. with SERVING_TESTS=1 and the repo's tests/ present: runs the real-serving test modules
#    (tests/test_sglang_launch.py, _policies.py, _hicache.py) on this GPU -- the same tests CI
#    runs on CPU; their fixture serves on CUDA when it is there, with no CPU stand-in.
# Env: PYTHON (python3), WHEEL_DIR, POLICY (topas), WORKFLOW (chain3), TASKS (2), PORT (30123),
#      KV_TOKENS (16384, --max-total-tokens), STARTUP_TIMEOUT (420 s), RUN_TIMEOUT (180 s),
#      SGLANG_EXTRA_ARGS (appended to SGLang's arguments), SERVING_TESTS (0).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:-${OUT:-}}
[ -n "$OUT" ] || OUT=$(mktemp -d)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
POLICY=${POLICY:-topas}
WORKFLOW=${WORKFLOW:-chain3}
TASKS=${TASKS:-2}
PORT=${PORT:-30123}
KV_TOKENS=${KV_TOKENS:-16384}
STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-420}
RUN_TIMEOUT=${RUN_TIMEOUT:-180}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export TOPAS_SGLANG_DECISION_LOG="$OUT/decisions.jsonl"
rm -f "$TOPAS_SGLANG_DECISION_LOG"
log() { echo "[gpu_smoke $(date +%H:%M:%S)] $*"; }

# ---------------------------------------------------------------- 1. packages
log "python: $($PY -c 'import sys; print(sys.version.split()[0], sys.executable)')"
if ! $PY -c "import sglang" 2>/dev/null; then
  if [ -z "${WHEEL_DIR:-}" ]; then log "sglang is not installed and WHEEL_DIR is unset"; exit 2; fi
  log "installing sglang==0.5.23 from $WHEEL_DIR"
  timeout 900 $PY -m pip install -q --no-index --find-links "$WHEEL_DIR" "sglang==0.5.23"
fi
SGL_VERSION=$($PY -c "import importlib.metadata as m; print(m.version('sglang'))")
[ "$SGL_VERSION" = "0.5.23" ] || log "WARNING: sglang $SGL_VERSION installed; the adapter is tested with 0.5.23"
if ! $PY -c "import topas_agents.server.sglang.plugin" 2>/dev/null; then
  log "installing topas-agents (editable, no deps)"
  timeout 300 $PY -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
fi
cd "$OUT"  # keep the repo root (its datasets/ dir) off sys.path from here on
if ! $PY -c "import sys; from topas_agents.server.sglang.launch import plugin_installed as p; sys.exit(not p())"; then
  SHIM=$($PY -c "from topas_agents.server.sglang.launch import write_entry_point_shim as w; print(w('$OUT/shim'))")
  export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
  log "plugin entry point not in the package metadata: using the shim in $SHIM"
fi
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('GPU:', torch.cuda.get_device_name(0))"

# ---------------------------------------------------------------- 2. tiny model
$PY -m topas_agents.server.sglang.make_tiny_model "$OUT/model" >/dev/null
log "tiny model in $OUT/model"

# ---------------------------------------------------------------- 3. server
SERVER_PID=
SETSID=$(command -v setsid || true)  # own process group: cleanup reaches SGLang's children too
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -INT "$SERVER_PID" 2>/dev/null || true  # the launcher forwards it; SGLang tears down
    for _ in $(seq 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    if [ -n "$SETSID" ]; then kill -KILL -- "-$SERVER_PID" 2>/dev/null || true; fi
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT
log "starting SGLang with policy $POLICY (log: $OUT/server.log)"
# shellcheck disable=SC2086
$SETSID $PY -c "import sys; from topas_agents.cli import main; sys.exit(main())" serve --engine sglang \
  --policy "$POLICY" --workflow "$WORKFLOW" --host 127.0.0.1 --port "$PORT" -- \
  --model-path "$OUT/model" --load-format dummy --max-total-tokens "$KV_TOKENS" \
  --disable-cuda-graph --mem-fraction-static 0.3 ${SGLANG_EXTRA_ARGS:-} >"$OUT/server.log" 2>&1 &
SERVER_PID=$!
if ! $PY - "$PORT" "$STARTUP_TIMEOUT" "$SERVER_PID" <<'EOF'
import os, sys, time, urllib.request
port, limit, pid = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("server process exited during startup")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(2)
sys.exit(f"server not healthy after {limit:.0f} s")
EOF
then
  log "server failed to start; last log lines:"; tail -n 60 "$OUT/server.log"; exit 1
fi
log "server healthy"

# ---------------------------------------------------------------- 4. client
CLIENT_RC=0
timeout "$((RUN_TIMEOUT + 30))" $PY -m topas_agents.server.sglang.smoke_client \
  --base-url "http://127.0.0.1:$PORT/v1" --model-dir "$OUT/model" --workflow "$WORKFLOW" \
  --tasks "$TASKS" --timeout "$RUN_TIMEOUT" --out "$OUT/client.json" || CLIENT_RC=$?

# ---------------------------------------------------------------- 5. decisions
CHECK_RC=0
$PY - "$TOPAS_SGLANG_DECISION_LOG" <<'EOF' || CHECK_RC=$?
import collections, json, os, sys
records = [json.loads(line) for line in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
loaded = [r for r in records if r.get("event") == "loaded"]
decisions = [r for r in records if r.get("event") == "decision"]
errors = [r for r in records if r.get("event") == "error"]
print(f"plugin loaded in: {sorted(collections.Counter(r['process'] for r in loaded).items())}")
for d in decisions:
    admit = ", ".join(f"{a['task']}/{a['stage']}@{a['agent']}" for a in d["admit"])
    print(f"  t={d['t']:8.3f} seq={d['seq']:<4} W={d['waiting']:<3} R={d['running']:<3} "
          f"kv={d['kv_used']}/{d['kv_budget']} admit=[{admit}] ran={len(d.get('sglang_admitted', []))} "
          f"preempt={len(d['preempt'])} in={d['prefix_in']} out={d['prefix_out']}")
for e in errors[:5]:
    print("  ERROR:", e["error"])
problems = []
if not any(r["process"] != "MainProcess" for r in loaded):
    problems.append("plugin never loaded in a spawned (scheduler) process")
if not decisions:
    problems.append("no decisions logged")
if not sum(len(d.get("sglang_admitted", [])) for d in decisions):
    problems.append("SGLang admitted nothing through the plugin")
if not any(not a["task"].startswith("untagged-") for d in decisions for a in d["admit"]):
    problems.append("no labelled request reached the scheduler (label path broken)")
if errors:
    problems.append(f"{len(errors)} policy errors")
print(f"{len(decisions)} decisions, {len(errors)} errors")
sys.exit("; ".join(problems) if problems else 0)
EOF
if grep -q "Failed to apply hooks" "$OUT/server.log"; then
  log "HookRegistry failed to apply a hook:"; grep -A3 "Failed to apply hooks" "$OUT/server.log" | head -20; CHECK_RC=1
fi

if [ "$CLIENT_RC" -ne 0 ] || [ "$CHECK_RC" -ne 0 ]; then
  log "FAILED (client rc=$CLIENT_RC, checks rc=$CHECK_RC); last server log lines:"; tail -n 40 "$OUT/server.log"
  exit 1
fi
log "OK: results in $OUT (client.json, decisions.jsonl, server.log)"

# ---------------------------------------------------------------- 6. real-serving tests
if [ "${SERVING_TESTS:-0}" = "1" ] && [ -d "$ROOT/tests" ]; then
  cleanup; SERVER_PID=
  log "real-serving tests on the GPU (log: $OUT/serving-tests.log)"
  (cd "$ROOT" && timeout 1800 $PY -P -m pytest -q -m sglang -p no:cacheprovider --basetemp "$OUT/pytest" \
     tests/test_sglang_launch.py tests/test_sglang_policies.py tests/test_sglang_hicache.py) \
     >"$OUT/serving-tests.log" 2>&1 || { log "serving tests FAILED:"; tail -n 40 "$OUT/serving-tests.log"; exit 1; }
  tail -n 3 "$OUT/serving-tests.log"
fi
