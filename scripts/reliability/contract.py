"""The server's /openapi.json as a contract, checked by stock Schemathesis.

Schemathesis (pinned in the dev group) generates requests from the document and runs
every check it has, unmodified and with no hooks: schema-valid requests must be
accepted (``positive_data_acceptance``), schema-violating ones refused with a 4xx
(``negative_data_rejection``), no response may be a 5xx or a status the document does
not list, and each response must match what the document says.

The document states every rule between fields that JSON Schema can state (``oneOf``,
``if``/``then``, bounds taken from the served model). A few refusals depend on what no
JSON Schema can express, and the document's 400 says so, each with its error code
(:data:`MODEL_DEPENDENT`). After the run, each failure Schemathesis reports is read
back: an ST202 (schema-valid request rejected) answered with one of those refusals is
counted apart and listed; anything else is a problem.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
from common import KEYS, auth

DEFAULT_MODEL = "qwen3"
"""What the contract part serves unless ``--model`` is given: the tiny Qwen3 test model
(seeded weights, the real 151K-token tokenizer, a thinking template, tool calls). The
contract is about the HTTP surface; on SmolLM2 the generations Schemathesis asks for take
hours on two cores, on this model minutes."""
SERVE_FLAGS = ("--max-model-len", "256")
"""A small context bounds the longest generation a drawn ``max_tokens`` can ask for."""
WORKERS = 2
"""Schemathesis' workers (the CI machine has two cores)."""

MODEL_DEPENDENT: dict[str, str] = {
    "model_not_supported": "a route for another kind of model than the one served",
    "context_length_exceeded": "the prompt's tokens and the budget do not fit the context "
    "(JSON Schema cannot count tokens)",
    "invalid_constraint": "a grammar, regular expression or schema the constraint compiler "
    "refuses, or a tool_choice naming a function not in tools",
}
"""Error codes of refusals no JSON Schema can state (see the document's 400)."""
NUMBER_RULES = (
    ("min_tokens", "max_tokens"),
    ("text_2", "as long as each other"),
)
"""Rules between two numbers (``min_tokens`` at most the budget; /score's two lists as
long as each other): (the field the 400 names, words of its message)."""
ANTHROPIC_WORDS = ("model's context", "not in tools (")
"""The same refusals in Anthropic's error shape (which has no code), by their words."""
OLLAMA_WORDS = ("model's context", "does not take images", "format: ")
"""The same in Ollama's (``{"error": message}``): the context, images on a model without
a vision plugin, a ``format`` schema the compiler refuses."""


@attrs.frozen
class Failure:
    """One failure as Schemathesis prints it."""

    operation: str
    checks: tuple[str, ...]
    status: int | None
    body: str

    def model_dependent(self) -> str | None:
        """The reason when this is an ST202 refused for what no JSON Schema states, or a
        request the server turned away as overloaded (:data:`OVERLOADED`)."""
        if self.status == 503 and set(self.checks) <= {"ST101", "ST112"}:
            return OVERLOADED if '"code":"overloaded"' in self.body.replace(" ", "") else None
        if self.checks != ("ST202",) or self.status != 400:
            return None
        try:
            answer = json.loads(self.body)
        except ValueError:
            return None
        error = answer.get("error") if isinstance(answer, dict) else None
        if isinstance(error, str) and any(w in error for w in OLLAMA_WORDS):
            return "ollama: " + error[:60]
        if not isinstance(error, dict):
            return None
        code, param, message = error.get("code"), error.get("param"), str(error.get("message"))
        if code in MODEL_DEPENDENT:
            return str(code)
        for field, words in NUMBER_RULES:
            if param == field and words in message:
                return f"{field} ({words})"
        if answer.get("type") == "error" and any(w in message for w in ANTHROPIC_WORDS):
            return "anthropic: " + message[:60]
        return None


OVERLOADED = (
    "overloaded: waited past --max-queue-wait (a drawn priority at --background-priority "
    "or above waits for idle capacity, which two workers never leave): the documented 503 "
    "with Retry-After"
)
"""A 503 the document lists for every generation route: not a defect, as in the fuzz."""


_OPERATION = re.compile(r"^_{3,} ([A-Z]+ \S+) _{3,}$")
_CHECK = re.compile(r"^- (ST\d+) ")
_STATUS = re.compile(r"^\[(\d{3})\] ")


def failures(output: str) -> list[Failure]:
    """The failures in Schemathesis' report (one per test case)."""
    found: list[Failure] = []
    operation, checks, status, body = "", [], None, ""

    def close() -> None:
        if checks:
            found.append(Failure(operation, tuple(checks), status, body))

    lines = output.splitlines()
    for i, line in enumerate(lines):
        if (m := _OPERATION.match(line)) is not None:
            close()
            operation, checks, status, body = m.group(1), [], None, ""
        elif re.match(r"^\d+\. Test Case ID:", line):
            close()
            checks, status, body = [], None, ""
        elif (m := _CHECK.match(line)) is not None:
            checks.append(m.group(1))
        elif (m := _STATUS.match(line)) is not None and operation:
            status = int(m.group(1))
            for after in lines[i + 1 : i + 4]:
                text = after.strip()
                if text.startswith("`") and text.endswith("`"):
                    body = text.strip("`")
                    break
        elif line.startswith("=" * 10):
            close()
            checks = []
    return found


def _config(path: Path, model: str) -> Path:
    """Schemathesis' configuration: the served model for ``{model_id}``. A response id is
    left to the stateful phase, which reads it from a created response (a fixed one would
    be deleted by the first DELETE, and later 404s would look like lost resources)."""
    path.write_text(f'[parameters]\n"path.model_id" = "{model}"\n')
    return path


def run(base_url: str, logs: Path, *, examples: int, seed: int) -> tuple[dict[str, Any], list[str]]:
    """Run Schemathesis against ``base_url``; its figures, and a problem per failure that
    is not one of the refusals the document names as beyond JSON Schema."""
    model = httpx.get(f"{base_url}/v1/models", timeout=30, auth=auth()).json()["data"][0]["id"]
    config = _config(logs / "schemathesis.toml", model)
    st = Path(sys.executable).with_name("st")
    command = [
        str(st), "--config-file", str(config), "run", f"{base_url}/openapi.json",
        "--checks", "all",
        "--exclude-path-regex", "/unload$",  # the model must stay loaded (own tests)
        "--request-timeout", "120",
        "--max-response-time", "120",  # a generation up to the context is slow on a CPU
        "--max-examples", str(examples),
        "--seed", str(seed),
        "--workers", str(WORKERS),
        "--continue-on-failure",  # every failure reported, not the first per operation
        "--output-truncate", "true",
        "--warnings", "off",
    ]  # fmt: skip
    if KEYS:  # an ordinary key: the admin routes' 403 is checked against the document
        command += ["--header", f"Authorization: Bearer {KEYS[-1]}"]
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "SCHEMATHESIS_HOOKS"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = round(time.monotonic() - started, 1)
    output = done.stdout + done.stderr
    (logs / "schemathesis.out").write_text(output)
    generated = re.search(r"(\d+) generated", output)
    found = failures(output)
    beyond = [f"{f.operation}: {f.model_dependent()}" for f in found if f.model_dependent()]
    problems = [
        f"schemathesis: {f.operation} {'/'.join(f.checks)} [{f.status}] {f.body[:200]}"
        for f in found
        if not f.model_dependent()
    ]
    if done.returncode != 0 and not found:
        problems.append(f"schemathesis exited {done.returncode}: {output[-2000:]}")
    if problems:
        print(output[-8000:])
    figures = {
        "test cases": int(generated.group(1)) if generated else 0,
        "seed": seed,
        "max examples per operation": examples,
        "workers": WORKERS,
        "seconds": seconds,
        "failures": len(found),
        "refusals beyond JSON Schema (ST202, listed)": sorted(beyond),
    }
    return figures, problems
