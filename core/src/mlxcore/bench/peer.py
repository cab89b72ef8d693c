"""``mlxcore bench --peer URL``: mlxcore next to other OpenAI-compatible servers, in turns.

The bench starts ``mlxcore serve`` on the model (as every bench mode does); each peer
(``mlx_lm.server``, vllm-mlx, Rapid-MLX, anything that speaks ``/v1/chat/completions`` with
streaming) is already running, on the same model, started by the user; ``--peer`` repeats
(``--peer mlx-lm=URL --peer vllm-mlx=URL``) to put several in one table. All stay up for the
whole run. Every workload of :mod:`~mlxcore.bench.scenarios` runs on each side, one right
after the other, the order rotating per round (A B C, B C A, C A B ...), so a change in the
machine's load falls on every side of a round; each round gives one ratio per metric and
peer, and the report shows the median of those ratios (``mlxcore / peer``: above 1 is better
for throughput, below 1 for latency).

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
OURS = "mlxcore"


@attrs.frozen
class Peer:
    """One other server: its name in the report, base URL and model name (None: the path
    mlxcore serves)."""

    name: str
    url: str
    model: str | None = None


@attrs.frozen
class PeerSettings:
    """What ``--peer`` runs beyond the common bench settings.

    Attributes:
        peers: the other servers, in the report's order.
        workloads: which of :data:`WORKLOADS` to run.
        rounds: rounds per workload and level (each side once per round).
        mixed: the mixed workload's shape.
        sessions: requests of the shared-prefix workload.
    """

    peers: tuple[Peer, ...]
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
        action="append",
        default=None,
        metavar="[NAME=]URL",
        help="base URL of another OpenAI-compatible server already running on the same model "
        "(e.g. mlx_lm.server): run every workload on each, in turns; repeat for several "
        "peers in one table (NAME labels its column; default peer, peer2, ...)",
    )
    group.add_argument(
        "--peer-model",
        action="append",
        default=None,
        metavar="[NAME=]MODEL",
        help="model name to send to a peer (NAME=MODEL for one peer, MODEL for all; "
        "default: the path)",
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
        peers=parse_peers(args.peer or [], args.peer_model or []),
        workloads=chosen,
        rounds=args.rounds,
        mixed=scenarios.MixedSpec(long_tokens=args.long_prompt_tokens),
    )


def _named(text: str) -> tuple[str | None, str]:
    """``NAME=VALUE`` → (NAME, VALUE); a value alone (a URL's ``://`` is no name) → (None, it)."""
    name, sep, value = text.partition("=")
    if sep and name and "/" not in name and ":" not in name:
        return name.strip(), value.strip()
    return None, text.strip()


def parse_peers(urls: list[str], models: list[str]) -> tuple[Peer, ...]:
    """The ``--peer`` and ``--peer-model`` values as :class:`Peer` s (names unique and not
    ``mlxcore``; a model without a name applies to every peer)."""
    peers: list[Peer] = []
    for i, text in enumerate(urls):
        name, url = _named(text)
        name = name or ("peer" if i == 0 else f"peer{i + 1}")
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--peer {text!r}: a base URL (http://host:port), optionally NAME=URL")
        if name == OURS or name in {p.name for p in peers}:
            raise UsageError(f"--peer {text!r}: the name {name!r} is taken")
        peers.append(Peer(name, url.rstrip("/")))
    for text in models:
        name, model = _named(text)
        if name is not None and name not in {p.name for p in peers}:
            raise UsageError(f"--peer-model {text!r}: no peer is named {name!r}")
        peers = [attrs.evolve(p, model=model) if name in (None, p.name) else p for p in peers]
    return tuple(peers)


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
        self.sides = tuple(targets)
        self.pairs: dict[str, list[dict[str, dict[str, Any]]]] = {}

    async def pair(
        self,
        name: str,
        index: int,
        measure: Callable[[client.HttpTarget], Awaitable[dict[str, Any]]],
        settle: float = 0.5,
    ) -> None:
        """Measure ``name`` on every side (the order rotating with ``index``)."""
        order = turn_order(self.sides, index)
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
            for side in self.sides:  # warm-up: all compiled, all connections open
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


def turn_order(sides: tuple[str, ...], index: int) -> tuple[str, ...]:
    """Round ``index``'s order: the sides rotated by it (two sides alternate: A B, B A)."""
    k = index % len(sides)
    return sides[k:] + sides[:k]


def summarize(pairs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per side the median of each metric; per peer and metric the median of the rounds'
    ratios ``mlxcore / peer`` (``ratios[peer][metric]``)."""
    names = list(pairs[0])
    sides = {
        side: {
            k: round(statistics.median(p[side][k] for p in pairs), 6)
            for k, v in pairs[0][side].items()
            if isinstance(v, int | float)
        }
        for side in names
    }
    ratios: dict[str, dict[str, float]] = {}
    for peer in (n for n in names if n != OURS):
        ratios[peer] = {}
        for key in sides[OURS]:
            values = [
                p[OURS][key] / p[peer][key]
                for p in pairs
                if key in p[peer] and p[peer][key] > 0 and p[OURS][key] > 0
            ]
            if values:
                ratios[peer][key] = round(statistics.median(values), 3)
    return {**sides, "ratios": ratios, "pairs": pairs}


def run_peer(settings: BenchSettings, peer: PeerSettings) -> dict[str, Any]:
    """Start mlxcore on the model and run the workloads on it and on each peer, in turns."""
    from mlxcore.runtime import resolve_model_path

    started = time.perf_counter()
    load_start = report.load_average()
    seed = settings.seed if settings.seed is not None else secrets.randbits(32)
    source, resolved = resolve_model_path(settings.model)
    count_tokens = workloads.token_counter(resolved.path)
    with bench_server(str(resolved.path), settings) as server:
        server.start(settings.startup_timeout)
        targets = {OURS: attrs.evolve(server.target(), sampling=peer.sampling)}
        for other in peer.peers:
            model = other.model or str(resolved.path)
            targets[other.name] = client.HttpTarget(other.url, model, sampling=peer.sampling)
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
        "peers": [
            {"name": p.name, "url": p.url, "model": targets[p.name].model} for p in peer.peers
        ],
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
    """The human-readable table: per workload, each side's medians and the ratio to each
    peer."""
    m, s = result["machine"], result["settings"]
    peers = result["peers"]
    names = [p["name"] for p in peers]
    width = max(10, *(len(n) + 3 for n in names))
    lines = [
        "mlxcore bench --peer "
        + ", ".join(f"{p['name']}={p['url']} (model {p['model']})" for p in peers),
        f"model {result['model']['path']}; serve args: {' '.join(s['serve_args']) or '-'}",
        f"machine: {m['cpu_count']} CPUs, {m['platform']}, mlx {m['mlx']} on "
        f"{report.device_text(m)}, OpenBLAS (mlxcore) {m['server_openblas_preloaded']}, "
        f"load {m['load_average_start']} -> {m['load_average_end']}",
        f"{s['rounds']} rounds, the order rotating; ratio = median over rounds of "
        "mlxcore/peer (throughput: higher is better; latency: lower is better)",
        "",
        f"{'workload':<16} {'metric':<26} {OURS:>{width}}"
        + "".join(f" {n:>{width}}" for n in names)
        + "".join(f" {'vs ' + n:>{width}}" for n in names),
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
            if key not in summary[OURS]:
                continue
            cells = [_cell(summary[OURS][key], width)]
            cells += [_cell(summary.get(n, {}).get(key), width) for n in names]
            for n in names:
                r = summary["ratios"].get(n, {}).get(key)
                cells.append(f"{'-' if r is None else f'{r:.2f}x':>{width}}")
            lines.append(f"{name:<16} {key:<26} " + " ".join(cells))
    return "\n".join(lines)


def _cell(value: float | None, width: int) -> str:
    return f"{'-' if value is None else f'{value:.3f}':>{width}}"


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
