"""Constrained tool calls on random-weight test models, per parser family, over HTTP
(issue 57, decision 0023; not part of ``make test``; docs/benchmarks.md, "Tool calls in
the model's own format").

For each family (:data:`mlxcore.testing.tool_call_cases.FAMILIES`: hermes on the tiny
qwen3, qwen3_coder on the tiny Qwen3.5, gemma4 on the tiny Gemma 4, minimax_m2 on the
tiny MiniMax-M2) a real ``mlxcore serve`` with default flags, then another with
``--tool-call-grammar off``, answers ``--requests`` Chat Completions requests with the
three tools of nested schemas, ``tool_choice: auto``, temperature 1.0, a different seed
each, and a ``logit_bias`` of ``--bias`` on the call opener, thinking off unless
``--thinking on`` (a random-weight model never closes a reasoning block). Every
returned call is checked against its tool's schema (``jsonschema``).

It fails unless, with the grammar on: no returned call is invalid, and at least
``--min-share`` (0.9) of the requests return a whole call. With ``--forced`` it also
sends ``tool_choice: required`` and a named choice (``--requests`` / 5 each, same
checks; a block of parallel calls cut by ``max_tokens`` returns none). The greedy check
(the text before a call is the same with the grammar on and off) is in the test suite
(tests/e2e/test_tool_call_grammar.py). ``--overhead`` measures decode speed with the
grammar on and off instead.

    .venv/bin/python scripts/tool_call_grammar.py [--families hermes qwen3_coder ...]
        [--requests 100] [--off-requests 20] [--forced] [--bias 12] [--json FILE]
    .venv/bin/python scripts/tool_call_grammar.py --overhead
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

from mlxcore.testing.models import build_test_model
from mlxcore.testing.server import ServerPool
from mlxcore.testing.tool_call_cases import FAMILIES, MESSAGES, TOOLS, Family, check_calls

THINKING = {"off": False, "on": True, "template": None}


def opener_id(server_url: str, opener: str) -> int:
    """The opener's token id, asked of the server (``/tokenize``)."""
    import httpx

    r = httpx.post(
        server_url.removesuffix("/v1") + "/tokenize",
        json={"prompt": opener, "add_special_tokens": False},
        timeout=30,
    )
    r.raise_for_status()
    tokens = r.json()["tokens"]
    if len(tokens) != 1:
        raise SystemExit(f"{opener!r} is {len(tokens)} tokens in this model, not one")
    return int(tokens[0])


def one_request(
    client: openai.OpenAI,
    bias: dict[str, int],
    seed: int,
    choice: Any,
    max_tokens: int,
    thinking: bool | None = None,
) -> dict[str, Any]:
    """One request; what came back (``thinking``: ``enable_thinking`` for the template,
    ``None``: the template's default)."""
    extra = {} if thinking is None else {"chat_template_kwargs": {"enable_thinking": thinking}}
    r = client.chat.completions.create(
        model="m",
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice=choice,
        temperature=1.0,
        seed=seed,
        max_tokens=max_tokens,
        logit_bias=bias,
        extra_body=extra,
    )
    message = r.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    checked = check_calls(calls)
    return {
        "calls": len(calls),
        "whole": checked.whole,
        "invalid": checked.invalid,
        "content": message.content or "",
        "finish": r.choices[0].finish_reason,
    }


def run_family(
    pool: ServerPool, family: Family, args: argparse.Namespace, grammar: str, count: int
) -> dict[str, Any]:
    """``count`` auto requests (and the forced ones) against one server."""
    model = build_test_model(family.arch)
    flags = ["--served-model-name", "m", "--tool-call-grammar", grammar]
    for plugin in family.plugins:
        flags += ["--plugin", plugin]
    server = pool(model, *flags)
    client = openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=600)
    bias = {str(opener_id(server.v1, family.opener)): args.bias}
    out: dict[str, Any] = {"grammar": grammar, "requests": count}
    started = time.perf_counter()
    choices: dict[str, Any] = {"auto": "auto"}
    if args.forced and grammar == "on":
        choices["required"] = "required"
        choices["named"] = {"type": "function", "function": {"name": "create_event"}}
    for label, choice in choices.items():
        with ThreadPoolExecutor(args.concurrency) as pool_:
            results = list(
                pool_.map(
                    lambda seed, choice=choice: one_request(
                        client, bias, seed, choice, args.max_tokens, THINKING[args.thinking]
                    ),
                    range(count if label == "auto" else max(count // 5, 1)),
                )
            )
        with_call = sum(1 for r in results if r["whole"] > 0)
        invalid = [msg for r in results for msg in r["invalid"]]
        out[label] = {
            "with_call": with_call,
            "requests": len(results),
            "calls": sum(r["calls"] for r in results),
            "whole_calls": sum(r["whole"] for r in results),
            "invalid": invalid[:10],
            "invalid_count": len(invalid),
            "finish": {
                f: sum(1 for r in results if r["finish"] == f)
                for f in {r["finish"] for r in results}
            },
        }
    out["seconds"] = round(time.perf_counter() - started, 1)
    server.stop()
    return out


def overhead(size: str, temperature: float, rounds: int = 5, tokens: int = 256) -> float:
    """Decode speed of a request with tools, grammar on / off, in process (tiny or small
    qwen3, free text: the processor's cost without a call); prints each round, returns
    the median ratio."""
    import statistics

    from mlxcore.engine.request import SamplingParams
    from mlxcore.request_builder import ChatPrompt, RequestSpec, build_generations
    from mlxcore.testing.runtime import make_runtime, submit_together

    model = build_test_model("qwen3", size=size)
    runtimes = {g: make_runtime(model, tool_call_grammar=g) for g in ("on", "off")}

    def speed(grammar: str, count: int) -> tuple[float, list[int]]:
        spec = RequestSpec(
            prompt=ChatPrompt(list(MESSAGES), list(TOOLS), {"enable_thinking": False}),
            sampling=SamplingParams(temperature=temperature, seed=1),
            new_id=lambda: "x",
            max_tokens=count,
        )
        (generation,) = build_generations(runtimes[grammar], spec)
        started = time.perf_counter()
        (result,) = submit_together(runtimes[grammar], [generation.request])
        return len(result.tokens) / (time.perf_counter() - started), result.tokens

    try:
        speed("on", 16), speed("off", 16)
        ratios = []
        for i in range(rounds):
            (on, a), (off, b) = speed("on", tokens), speed("off", tokens)
            ratios.append(on / off)
            print(f"{size} t={temperature} round {i}: on {on:.1f} off {off:.1f} tok/s, "
                  f"same tokens {a == b}")  # fmt: skip
        return statistics.median(ratios)
    finally:
        for rt in runtimes.values():
            rt.engine.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--off-requests", type=int, default=20)
    parser.add_argument("--bias", type=int, default=12, help="logit_bias on the opener")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--min-share", type=float, default=0.9)
    parser.add_argument("--forced", action="store_true", help="also required / named choices")
    parser.add_argument(
        "--thinking",
        choices=list(THINKING),
        default="off",
        help="enable_thinking sent to the template (default off: a random-weight model "
        "never closes a reasoning block the prompt opens)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--overhead",
        action="store_true",
        help="instead: decode speed with the grammar on vs off (tiny and small qwen3, "
        "greedy and sampled, in process)",
    )
    args = parser.parse_args()
    if args.overhead:
        for size in ("tiny", "small"):
            for temperature in (0.0, 1.0):
                ratio = overhead(size, temperature)
                print(f"{size} temperature {temperature}: median on/off {ratio:.3f}")
        return 0
    report: dict[str, Any] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as logs:
        pool = ServerPool(Path(logs))
        try:
            for name in args.families:
                family = FAMILIES[name]
                on = run_family(pool, family, args, "on", args.requests)
                off = run_family(pool, family, args, "off", args.off_requests)
                report[name] = {"on": on, "off": off}
                for label in ("auto", "required", "named"):
                    if label not in on:
                        continue
                    row = on[label]
                    share = row["with_call"] / row["requests"]
                    need = args.min_share
                    print(
                        f"{name:12} {label:8} grammar on : {row['with_call']:3}/{row['requests']} "
                        f"with a whole call, {row['whole_calls']} whole calls, "
                        f"{row['invalid_count']} invalid, finish {row['finish']}"
                    )
                    if row["invalid_count"]:
                        failures.append(f"{name} {label}: invalid calls {row['invalid']}")
                    if share < need:
                        failures.append(
                            f"{name} {label}: {share:.2f} of requests with a call < {need}"
                        )
                row = off["auto"]
                print(
                    f"{name:12} auto     grammar off: {row['with_call']:3}/{row['requests']} "
                    f"with a whole call, {row['calls']} calls, {row['invalid_count']} invalid"
                )
                sys.stdout.flush()
        finally:
            pool.close()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
