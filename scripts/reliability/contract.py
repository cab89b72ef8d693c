"""The server's /openapi.json as a contract, checked by Schemathesis.

Schemathesis (pinned in the dev group) generates requests from the document: schema-valid
ones must be accepted, schema-violating ones refused with a 4xx, no response may be a 5xx
or a status the document does not list, and each response must match what the document
says. Two kinds of refusal are a model's limits that a JSON Schema cannot state, and are
let through by the hook in ``contract_checks.py``: a prompt (of any length) plus its
``max_tokens`` beyond the context (400 ``context_length_exceeded``), ``min_tokens`` above
``max_tokens``, and a constraint that cannot be held (400 ``invalid_constraint``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

EXCLUDED_CHECKS = (
    "positive_data_acceptance",  # replaced by contract_checks.accepted_within_model_limits
    "ignored_auth",  # no keys configured: every request is meant to pass
)
DEFAULT_MODEL = "qwen3"
"""What the contract part serves unless ``--model`` is given: the tiny Qwen3 test model
(seeded weights, the real 151K-token tokenizer, a thinking template, tool calls). The
contract is about the HTTP surface; on SmolLM2 the generations Schemathesis asks for take
hours on two cores, on this model minutes."""
SERVE_FLAGS = ("--max-model-len", "256")
"""A small context bounds the longest generation a drawn ``max_tokens`` can ask for."""


def _config(path: Path, model: str) -> Path:
    """Schemathesis' configuration: the served model for ``{model_id}``. A response id is
    left to the stateful phase, which reads it from a created response (a fixed one would
    be deleted by the first DELETE, and later 404s would look like lost resources)."""
    path.write_text(f'[parameters]\n"path.model_id" = "{model}"\n')
    return path


def _summary(output: str) -> tuple[int, list[str]]:
    """Test cases generated, and one line per failure kind, from Schemathesis' summary."""
    generated = re.search(r"(\d+) generated", output)
    kinds = re.findall(r"❌ (ST\d+ [^:\n]+: \d+)", output)
    errors = re.findall(r"🚫 ([A-Z][^:\n]+: \d+)", output)
    return (int(generated.group(1)) if generated else 0), kinds + errors


def run(base_url: str, logs: Path, *, examples: int, seed: int) -> tuple[dict[str, Any], list[str]]:
    """Run Schemathesis against ``base_url``; its figures, and a problem per failure kind."""
    model = httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"][0]["id"]
    config = _config(logs / "schemathesis.toml", model)
    here = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "contract_checks",
        "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]),
    }
    st = Path(sys.executable).with_name("st")
    command = [
        str(st),
        "--config-file",
        str(config),
        "run",
        f"{base_url}/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        ",".join(EXCLUDED_CHECKS),
        "--exclude-path-regex",
        "/unload$",  # the fuzzed model must stay loaded (unload has its own tests)
        "--request-timeout",
        "120",
        "--max-response-time",
        "120",  # a generation up to the context is legitimately slow on a CPU
        "--max-examples",
        str(examples),
        "--seed",
        str(seed),
        "--output-truncate",
        "true",
        "--warnings",
        "off",
    ]
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = round(time.monotonic() - started, 1)
    output = done.stdout + done.stderr
    (logs / "schemathesis.out").write_text(output)
    generated, failures = _summary(output)
    problems = [f"schemathesis: {line}" for line in failures]
    if done.returncode != 0 and not problems:
        problems.append(f"schemathesis exited {done.returncode}: {output[-2000:]}")
    if problems:
        print(output[-8000:])
    figures = {
        "test cases": generated,
        "seed": seed,
        "max examples per operation": examples,
        "seconds": seconds,
        "exit code": done.returncode,
    }
    return figures, problems
