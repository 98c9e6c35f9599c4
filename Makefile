# The README's two commands:  `make run`  and  `make test`.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
SGL_VENV := .venv-sglang
STAMP   := $(VENV)/.installed

.PHONY: run test install lint pytest test-sglang test-openai-compat gpu-smoke clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# metagpt 0.8.2's own pins cannot resolve (lancedb==0.4.0 is gone): the [metagpt] extra is
# a working set of its pins, and metagpt itself goes in with --no-deps.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e ".[dev,metagpt]"
	$(BIN)/pip install -q --no-deps metagpt==0.8.2
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/topas bench --workload chain3 --policies fcfs,lpm,parrot,las,spf,topas --tasks 120 --seed 0 --json results/chain3.json

lint: install
	$(BIN)/ruff check .

pytest: install
	$(BIN)/python -m pytest -q -m "not sglang"

test: lint pytest test-openai-compat test-sglang

# The client wrapper must work with openai 1.x (metagpt's pin, in .venv), 2.x and 3.x.
OPENAI_MAJORS := 2 3
test-openai-compat:
	@for v in $(OPENAI_MAJORS); do \
	  d=.venv-openai$$v; \
	  [ -x $$d/bin/python ] || $(PY) -m venv $$d; \
	  $$d/bin/pip install -q "openai==$$v.*" tenacity pyyaml pytest pytest-asyncio && \
	  $$d/bin/pip install -q --no-deps -e . && \
	  $$d/bin/python -m pytest -q -p no:cacheprovider tests/test_openai_client.py || exit 1; \
	done

# Real SGLang (CPU import only) lives in its own venv: its pins clash with metagpt's.
$(SGL_VENV)/.installed: pyproject.toml
	$(PY) -m venv $(SGL_VENV)
	$(SGL_VENV)/bin/pip install -q --upgrade pip
	$(SGL_VENV)/bin/pip install -q -e ".[sglang,dev]"
	touch $@

test-sglang: $(SGL_VENV)/.installed
	$(SGL_VENV)/bin/python -m pytest -q -m sglang

# GPU machine only (works offline; WHEEL_DIR=... if sglang is missing). See docs/sglang.md.
gpu-smoke:
	server/sglang/gpu_smoke.sh $(OUT)

clean:
	rm -rf $(VENV) $(SGL_VENV) .venv-openai* build *.egg-info
