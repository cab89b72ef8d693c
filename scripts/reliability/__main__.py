"""``make reliability``: fuzz, the OpenAPI contract (Schemathesis), concurrency waves,
disconnect storm, fault injection, soak.

Runs real ``mlxcore serve`` processes on the embedded default model (or ``--model``), the
fuzz, load and soak servers with one LoRA adapter (``--no-lora``: none),
prints the figures docs/reliability.md records, writes them as JSON (``--out``) and
exits non-zero when any part found a defect. ``--smoke`` is a two-minute subset.

    .venv/bin/python scripts/reliability [--smoke] [--soak-seconds 600] [--out FILE]
        [--keys N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import contract
import faults
import fuzz
import httpx
import load
from common import (
    MemorySampler,
    auth,
    greedy_reference,
    keys_flags,
    mb,
    metrics,
    report,
    sampled_works,
    serving,
    settle,
)

GIB = 2**30


SERVE_ARGS: list[str] = []
"""Extra ``mlxcore serve`` flags for every server of the run (``--serve-arg``)."""


LORA_ARGS: list[str] = []
"""The lora plugin's flags for the fuzz, load and soak servers (:func:`lora_args`)."""


def lora_args(logs: Path, model: str | None) -> list[str]:
    """Serve one LoRA adapter made for the model (its name is ``load.ADAPTER``, which the
    load mix then asks for) and the runtime adapter routes (which the fuzz reaches)."""
    from mlxcore.models.default import ensure_default_model
    from mlxcore_lora.testing import write_adapter

    load.ADAPTER = "reliability-adapter"
    folder = write_adapter(model or ensure_default_model(), logs / "adapter", seed=0, strength=0.01)
    return ["--plugin", "lora", "--lora", f"{load.ADAPTER}={folder}", "--allow-runtime-lora"]


@contextlib.contextmanager
def offline_hub(logs: Path) -> Any:
    """The server's Hugging Face Hub: a closed local port and a cache of its own, so the
    fuzz's pulls fail at once (503) and its deletes can only reach its own files."""
    saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HOME")}
    os.environ.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(logs / "hf-home"))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def empty_hub(logs: Path) -> Any:
    """The server's Hugging Face Hub: a local stand-in that has no repos, so a pull of
    any name is a documented 404 (the contract run checks every status it sees)."""
    from mlxcore.testing.hub import LocalHub

    hub = LocalHub({})
    saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HOME", "HF_HUB_OFFLINE")}
    os.environ.update(HF_ENDPOINT=hub.url, HF_HOME=str(logs / "hf-home"), HF_HUB_OFFLINE="0")
    try:
        yield
    finally:
        hub.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_fuzz(logs: Path, model: str | None, total: int) -> dict[str, Any]:
    with offline_hub(logs), serving(logs, model, *LORA_ARGS, *SERVE_ARGS) as server:
        before = greedy_reference(server)
        document = httpx.get(f"{server.base_url}/openapi.json", timeout=30, auth=auth()).json()
        models = httpx.get(f"{server.base_url}/v1/models", timeout=30, auth=auth())
        served = models.json()["data"][0]["id"]
        requests = fuzz.cases(document, total, seed=2026, served=served)
        started = time.monotonic()
        statuses, problems = asyncio.run(fuzz.send_all(server.base_url, requests, 16))
        after = greedy_reference(server)
        if after != before:
            problems.append(f"greedy output changed: {before!r} -> {after!r}")
        if not sampled_works(server):
            problems.append("sampled requests fail after the fuzz run")
        if not server.alive():
            problems.append("the server died")
        figures = {
            "requests": sum(statuses.values()),
            "statuses": dict(sorted(statuses.items())),
            "5xx (not 503)": sum(n for s, n in statuses.items() if s >= 500 and s != 503),
            "seconds": round(time.monotonic() - started, 1),
            "greedy unchanged": after == before,
        }
        return report("fuzz", figures, problems)


def run_contract(logs: Path, model: str | None, examples: int) -> dict[str, Any]:
    if model is None:  # the HTTP surface is the subject: a fast model with every parser
        from mlxcore.testing.models import build_test_model

        model = str(build_test_model(contract.DEFAULT_MODEL))
    with empty_hub(logs), serving(logs, model, *contract.SERVE_FLAGS, *SERVE_ARGS) as server:
        before = greedy_reference(server)
        figures, problems = contract.run(server.base_url, logs, examples=examples, seed=2026)
        if greedy_reference(server) != before:
            problems.append("greedy output changed after the contract run")
        if not server.alive():
            problems.append("the server died")
        return report("OpenAPI contract (schemathesis)", figures, problems)


def run_load(logs: Path, model: str | None, waves: list[int], storm: int) -> dict[str, Any]:
    parts: dict[str, Any] = {}
    with serving(logs, model, *LORA_ARGS, *SERVE_ARGS) as server:
        asyncio.run(load.warm_up(server.base_url))
        baseline = settle(server)
        m = metrics(server)
        pools = _bounded_pools(m)
        # the prefix cache counts at what it holds (checked against its budget below): an
        # auto budget is most of the machine, and would make the ceiling say nothing
        budgets = m.get("mlxcore_memory_weights_bytes", 0) + m.get(
            "mlxcore_memory_mlx_cache_limit_bytes", 0
        )
        parts["baseline"] = {"rss": mb(baseline), "weights + buffer cache": mb(budgets)}
        print(f"\nbaseline RSS after warm-up {mb(baseline)}; weights + buffer cache {mb(budgets)}")
        for n in waves:
            with MemorySampler(server) as sampler:
                result = asyncio.run(load.wave(server.base_url, n))
            after = settle(server)
            problems = result.pop("problems")
            if result["failed"]:
                problems.append(f"{result['failed']} requests failed")
            now = metrics(server)
            live_kv = now.get("mlxcore_memory_kv_reserved_peak_bytes", 0)
            held = now.get("mlxcore_prefix_cache_bytes", 0)
            allowed = now.get("mlxcore_memory_prefix_cache_budget_bytes", 0)
            ceiling = budgets + held + live_kv + GIB
            if held > allowed:
                problems.append(f"prefix cache holds {mb(held)}, over its budget {mb(allowed)}")
            if sampler.peak > ceiling:
                problems.append(f"peak RSS {mb(sampler.peak)} above {mb(ceiling)}")
            grown = _grown(after, baseline, _bounded_pools(metrics(server)) - pools)
            if grown:
                problems.append(f"RSS after the load: {grown}")
            figures = {
                **result,
                "peak_rss": mb(sampler.peak),
                "ceiling (weights + buffer cache + prefix cache + peak live KV + 1 GiB)": mb(
                    ceiling
                ),
                "rss_after": mb(after),
                "bounded_caches_growth": mb(_bounded_pools(metrics(server)) - pools),
                "prefix_cache (held / budget)": f"{mb(held)} / {mb(allowed)}",
            }
            parts[f"wave_{n}"] = report(f"{n} concurrent connections", figures, problems)
        with MemorySampler(server) as sampler:
            result = asyncio.run(load.disconnect_storm(server.base_url, storm))
        after = settle(server)
        problems = result.pop("problems")
        health = httpx.get(f"{server.base_url}/health", timeout=30).json()
        if health.get("running") or health.get("waiting"):
            problems.append(f"requests left behind after the storm: {health}")
        pooled = _bounded_pools(metrics(server)) - pools
        grown = _grown(after, baseline, pooled)
        if grown:
            problems.append(f"RSS after the storm: {grown}")
        figures = {
            **result,
            "peak_rss": mb(sampler.peak),
            "rss_after": mb(after),
            "bounded_caches_growth": mb(pooled),
        }
        parts["disconnect_storm"] = report(f"disconnect storm ({storm} streams)", figures, problems)
    return parts


def run_faults(logs: Path, model: str | None) -> dict[str, Any]:
    flags = ("--plugin", "mlxcore.testing.faults", "--engine-watchdog", str(faults.WATCHDOG))
    flags += ("--engine-max-restarts", "10")
    parts: dict[str, Any] = {}
    with serving(logs, model, *flags, *SERVE_ARGS) as server:
        before = greedy_reference(server)
        for fault in faults.FAULTS:
            result = asyncio.run(faults.scenario(server.base_url, fault))
            problems = result.pop("problems")
            parts[fault] = report(f"fault {fault}", result, problems)
        after = greedy_reference(server)
        if after != before:
            parts["greedy"] = report("greedy after faults", {}, [f"{before!r} -> {after!r}"])
    return parts


def run_soak(logs: Path, model: str | None, seconds: float) -> dict[str, Any]:
    with serving(logs, model, *LORA_ARGS, *SERVE_ARGS) as server:
        asyncio.run(load.warm_up(server.base_url))
        pools_before = _bounded_pools(metrics(server))
        with MemorySampler(server, period=1.0) as sampler:
            started = time.monotonic()
            result = asyncio.run(load.soak(server.base_url, seconds, 8))
            ended = time.monotonic()
        pools_after = _bounded_pools(metrics(server))
        first = sampler.mean_between(started, started + min(60.0, seconds / 10))
        last = sampler.mean_between(ended - min(60.0, seconds / 10), ended)
        growth = (last - first) / first if first else 0.0
        # the prefix cache and MLX's buffer cache fill up to their budgets over a soak:
        # growth they account for is bounded, the rest would be a leak
        pooled = pools_after - pools_before
        unexplained = (last - first - pooled) / first if first else 0.0
        problems = result.pop("problems")
        if result["failed"]:
            problems.append(f"{result['failed']} requests failed")
        if unexplained >= 0.05:
            problems.append(
                f"RSS grew {unexplained:.1%} beyond the bounded caches from the first to the "
                "last minute"
            )
        figures = {
            **result,
            "seconds": round(ended - started),
            "rss_first_minute": mb(first),
            "rss_last_minute": mb(last),
            "growth": f"{growth:+.2%}",
            "bounded_caches_growth": mb(pooled),
            "growth_beyond_bounded_caches": f"{unexplained:+.2%}",
            "peak_rss": mb(sampler.peak),
        }
        return report(f"soak ({seconds:.0f} s at concurrency 8)", figures, problems)


def _grown(after: float, baseline: float, pooled: float) -> str:
    """What is wrong when RSS after a phase is more than 10% above the baseline once the
    growth of the bounded caches (``pooled``: the prefix cache filling up to its budget, MLX's
    buffer cache) is taken out; empty when nothing is. A quantized KV cache, for example,
    leaves the prefix cache far below its byte budget after the warm-up, and it keeps
    filling during the waves."""
    if after - max(0.0, pooled) <= baseline * 1.10:
        return ""
    return (
        f"{mb(after)} > baseline {mb(baseline)} + 10% (the bounded caches grew {mb(pooled)} of it)"
    )


def _bounded_pools(values: dict[str, float]) -> float:
    """Bytes held by the server's budgeted caches: prefix cache entries and MLX's
    buffer cache (each capped by its own flag)."""
    return values.get("mlxcore_prefix_cache_bytes", 0.0) + values.get(
        "mlxcore_memory_cache_bytes", 0.0
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="reliability", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model to serve (default: embedded)")
    parser.add_argument("--smoke", action="store_true", help="a two-minute subset")
    parser.add_argument("--fuzz-requests", type=int, default=2200)
    parser.add_argument("--contract-examples", type=int, default=10)
    parser.add_argument("--soak-seconds", type=float, default=600.0)
    parser.add_argument("--only", nargs="*", default=["fuzz", "contract", "load", "faults", "soak"])
    parser.add_argument("--out", type=Path, default=Path("reliability-results.json"))
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="an extra `mlxcore serve` flag for every server "
        "(e.g. --serve-arg=--kv-cache-dtype=int8)",
    )
    parser.add_argument(
        "--no-lora",
        action="store_true",
        help="serve no LoRA adapter (by default the fuzz, load and soak servers serve one, "
        "and the load mix asks for it)",
    )
    parser.add_argument(
        "--keys",
        type=int,
        default=0,
        metavar="N",
        help="serve N API keys (the first an admin) and split every client's requests "
        "over them in turn (docs/security.md); the contract run uses an ordinary one",
    )
    args = parser.parse_args(argv)
    SERVE_ARGS[:] = args.serve_arg
    results_flags = {"serve_args": list(args.serve_arg), "keys": args.keys}
    if args.smoke:
        args.fuzz_requests, args.soak_seconds, args.contract_examples = 300, 30.0, 10
    waves, storm = ([50], 30) if args.smoke else ([200, 500], 100)
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), **results_flags}
    with tempfile.TemporaryDirectory(prefix="mlxcore-reliability-") as tmp:
        logs = Path(tmp)
        if args.keys:
            SERVE_ARGS.extend(keys_flags(logs, args.keys))
        if not args.no_lora:
            LORA_ARGS[:] = lora_args(logs, args.model)
            results["lora"] = {"adapter": load.ADAPTER}
        try:
            if "fuzz" in args.only:
                results["fuzz"] = run_fuzz(logs, args.model, args.fuzz_requests)
            if "contract" in args.only:
                results["contract"] = run_contract(logs, args.model, args.contract_examples)
            if "load" in args.only:
                results["load"] = run_load(logs, args.model, waves, storm)
            if "faults" in args.only:
                results["faults"] = run_faults(logs, args.model)
            if "soak" in args.only:
                results["soak"] = run_soak(logs, args.model, args.soak_seconds)
        finally:
            report = logs / "schemathesis.out"
            if report.exists():  # the whole report, beside the figures
                kept = args.out.with_name(args.out.stem + "-schemathesis.txt")
                kept.write_text(report.read_text(errors="replace"))
                print(f"\nSchemathesis' report: {kept}")
            for path in sorted(logs.glob("*.log")):
                text = path.read_text(errors="replace")
                if "Traceback" in text and "InjectedFault" not in text:
                    print(f"\n-- tracebacks in {path.name} (first 3000 chars):\n{text[:3000]}")
    args.out.write_text(json.dumps(results, indent=2, default=str))
    defects = _count(results)
    print(f"\n{defects} problem(s); figures in {args.out}")
    return 1 if defects else 0


def _count(node: Any) -> int:
    if isinstance(node, dict):
        own = len(node.get("problems", [])) if isinstance(node.get("problems"), list) else 0
        return own + sum(_count(v) for k, v in node.items() if k != "problems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
