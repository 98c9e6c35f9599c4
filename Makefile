# The README's two commands:  `make run`  and  `make test`.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
SGL_VENV := .venv-sglang
STAMP   := $(VENV)/.installed

.PHONY: run test install lint pytest sandbox-deps test-sglang test-openai-compat test-py310 gpu-smoke sglang-cpu-bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# metagpt 0.8.2's own pins cannot resolve (lancedb==0.4.0 is gone): the [metagpt] extra is
# a working set of its pins, and metagpt itself goes in with --no-deps.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e ".[dev,metagpt,cluster]"
	$(BIN)/pip install -q --no-deps metagpt==0.8.2
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/topas bench --workload chain3 --policies fcfs,lpm,parrot,las,spf,topas --tasks 120 --seed 0 --json results/chain3.json

lint: install
	$(BIN)/ruff check .

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# QA sandbox (integrations/metagpt/sandbox.py): MetaGPT's generated code runs under bubblewrap.
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq bubblewrap; }

pytest: install sandbox-deps
	$(BIN)/python -m pytest -q -m "not sglang"

test: lint pytest test-openai-compat test-py310 test-sglang

# The client wrapper must work with openai 1.x (metagpt's pin, in .venv), 2.x and 3.x.
OPENAI_MAJORS := 2 3
OPENAI_COMPAT_TESTS := tests/test_openai_client.py tests/test_openai_client_retries.py tests/test_client_streams.py
test-openai-compat:
	@for v in $(OPENAI_MAJORS); do \
	  d=.venv-openai$$v; \
	  [ -x $$d/bin/python ] || $(PY) -m venv $$d; \
	  $$d/bin/pip install -q "openai==$$v.*" httpx tenacity pyyaml pytest pytest-asyncio && \
	  $$d/bin/pip install -q --no-deps -e . && \
	  $$d/bin/python -m pytest -q -p no:cacheprovider $(OPENAI_COMPAT_TESTS) || exit 1; \
	done

# The README promises Python 3.10 and 3.11; .venv is 3.11 (PY). The server, simulator,
# scheduler and clients also run on 3.10 here (MetaGPT and SGLang are tested in their venvs).
# Found this way: an asyncio TimeoutError that only 3.11 catches as the builtin one hung every
# call of the embedded server on 3.10. No Python 3.10 (on PATH, or pyenv's even when it is
# not the active version): a warning, an error under CI.
PY310 ?= $(shell for p in python3.10 $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.10*/bin/python3.10 2>/dev/null); do \
  $$p -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null && { echo $$p; break; }; done)
# The gateway's tests too (smg from [cluster]: front, failover, restarts, keys; ~40 s), not its
# simulated-cluster benches (simulator code the tests above run on 3.10 already).
PY310_TESTS := tests/test_server_*.py tests/test_echo_*.py tests/test_topas_*.py tests/test_sim*.py \
  tests/test_forecast_guard.py tests/test_fuzz_server.py tests/test_metagpt_sandbox.py tests/test_openai_client*.py \
  tests/test_cluster_api_key.py tests/test_cluster_failover.py tests/test_cluster_front_bad_input.py \
  tests/test_cluster_gateway.py tests/test_cluster_restart.py tests/test_cluster_units.py
test-py310:
	@if [ -z "$(PY310)" ]; then \
	  echo "warning: no Python 3.10 found: the Python 3.10 checks did not run" >&2; [ -z "$$CI" ] || exit 1; \
	else \
	  [ -x .venv-py310/bin/python ] || $(PY310) -m venv .venv-py310; \
	  .venv-py310/bin/pip install -q -e ".[server,bench,dev,cluster]" && \
	  .venv-py310/bin/topas bench --workload chain3 --policies lpm,topas --tasks 30 >/dev/null && \
	  .venv-py310/bin/python -m pytest -q -p no:cacheprovider -m "not sglang" $(PY310_TESTS); \
	fi

# Real SGLang (CPU import only) lives in its own venv: its pins clash with metagpt's.
$(SGL_VENV)/.installed: pyproject.toml
	$(PY) -m venv $(SGL_VENV)
	$(SGL_VENV)/bin/pip install -q --upgrade pip
	$(SGL_VENV)/bin/pip install -q -e ".[sglang,dev]"
	touch $@

# Includes real serving on CPU: one SGLang start per module/policy, two replicas behind smg and
# one restart, one with the forecast guard, one keyed through the launcher (12 starts). See docs/sglang.md and docs/cluster.md.
test-sglang: $(SGL_VENV)/.installed
	$(SGL_VENV)/bin/python -m pytest -q -m sglang -p no:cacheprovider tests/test_sglang_*.py

# Real SGLang on this CPU, lpm vs topas, plus the simulator on the same trace with a profile
# calibrated on the first server: OUT/sglang-cpu.json ({"real", "sim", "profile"}). The CPU
# needs the test-only sgl_kernel stand-in (docs/sglang.md); a GPU run drops those three lines.
sglang-cpu-bench: $(SGL_VENV)/.installed
	@[ -n "$(OUT)" ] || { echo "usage: make sglang-cpu-bench OUT=DIR"; exit 2; }
	mkdir -p $(OUT)
	$(SGL_VENV)/bin/python -m topas_agents.server.sglang.make_tiny_model $(OUT)/model >/dev/null
	cd $(OUT) && SGLANG_USE_CPU_ENGINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
	  PYTHONPATH=$(CURDIR)/tests/sglang_cpu/kernel_stand_in \
	  $(CURDIR)/$(SGL_VENV)/bin/python -m topas_agents.realbench.runner --engine sglang --model-path model \
	  --engine-arg=--device --engine-arg=cpu --engine-arg=--load-format --engine-arg=dummy \
	  --policies lpm,topas --tasks 40 --rate 20 --scale 0.05 --kv-tokens 1000 --sim --json sglang-cpu.json

# GPU machine only (works offline; WHEEL_DIR=... if sglang is missing). See docs/sglang.md.
# SERVING_TESTS=1 also runs the real-serving test modules on the GPU.
gpu-smoke:
	server/sglang/gpu_smoke.sh $(OUT)

clean:
	rm -rf $(VENV) $(SGL_VENV) .venv-openai* .venv-py310 build *.egg-info
