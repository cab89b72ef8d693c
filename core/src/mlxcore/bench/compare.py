"""``mlxcore bench --compare-body JSON``: one server, a feature on vs off, side by side.

A plugin's feature (MTP speculation, SpecPrefill...) is on for the server started with its
flags; the same server also serves requests whose body carries extra fields that turn the
feature off for that request (``{"speculative": false}``,
``{"specprefill": {"enabled": false}}``). This mode sends both kinds of request, alternating,
at every concurrency level, and reports decode tok/s, aggregate tok/s and time to first
token of each side and their ratios: the median of the per-repeat ratios (the on and off
runs of a repeat run back to back, so a swing in the machine's load between repeats
cancels out) and the ratio of the two sides' medians. Both sides share the model, the
process and the machine's load at the moment, so the ratio is the feature's effect.

With ``--prompt-tokens N`` every request gets a new prompt of about N tokens that nothing
served before shares (a fresh seed word at its start), so TTFT is a cold prefill each time;
otherwise the requests are the long-writing prompts of the decode measurements.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs
import httpx

from mlxcore.bench import client, report, workloads
from mlxcore.bench.options import BenchSettings, settings_from_args
from mlxcore.bench.results import median_of, ratio
from mlxcore.bench.server import bench_server
from mlxcore.errors import MlxcoreError

log = logging.getLogger(__name__)

SIDES = ("on", "off")


@attrs.frozen
class CompareSettings:
    """What the comparison needs beyond the common bench settings.

    Attributes:
        off_body: the request-body fields that turn the feature off.
        prompt_tokens: the length of each (cold, unique) prompt; None: the writing prompts.
        edit: every request asks for a ~2,000-token file back with one change.
    """

    off_body: dict[str, Any]
    prompt_tokens: int | None = None
    edit: bool = False


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict) or not value:
        raise argparse.ArgumentTypeError(f"expected a non-empty JSON object, got {text!r}")
    return value


def add_compare_options(parser: argparse.ArgumentParser) -> None:
    """``--compare-body``, ``--prompt-tokens`` and ``--edit-prompt``."""
    group = parser.add_argument_group("feature on vs off")
    group.add_argument(
        "--compare-body",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="request-body fields that turn a feature off, e.g. '{\"speculative\": false}': "
        "run only the on/off comparison on one server (its flags come from --serve-arg/--plugin)",
    )
    group.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        metavar="N",
        help="with --compare-body: give every request a new, cold prompt of about N tokens "
        "(measures prefill / TTFT); default: the long-writing prompts",
    )
    group.add_argument(
        "--edit-prompt",
        action="store_true",
        help="with --compare-body: every request holds a ~2,000-token Python file and asks "
        "for it back with one change (an edit workload: most of the answer is in the prompt)",
    )


def _messages_factory(
    settings: CompareSettings, count_tokens: Callable[[str], int] | None, rng: random.Random
) -> Callable[[int], list[workloads.Message]]:
    if settings.edit:
        return workloads.edit_messages
    if settings.prompt_tokens is None:
        return workloads.writing_messages
    assert count_tokens is not None
    target = settings.prompt_tokens

    def cold(index: int) -> list[workloads.Message]:
        text, _ = workloads.long_prefix(count_tokens, target, rng)
        return workloads.prefix_messages(text, workloads.COLD_QUESTION)

    return cold


async def _batch(
    http: httpx.AsyncClient,
    target: client.HttpTarget,
    prompts: list[list[workloads.Message]],
    max_tokens: int,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """``len(prompts)`` concurrent streams with the same ``extra`` body fields."""
    runs, summary = await client.concurrent_streams(http, target, prompts, max_tokens, extra)
    return {
        **summary,
        "prompt_tokens_median": median_of([r.prompt_tokens for r in runs]),
        "cached_tokens_max": max(r.cached_tokens for r in runs),
        "usage_extra": [r.usage_extra for r in runs],
    }


def _extras_summary(extras: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the numeric extension fields; value counts of the others."""
    numbers: dict[str, list[float]] = {}
    others: dict[str, dict[str, int]] = {}
    for extra in extras:
        for key, value in extra.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                counts = others.setdefault(key, {})
                counts[str(value)] = counts.get(str(value), 0) + 1
            else:
                numbers.setdefault(key, []).append(float(value))
    out: dict[str, Any] = {k: round(statistics.median(v), 4) for k, v in numbers.items()}
    out.update({k: v for k, v in others.items()})
    return out


def _side_summary(reps: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float:
        return median_of([r[key] for r in reps])

    return {
        "aggregate_tok_s": round(med("aggregate_tok_s"), 3),
        "stream_decode_tok_s_median": round(med("stream_decode_tok_s_median"), 3),
        "ttft_median_s": round(med("ttft_median_s"), 6),
        "completion_tokens": int(med("completion_tokens")),
        "prompt_tokens_median": int(med("prompt_tokens_median")),
        "cached_tokens_max": max(r["cached_tokens_max"] for r in reps),
        "usage_extra": _extras_summary([e for r in reps for e in r["usage_extra"]]),
        "runs": [{k: v for k, v in r.items() if k != "usage_extra"} for r in reps],
    }


async def _compare(
    target: client.HttpTarget,
    settings: BenchSettings,
    compare: CompareSettings,
    make_messages: Callable[[int], list[workloads.Message]],
) -> list[dict[str, Any]]:
    bodies: dict[str, dict[str, Any] | None] = {"on": None, "off": compare.off_body}
    levels = settings.concurrency
    reps: dict[tuple[int, str], list[dict[str, Any]]] = {}
    async with client.http_client(max(levels) * 2) as http:
        # Warm-up: both paths compiled, a draft model touched; with long prompts, one long
        # prompt per side, so no measured request pays a path's first-use cost.
        for side in SIDES:
            messages = make_messages(0)
            await _batch(http, target, [messages], 2, bodies[side])
        for r in range(settings.repeats):
            for n in levels if r % 2 == 0 else tuple(reversed(levels)):
                order = SIDES if (r + levels.index(n)) % 2 == 0 else tuple(reversed(SIDES))
                for side in order:
                    prompts = [make_messages(i) for i in range(n)]
                    rep = await _batch(http, target, prompts, settings.max_tokens, bodies[side])
                    log.info(
                        "concurrency %d, %s, run %d/%d: TTFT %.3f s, %.1f tok/s per stream, "
                        "%.1f tok/s aggregate",
                        n,
                        side,
                        r + 1,
                        settings.repeats,
                        rep["ttft_median_s"],
                        rep["stream_decode_tok_s_median"],
                        rep["aggregate_tok_s"],
                    )
                    reps.setdefault((n, side), []).append(rep)
    rows = []
    for n in levels:
        on, off = _side_summary(reps[(n, "on")]), _side_summary(reps[(n, "off")])
        rows.append(
            {
                "concurrency": n,
                "on": on,
                "off": off,
                "ratios": {
                    **_paired(reps[(n, "on")], reps[(n, "off")]),
                    "decode_on_vs_off": _round(
                        ratio(on["stream_decode_tok_s_median"], off["stream_decode_tok_s_median"])
                    ),
                    "aggregate_on_vs_off": _round(
                        ratio(on["aggregate_tok_s"], off["aggregate_tok_s"])
                    ),
                    "ttft_off_vs_on": _round(ratio(off["ttft_median_s"], on["ttft_median_s"])),
                },
            }
        )
    return rows


def _paired(on: list[dict[str, Any]], off: list[dict[str, Any]]) -> dict[str, float | None]:
    """Medians of the per-repeat ratios: the on and off runs of one repeat ran back to
    back, so a load swing between repeats cancels out in their ratio (the headline)."""

    def med(key: str, flip: bool = False) -> float | None:
        ratios = []
        for a, b in zip(on, off, strict=True):
            x, y = (b[key], a[key]) if flip else (a[key], b[key])
            if x > 0 and y > 0:
                ratios.append(x / y)
        return round(statistics.median(ratios), 3) if ratios else None

    return {
        "decode_paired": med("stream_decode_tok_s_median"),
        "aggregate_paired": med("aggregate_tok_s"),
        "ttft_off_vs_on_paired": med("ttft_median_s", flip=True),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run_compare(settings: BenchSettings, compare: CompareSettings) -> dict[str, Any]:
    """Start the server with ``settings.serve_args`` and measure the feature on vs off."""
    from mlxcore.runtime import resolve_model_path

    started = time.perf_counter()
    load_start = report.load_average()
    seed = settings.seed if settings.seed is not None else secrets.randbits(32)
    rng = random.Random(seed)
    source, resolved = resolve_model_path(settings.model)
    count_tokens: Callable[[str], int] | None = None
    if compare.prompt_tokens is not None:
        count_tokens = workloads.token_counter(resolved.path)
    make_messages = _messages_factory(compare, count_tokens, rng)
    with bench_server(str(resolved.path), settings) as server:
        server.start(settings.startup_timeout)
        target = server.target()
        try:
            rows = asyncio.run(_compare(target, settings, compare, make_messages))
        except (httpx.HTTPError, MlxcoreError, ValueError, KeyError) as exc:
            raise server.failure("the on/off comparison", exc) from exc
        openblas = server.openblas
    return {
        "machine": report.machine_facts(openblas, load_start),
        "model": {"source": source, "path": str(resolved.path)},
        "settings": {
            "off_body": compare.off_body,
            "prompt_tokens": compare.prompt_tokens,
            "edit_prompt": compare.edit,
            "max_tokens": settings.max_tokens,
            "repeats": settings.repeats,
            "concurrency": list(settings.concurrency),
            "serve_args": list(settings.serve_args),
            "seed": seed,
        },
        "compare": rows,
        "elapsed_s": round(time.perf_counter() - started, 2),
    }


def format_compare(result: dict[str, Any]) -> str:
    """The human-readable table of a comparison."""
    m, s = result["machine"], result["settings"]
    lines = [
        f"mlxcore bench --compare-body {json.dumps(s['off_body'])}",
        f"model {result['model']['path']}; serve args: {' '.join(s['serve_args']) or '-'}",
        f"machine: {m['cpu_count']} CPUs, {m['platform']}, mlx {m['mlx']}, OpenBLAS "
        f"{m['server_openblas_preloaded']}, load {m['load_average_start']} -> "
        f"{m['load_average_end']}",
        f"{s['repeats']} runs per side and level (median), {s['max_tokens']} tokens per request"
        + (f", cold prompts of ~{s['prompt_tokens']} tokens" if s["prompt_tokens"] else "")
        + (", edit prompts (a ~2,000-token file sent back changed)" if s["edit_prompt"] else ""),
        "",
    ]
    head = f"{'conc':>4}  {'side':<4} {'TTFT ms':>9} {'tok/s/stream':>13} {'aggregate':>10}  extras"
    lines.append(head)
    for row in result["compare"]:
        for side in SIDES:
            part = row[side]
            extras = ", ".join(f"{k}={v}" for k, v in part["usage_extra"].items())
            lines.append(
                f"{row['concurrency']:>4}  {side:<4} {part['ttft_median_s'] * 1000:>9.0f} "
                f"{part['stream_decode_tok_s_median']:>13.2f} {part['aggregate_tok_s']:>10.2f}"
                f"  {extras}".rstrip()
            )
        r = row["ratios"]
        lines.append(
            f"{'':>4}  on/off, median of per-repeat ratios: decode {_x(r['decode_paired'])}, "
            f"aggregate {_x(r['aggregate_paired'])}; TTFT off/on {_x(r['ttft_off_vs_on_paired'])}"
        )
        lines.append(
            f"{'':>4}  on/off, ratio of medians:            decode {_x(r['decode_on_vs_off'])}, "
            f"aggregate {_x(r['aggregate_on_vs_off'])}; TTFT off/on {_x(r['ttft_off_vs_on'])}"
        )
    return "\n".join(lines)


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def main_compare(args: argparse.Namespace) -> int:
    """Run the comparison from ``mlxcore bench``'s arguments; print the table or JSON."""
    settings = settings_from_args(args)
    if args.prompt_tokens is not None and args.prompt_tokens <= 0:
        raise MlxcoreError("--prompt-tokens must be a positive number of tokens")
    if args.edit_prompt and args.prompt_tokens is not None:
        raise MlxcoreError("--edit-prompt and --prompt-tokens choose different prompts: pick one")
    compare = CompareSettings(args.compare_body, args.prompt_tokens, args.edit_prompt)
    result = run_compare(settings, compare)
    text = json.dumps(result, indent=2)
    if settings.output is not None:
        settings.output.write_text(text + "\n")
        log.info("wrote %s", settings.output)
    print(text if settings.json else format_compare(result))
    sys.stdout.flush()
    return 0
