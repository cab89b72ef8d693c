"""``mlxcore bench --peer URL``: mlxcore next to another OpenAI-compatible server, alternating.

The bench starts ``mlxcore serve`` on the model (as every bench mode does); the peer
(``mlx_lm.server``, vllm-mlx, anything that speaks ``/v1/chat/completions`` with streaming)
is already running, on the same model, started by the user. Both stay up for the whole run.
Every workload of :mod:`~mlxcore.bench.scenarios` runs on both, one right after the other,
in alternating order (A B, B A, A B ...), so a change in the machine's load falls on both
sides of a pair; each pair gives one ratio per metric and the report shows the median of
those ratios (``mlxcore / peer``: above 1 is better for throughput, below 1 for latency).

Every cold prompt is new text for each side and each round (a fresh seed word at its start),
so neither server can serve it from a cache filled earlier in the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import re
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import httpx

from mlxcore.bench import client, report, scenarios, workloads
from mlxcore.bench.options import BenchSettings, settings_from_args
from mlxcore.bench.server import bench_server
from mlxcore.errors import MlxcoreError, UsageError

log = logging.getLogger(__name__)

WORKLOADS = ("uniform", "mixed", "shared-prefix")
SIDES = ("mlxcore", "peer")


@attrs.frozen
class PeerSettings:
    """What ``--peer`` runs beyond the common bench settings.

    Attributes:
        url: the peer's base URL (``http://127.0.0.1:8080``).
        model: the model name to send to the peer (None: the path mlxcore serves).
        workloads: which of :data:`WORKLOADS` to run.
        rounds: pairs per workload and level.
        mixed: the mixed workload's shape.
        sessions: requests of the shared-prefix workload.
    """

    url: str
    model: str | None = None
    workloads: tuple[str, ...] = WORKLOADS
    rounds: int = 4
    mixed: scenarios.MixedSpec = attrs.field(factory=scenarios.MixedSpec)
    sessions: int = 16
    sampling: dict[str, Any] = attrs.field(factory=dict)
    """Sampling fields for every request on both sides (greedy when empty)."""


def add_peer_options(parser: argparse.ArgumentParser) -> None:
    """``--peer`` and the shapes of its workloads."""
    group = parser.add_argument_group("mlxcore vs another server")
    group.add_argument(
        "--peer",
        default=None,
        metavar="URL",
        help="base URL of another OpenAI-compatible server already running on the same model "
        "(e.g. mlx_lm.server): run every workload on both, alternating",
    )
    group.add_argument(
        "--peer-model", default=None, help="model name to send to the peer (default: the path)"
    )
    group.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        metavar="LIST",
        help=f"with --peer: which workloads ({','.join(WORKLOADS)})",
    )
    group.add_argument(
        "--rounds", type=int, default=4, help="with --peer: pairs per workload and level (4)"
    )
    group.add_argument(
        "--sampling",
        default=None,
        metavar="JSON",
        help="with --peer: sampling fields for every request on both sides, e.g. "
        '\'{"temperature": 0.8, "top_p": 0.95}\' (default: greedy)',
    )
    group.add_argument(
        "--long-prompt-tokens",
        type=int,
        default=8000,
        help="with --peer: the cold prompt of the mixed workload (8000)",
    )


def _peer_settings(args: argparse.Namespace) -> PeerSettings:
    chosen = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown or not chosen:
        raise UsageError(f"--workloads: choose from {', '.join(WORKLOADS)} (got {unknown})")
    if args.rounds < 1 or args.long_prompt_tokens < 16:
        raise UsageError("--rounds must be ≥ 1 and --long-prompt-tokens ≥ 16")
    sampling = _sampling_fields(args.sampling)
    return PeerSettings(
        sampling=sampling,
        url=args.peer.rstrip("/"),
        model=args.peer_model,
        workloads=chosen,
        rounds=args.rounds,
        mixed=scenarios.MixedSpec(long_tokens=args.long_prompt_tokens),
    )


SAMPLING_FIELDS = frozenset({"temperature", "top_p", "top_k", "min_p", "seed"})


def _sampling_fields(text: str | None) -> dict[str, Any]:
    """``--sampling``'s JSON object, checked against :data:`SAMPLING_FIELDS`."""
    if text is None:
        return {}
    try:
        fields = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--sampling: not JSON ({exc})") from exc
    if not isinstance(fields, dict) or not set(fields) <= SAMPLING_FIELDS:
        raise UsageError(f"--sampling: a JSON object of {', '.join(sorted(SAMPLING_FIELDS))}")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in fields.values()):
        raise UsageError("--sampling: every value is a number")
    return fields


async def _processed_tokens(http: httpx.AsyncClient, target: client.HttpTarget) -> float | None:
    """mlxcore's ``prompt_tokens_processed`` gauge (None for a server without it)."""
    try:
        text = (await http.get(f"{target.base_url}/metrics")).text
    except httpx.HTTPError:
        return None
    m = re.search(r"^mlxcore_prompt_tokens_processed (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else None


GAUGES = re.compile(r"^mlxcore_(distributed_\w+|memory_weights_bytes) (\S+)$", re.MULTILINE)
"""The gauges a report keeps of each side: weights, and a distributed group's ranks,
per-rank weights and time in the per-step collectives."""


RANK_WEIGHTS = re.compile(r"distributed_rank\d+_weights_bytes$")


def server_gauges(base_url: str) -> dict[str, float]:
    """Weights and distributed gauges from an mlxcore server's ``/metrics`` (empty for
    other servers), with the collective time per step in ms when it ran distributed."""
    try:
        text = httpx.get(f"{base_url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    gauges = {name: float(value) for name, value in GAUGES.findall(text)}
    steps = gauges.get("distributed_steps", 0.0)
    if steps:
        seconds = gauges.get("distributed_collective_seconds", 0.0)
        gauges["distributed_collective_ms_per_step"] = round(1000 * seconds / steps, 4)
    return gauges


class _Run:
    """One alternating run: the targets, the prompts' random source, the pairs so far."""

    def __init__(
        self,
        targets: dict[str, client.HttpTarget],
        settings: BenchSettings,
        peer: PeerSettings,
        count_tokens: Callable[[str], int],
        rng: random.Random,
    ) -> None:
        self.targets = targets
        self.settings = settings
        self.peer = peer
        self.count_tokens = count_tokens
        self.rng = rng
        self.pairs: dict[str, list[dict[str, dict[str, Any]]]] = {}

    async def pair(
        self,
        name: str,
        index: int,
        measure: Callable[[client.HttpTarget], Awaitable[dict[str, Any]]],
        settle: float = 0.5,
    ) -> None:
        """Measure ``name`` on both sides (order alternating with ``index``)."""
        order = SIDES if index % 2 == 0 else tuple(reversed(SIDES))
        pair: dict[str, dict[str, Any]] = {}
        for side in order:
            pair[side] = await measure(self.targets[side])
            log.info("%s round %d, %s: %s", name, index + 1, side, _brief(pair[side]))
            await asyncio.sleep(settle)
        self.pairs.setdefault(name, []).append(pair)

    async def run(self) -> None:
        s, p = self.settings, self.peer
        # a new connection per request: http.server-based peers close them unpredictably
        async with client.http_client(256, keepalive=False) as http:
            for side in SIDES:  # warm-up: both compiled, both connections open
                await scenarios.uniform(http, self.targets[side], 2, 4)
            for r in range(p.rounds):
                if "uniform" in p.workloads:
                    levels = s.concurrency if r % 2 == 0 else tuple(reversed(s.concurrency))
                    for n in levels:

                        async def level(t: client.HttpTarget, n: int = n) -> dict[str, Any]:
                            return await scenarios.uniform(http, t, n, s.max_tokens)

                        await self.pair(f"uniform-{n}", r, level)
                if "mixed" in p.workloads:
                    await self.pair("mixed", r, lambda t: self._mixed(http, t), settle=1.0)
                if "shared-prefix" in p.workloads:
                    await self.pair("shared-prefix", r, lambda t: self._shared(http, t))

    async def _mixed(self, http: httpx.AsyncClient, target: client.HttpTarget) -> dict[str, Any]:
        spec = self.peer.mixed
        text, _ = workloads.long_prefix(self.count_tokens, spec.long_tokens, self.rng)
        long_messages = workloads.prefix_messages(text, workloads.COLD_QUESTION)
        shorts = scenarios.short_burst(spec.burst, workloads.seed_word(self.rng))
        return await scenarios.mixed(http, target, spec, long_messages, shorts)

    async def _shared(self, http: httpx.AsyncClient, target: client.HttpTarget) -> dict[str, Any]:
        text, _ = workloads.long_prefix(self.count_tokens, self.settings.prefix_tokens, self.rng)
        before = await _processed_tokens(http, target)
        out = await scenarios.shared_prefix(
            http, target, text, self.peer.sessions, self.settings.followup_max_tokens
        )
        after = await _processed_tokens(http, target)
        if before is not None and after is not None:
            out["prompt_tokens_processed"] = int(after - before)
        return out


def _brief(values: dict[str, Any]) -> str:
    keys = [k for k in values if k.endswith(("_s", "tok_s"))][:6]
    return ", ".join(f"{k}={values[k]}" for k in keys)


def summarize(pairs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per side the median of each metric; per metric the median of the pairs' ratios."""
    sides = {
        side: {
            k: round(statistics.median(p[side][k] for p in pairs), 6)
            for k, v in pairs[0][side].items()
            if isinstance(v, int | float)
        }
        for side in SIDES
    }
    ratios: dict[str, float] = {}
    for key in sides["mlxcore"]:
        values = [
            p["mlxcore"][key] / p["peer"][key]
            for p in pairs
            if key in p["peer"] and p["peer"][key] > 0 and p["mlxcore"][key] > 0
        ]
        if values:
            ratios[key] = round(statistics.median(values), 3)
    return {**sides, "ratios": ratios, "pairs": pairs}


def run_peer(settings: BenchSettings, peer: PeerSettings) -> dict[str, Any]:
    """Start mlxcore on the model and run the workloads on it and on the peer, alternating."""
    from mlxcore.runtime import resolve_model_path

    started = time.perf_counter()
    load_start = report.load_average()
    seed = settings.seed if settings.seed is not None else secrets.randbits(32)
    source, resolved = resolve_model_path(settings.model)
    count_tokens = workloads.token_counter(resolved.path)
    with bench_server(str(resolved.path), settings) as server:
        server.start(settings.startup_timeout)
        targets = {
            "mlxcore": attrs.evolve(server.target(), sampling=peer.sampling),
            "peer": client.HttpTarget(
                peer.url, peer.model or str(resolved.path), sampling=peer.sampling
            ),
        }
        run = _Run(targets, settings, peer, count_tokens, random.Random(seed))
        try:
            asyncio.run(run.run())
        except (httpx.HTTPError, MlxcoreError, ValueError, KeyError, TimeoutError) as exc:
            raise server.failure("the peer comparison", exc) from exc
        openblas = server.openblas
        gauges = {side: server_gauges(target.base_url) for side, target in targets.items()}
    return {
        "machine": report.machine_facts(openblas, load_start),
        "model": {"source": source, "path": str(resolved.path)},
        "peer": {"url": peer.url, "model": targets["peer"].model},
        "settings": {
            "rounds": peer.rounds,
            "sampling": peer.sampling or {"temperature": 0.0},
            "workloads": list(peer.workloads),
            "concurrency": list(settings.concurrency),
            "max_tokens": settings.max_tokens,
            "mixed": attrs.asdict(peer.mixed),
            "shared_prefix": {
                "sessions": peer.sessions,
                "prefix_tokens": settings.prefix_tokens,
                "max_tokens": settings.followup_max_tokens,
            },
            "serve_args": list(settings.serve_args),
            "seed": seed,
        },
        "workloads": {name: summarize(pairs) for name, pairs in run.pairs.items()},
        "server_gauges": gauges,
        "elapsed_s": round(time.perf_counter() - started, 2),
    }


#: The metrics shown in the table, per workload kind.
_SHOWN = {
    "uniform": ("aggregate_tok_s", "stream_decode_tok_s", "ttft_p50_s", "itl_p50_s", "itl_p99_s"),
    "mixed": ("running_itl_p50_s", "running_itl_p99_s", "long_ttft_s", "short_ttft_p50_s"),
    "shared-prefix": ("ttft_p50_s", "ttft_p99_s", "prompt_tokens_processed", "prompt_tokens"),
}


def format_peer(result: dict[str, Any]) -> str:
    """The human-readable table: per workload, each side's medians and the ratio."""
    m, s = result["machine"], result["settings"]
    lines = [
        f"mlxcore bench --peer {result['peer']['url']} (peer model {result['peer']['model']})",
        f"model {result['model']['path']}; serve args: {' '.join(s['serve_args']) or '-'}",
        f"machine: {m['cpu_count']} CPUs, {m['platform']}, mlx {m['mlx']}, OpenBLAS (mlxcore) "
        f"{m['server_openblas_preloaded']}, load {m['load_average_start']} -> "
        f"{m['load_average_end']}",
        f"{s['rounds']} alternating rounds; ratio = median over rounds of mlxcore/peer "
        "(throughput: higher is better; latency: lower is better)",
        "",
        f"{'workload':<16} {'metric':<26} {'mlxcore':>10} {'peer':>10} {'ratio':>7}",
    ]
    for side, gauges in result.get("server_gauges", {}).items():
        if "distributed_ranks" in gauges:
            shares = [v for k, v in sorted(gauges.items()) if RANK_WEIGHTS.match(k)]
            lines.insert(
                -2,
                f"{side}: {gauges['distributed_ranks']:.0f} ranks, collective "
                f"{gauges.get('distributed_collective_ms_per_step', 0):.3f} ms per step, weights "
                f"per rank {', '.join(f'{b / 2**20:.1f} MiB' for b in shares)}",
            )
    for name, summary in result["workloads"].items():
        kind = name.split("-")[0] if name.startswith("uniform") else name
        for key in _SHOWN.get(kind, ()):
            if key not in summary["mlxcore"]:
                continue
            ours, theirs = summary["mlxcore"][key], summary["peer"].get(key)
            r = summary["ratios"].get(key)
            lines.append(
                f"{name:<16} {key:<26} {ours:>10.3f} "
                f"{'-' if theirs is None else f'{theirs:>10.3f}':>10} "
                f"{'-' if r is None else f'{r:.2f}x':>7}"
            )
    return "\n".join(lines)


def main_peer(args: argparse.Namespace) -> int:
    """Run ``mlxcore bench --peer``; print the table (or JSON)."""
    settings = settings_from_args(args)
    if args.concurrency is None:
        settings = attrs.evolve(settings, concurrency=(1, 8, 16, 32))
    if args.max_tokens is None:
        settings = attrs.evolve(settings, max_tokens=128)
    result = run_peer(settings, _peer_settings(args))
    text = json.dumps(result, indent=2)
    if settings.output is not None:
        settings.output.write_text(text + "\n")
        log.info("wrote %s", settings.output)
    print(text if settings.json else format_peer(result))
    sys.stdout.flush()
    return 0
