# Two commands do all the set-up on a fresh machine:
#   make serve   create .venv, install the workspace, fetch the embedded default model, serve it
#   make test    the same set-up, then lint, type-check and run the whole test suite
# .ci/run calls `make test`.

SHELL := /bin/bash
UV_VERSION := 0.13.8
UV := .tools/uv/bin/uv
PY := .venv/bin/python
export UV_PYTHON_DOWNLOADS := never
PYTEST_ARGS ?=

.PHONY: setup serve generate test test-long lint typecheck docs bench reliability agents-e2e agent-sessions replicas-e2e ui-screenshots clean

$(UV):
	python3 -m venv .tools/uv
	.tools/uv/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# The environment lives in .venv/ at the repository root. MLX's backend: the CPU wheel, or
# on Linux with an NVIDIA driver the CUDA one (scripts/mlx-backend; MLX_BACKEND=cpu to force).
setup: $(UV)
	backend=$$(bash scripts/mlx-backend) && echo "MLX backend: $$backend" && \
	    $(UV) sync --locked --extra $$backend --python python3
	UV_PROJECT_ENVIRONMENT=$(CURDIR)/.venv-instructor $(UV) sync --locked --project clients/instructor --python python3 --quiet
	@bash scripts/install-openblas.sh || true
	@bash scripts/install-chromium.sh || true
	$(PY) -c "from mlxcore.models.default import ensure_default_model as e; print(e())"

# The main job: serve the embedded default model (SmolLM2-135M-Instruct).
serve: setup
	$(PY) -m mlxcore serve $(ARGS)

# One-shot generation on the embedded default model.
generate: setup
	$(PY) -m mlxcore generate --prompt "What is the capital of France?" $(ARGS)

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

typecheck:
	.venv/bin/mypy

docs:
	$(PY) scripts/gen_hooks_doc.py

test: setup lint typecheck
	$(PY) scripts/pytest-openblas -n 2 --dist loadfile --durations=15 -m "not long and not replicas" $(PYTEST_ARGS)

# The tests left out of `make test` to keep it under 20 minutes on CI's 2 cores: the
# distributed group end to end, the benchmark scripts' long modes, variants of tests whose
# main case `make test` runs (about 16 minutes of test time).
test-long: setup
	$(PY) scripts/pytest-openblas -n 2 --dist loadfile --durations=15 -m long $(PYTEST_ARGS)

# Replicas behind the real vllm-router (docs/replicas.md): agent sessions under each
# policy, kill -9 of a replica, a full replica's 503 retried elsewhere (about 5 minutes).
replicas-e2e: setup
	$(PY) scripts/pytest-openblas -s --durations=10 -m replicas tests/e2e/test_replicas.py $(PYTEST_ARGS)

# The web page's screenshots in docs/images, taken by its browser tests (headless Chromium).
ui-screenshots: setup
	MLXCORE_UI_SCREENSHOTS=$(CURDIR)/docs/images $(PY) scripts/pytest-openblas -q \
	    tests/plugins/ui/test_ui_browser.py -k "markdown_answer or dashboard or get_a_model"

# The reliability suite (not part of `make test`): fuzz, the OpenAPI contract, 200/500-connection waves, a
# disconnect storm, fault injection and a 10-minute soak; ARGS=--smoke for a 2-minute subset.
reliability: setup
	$(PY) scripts/reliability $(ARGS)

# The real agent CLIs (Codex, Claude Code, OpenCode from the npm registry) against a real
# server (not part of `make test`); LATEST=1 uses the newest versions. See docs/agents.md.
agents-e2e: setup
	$(PY) scripts/agents_e2e.py

# Multi-turn sessions of the same CLIs, request by request: prompt, prefix shared with any
# earlier request, cached tokens, TTFT (ARGS="--model qwen3" for the dense test model).
agent-sessions: setup
	$(PY) scripts/agent_sessions.py $(ARGS)

clean:
	rm -rf .venv .venv-instructor .tools .pytest_cache .mypy_cache .ruff_cache
