"""Machine facts, the ratios and targets, and the human-readable table of a bench run."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

import attrs

from mlxcore import blas
from mlxcore.bench.results import ratio


@attrs.frozen
class Target:
    """A goal the project must meet: ``ratio >= minimum``."""

    name: str
    ratio_key: str
    minimum: float
    description: str


TARGETS = (
    Target(
        "decode_http_vs_in_process",
        "http_vs_in_process_decode",
        0.95,
        "single-stream HTTP decode >= 0.95x mlx-lm in-process",
    ),
    Target(
        "aggregate_conc8_vs_conc1",
        "conc8_vs_conc1_aggregate",
        2.5,
        "aggregate tok/s at concurrency 8 >= 2.5x concurrency 1",
    ),
    Target(
        "ttft_cold_vs_cached",
        "cold_vs_cached_ttft",
        10.0,
        "cached long-prefix follow-up TTFT >= 10x faster than cold",
    ),
)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


BACKEND_WHEELS = (*blas.CUDA_WHEELS, "mlx-metal", "mlx-cpu")
"""The distributions that carry MLX's compiled backend, one per environment."""


def mlx_backend() -> str | None:
    """Which backend wheel MLX runs on, with its version (``mlx-cuda-12 0.32.4``)."""
    for dist in BACKEND_WHEELS:
        version = _version(dist)
        if version is not None:
            return f"{dist} {version}"
    return None


def mlx_device() -> tuple[str | None, str | None]:
    """MLX's default device (``Device(gpu, 0)``) and its name as MLX reports it (the GPU's
    model under CUDA, the CPU's otherwise)."""
    try:
        import mlx.core as mx

        name = mx.device_info().get("device_name")
        return str(mx.default_device()), str(name) if name else None
    except Exception:  # pragma: no cover - MLX always imports where mlxcore runs
        return None, None


def device_text(machine: dict[str, Any]) -> str:
    """``Device(gpu, 0) NVIDIA H100 80GB HBM3, mlx-cuda-12 0.32.4`` for a report's header."""
    parts = [machine.get("mlx_device"), machine.get("device_name")]
    text = " ".join(str(p) for p in parts if p) or "?"
    backend = machine.get("mlx_backend")
    return f"{text}, {backend}" if backend else text


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (None where the OS has none): other work on the
    machine skews every number, so the report records it."""
    if not hasattr(os, "getloadavg"):
        return None
    return [round(x, 2) for x in os.getloadavg()]


def machine_facts(
    server_openblas: bool | None = None, load_start: list[float] | None = None
) -> dict[str, Any]:
    """CPU count, platform, versions, MLX device, load and the OpenBLAS preload of both
    processes (the bench's, which runs mlx-lm, and the server's)."""
    device, device_name = mlx_device()
    lib = blas.openblas_path()
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "python": sys.version.split()[0],
        "mlx": _version("mlx"),
        "mlx_lm": _version("mlx-lm"),
        "mlxcore": _version("mlxcore"),
        "mlx_device": device,
        "mlx_backend": mlx_backend(),
        "device_name": device_name,
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "openblas_library": str(lib) if lib else None,
        "openblas_preloaded": blas.openblas_preloaded(),
        "server_openblas_preloaded": server_openblas,
    }


def _conc(result: dict[str, Any], n: int) -> float | None:
    for row in result.get("concurrency") or ():
        if row["concurrency"] == n:
            return float(row["aggregate_tok_s"])
    return None


def add_ratios_and_targets(result: dict[str, Any]) -> None:
    """Fill ``result["ratios"]`` and ``result["targets"]`` from the measurements."""
    in_proc = result.get("in_process") or {}
    http = result.get("http_single") or {}
    prefix = result.get("prefix_cache") or {}
    ratios = {
        "http_vs_in_process_decode": ratio(http.get("decode_tok_s"), in_proc.get("decode_tok_s")),
        "http_vs_in_process_ttft": ratio(http.get("ttft_s"), in_proc.get("ttft_s")),
        "conc8_vs_conc1_aggregate": ratio(_conc(result, 8), _conc(result, 1)),
        "cold_vs_cached_ttft": ratio(prefix.get("cold_ttft_s"), prefix.get("cached_ttft_s")),
    }
    result["ratios"] = {k: None if v is None else round(v, 4) for k, v in ratios.items()}
    targets = []
    for t in TARGETS:
        value = ratios[t.ratio_key]
        targets.append(
            {
                "name": t.name,
                "description": t.description,
                "minimum": t.minimum,
                "measured": None if value is None else round(value, 4),
                "passed": None if value is None else value >= t.minimum,
            }
        )
    result["targets"] = targets


def _verdict(result: dict[str, Any], name: str) -> str:
    for t in result["targets"]:
        if t["name"] == name:
            if t["passed"] is None:
                return f"target >= {t['minimum']:g}x: not measured"
            return f"target >= {t['minimum']:g}x: {'PASS' if t['passed'] else 'FAIL'}"
    return ""


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _load(values: list[float] | None) -> str:
    return "n/a" if values is None else "/".join(f"{v:.1f}" for v in values)


def _spread(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    """``"min-max"`` of the repeats (empty for a single run)."""
    if len(values) < 2:
        return ""
    return f"runs {min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f}"


def _yes(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "unknown"}[value]


def format_table(result: dict[str, Any]) -> str:
    """The readable report: a header of facts, one row per number, the ratios with verdicts."""
    m, model, s = result["machine"], result["model"], result["settings"]
    lines = [
        f"mlxcore bench: {model['source']} ({model['model_type']}, {model['dtype']}, "
        f"{model['parameters'] / 1e6:.0f}M parameters)",
        f"machine: {m['cpu_count']} CPUs, {m['platform']}, mlx {m['mlx']} ({device_text(m)}), "
        f"mlx-lm {m['mlx_lm']}",
        f"OpenBLAS preloaded: bench {_yes(m['openblas_preloaded'])}, "
        f"server {_yes(m['server_openblas_preloaded'])}; load average (1/5/15 min) "
        f"{_load(m['load_average_start'])} at start, {_load(m['load_average_end'])} at end",
        f"settings: max_tokens {s['max_tokens']}, repeats {s['repeats']} (median), "
        f"concurrency {','.join(map(str, s['concurrency']))}, prefix {s['prefix_tokens']} tokens"
        + (" [--quick]" if s["quick"] else ""),
        "",
    ]
    rows: list[tuple[str, str, str]] = []
    ip, hs, r = result["in_process"], result["http_single"], result["ratios"]

    def decode_detail(part: dict[str, Any]) -> str:
        spread = _spread([run["decode_tok_s"] for run in part["runs"]])
        return (
            f"TTFT {part['ttft_s'] * 1000:.0f} ms, {part['completion_tokens']} tokens, "
            f"prompt {part['prompt_tokens']} tokens" + (f"; {spread}" if spread else "")
        )

    rows.append(("decode, mlx-lm in-process", f"{ip['decode_tok_s']:.1f} tok/s", decode_detail(ip)))
    rows.append(
        ("decode, mlxcore HTTP 1 stream", f"{hs['decode_tok_s']:.1f} tok/s", decode_detail(hs))
    )
    rows.append(
        (
            "  HTTP / in-process",
            _x(r["http_vs_in_process_decode"]),
            _verdict(result, "decode_http_vs_in_process"),
        )
    )
    for row in result["concurrency"]:
        aggs = [run["aggregate_tok_s"] for run in row["runs"]]
        rows.append(
            (
                f"aggregate, concurrency {row['concurrency']}",
                f"{row['aggregate_tok_s']:.1f} tok/s",
                f"{row['completion_tokens']} tokens in {row['wall_s']:.1f} s, "
                f"TTFT median {row['ttft_median_s'] * 1000:.0f} ms, "
                f"per stream {row['stream_decode_tok_s_median']:.1f} tok/s"
                + (f"; {spread}" if (spread := _spread(aggs)) else ""),
            )
        )
    rows.append(
        (
            "  conc 8 / conc 1",
            _x(r["conc8_vs_conc1_aggregate"]),
            _verdict(result, "aggregate_conc8_vs_conc1"),
        )
    )
    pc = result["prefix_cache"]
    colds = [p["cold"]["ttft_s"] for p in pc["runs"]]
    warms = [p["cached"]["ttft_s"] for p in pc["runs"]]
    rows.append(
        (
            f"TTFT cold, {pc['prompt_tokens']}-token prompt",
            f"{pc['cold_ttft_s'] * 1000:.0f} ms",
            f"cached_tokens {pc['cold_cached_tokens']}"
            + (f"; {spread} ms" if (spread := _spread(colds, 1000, 0)) else ""),
        )
    )
    rows.append(
        (
            "TTFT cached follow-up",
            f"{pc['cached_ttft_s'] * 1000:.0f} ms",
            f"cached_tokens {pc['cached_tokens']} of {pc['followup_prompt_tokens']}"
            + (f"; {spread} ms" if (spread := _spread(warms, 1000, 0)) else ""),
        )
    )
    rows.append(
        ("  cold / cached", _x(r["cold_vs_cached_ttft"]), _verdict(result, "ttft_cold_vs_cached"))
    )
    long_run = ip.get("long_prompt")
    if long_run:
        rows.append(
            (
                "  (mlx-lm in-process prefill)",
                f"{long_run['ttft_s'] * 1000:.0f} ms",
                f"TTFT of a {long_run['prompt_tokens']}-token prompt, one run",
            )
        )
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    lines += [f"{a.ljust(w0)}  {b.rjust(w1)}  {c}".rstrip() for a, b, c in rows]
    return "\n".join(lines)
