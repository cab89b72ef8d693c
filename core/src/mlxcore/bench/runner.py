"""One whole bench run: single-stream decode (mlx-lm in-process vs HTTP), then the server's
concurrency and prefix-cache measurements.

Nothing runs at the same time as anything else: the server's engine thread sleeps while
mlx-lm generates in this process, and this process only reads the stream while the server
works. By default the single-stream runs of the two sides alternate (in-process, HTTP,
HTTP, in-process, ...), so slow changes in the machine's load hit both sides alike; this
keeps two copies of the weights in memory for a while. ``--sequential`` runs mlx-lm first,
releases its weights, and only then starts the server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from mlxcore.bench import client, inprocess, report, workloads
from mlxcore.bench.options import BenchSettings, settings_from_args
from mlxcore.bench.results import StreamRun, summarize
from mlxcore.bench.server import ServerProcess, bench_server
from mlxcore.errors import MlxcoreError

log = logging.getLogger(__name__)

T = TypeVar("T")


def _guarded(server: ServerProcess, what: str, fn: Callable[[], T]) -> T:
    """Run one measurement against the server; a failure becomes one clear error that
    says whether the server is still up and where its log is."""
    try:
        return fn()
    except (httpx.HTTPError, MlxcoreError, ValueError, KeyError) as exc:
        raise server.failure(what, exc) from exc


def _settings_json(settings: BenchSettings, seed: int) -> dict[str, Any]:
    return {
        "max_tokens": settings.max_tokens,
        "repeats": settings.repeats,
        "concurrency": list(settings.concurrency),
        "prefix_tokens": settings.prefix_tokens,
        "followup_max_tokens": settings.followup_max_tokens,
        "prefill_step_size": settings.prefill_step_size,
        "seed": seed,
        "serve_args": list(settings.serve_args),
        "sequential": settings.sequential,
        "quick": settings.quick,
    }


def _logged(side: str, index: int, total: int, run: StreamRun) -> StreamRun:
    log.info(
        "%s run %d/%d: %d tokens, TTFT %.3f s, %.1f tok/s",
        side,
        index + 1,
        total,
        run.completion_tokens,
        run.ttft_s,
        run.decode_tok_s,
    )
    return run


class _DecodeComparison:
    """The single-stream runs of both sides, on the same prompt."""

    def __init__(self, settings: BenchSettings, baseline: inprocess.LoadedBaseline) -> None:
        self.settings = settings
        self.baseline = baseline
        self.messages = workloads.writing_messages(0)
        self.tokens = inprocess.prompt_tokens(baseline.tokenizer, self.messages)
        self.in_process: list[StreamRun] = []
        self.http: list[StreamRun] = []

    def warm_in_process(self) -> None:
        s = self.settings
        inprocess.timed_generate(self.baseline, self.tokens, 8, s.prefill_step_size)

    def warm_http(self, server: ServerProcess) -> None:
        target = server.target()
        _guarded(server, "the HTTP warm-up", lambda: client.stream_once(target, self.messages, 8))

    def run_in_process(self) -> None:
        s = self.settings
        run = inprocess.timed_generate(
            self.baseline, self.tokens, s.max_tokens, s.prefill_step_size
        )
        self.in_process.append(_logged("in-process", len(self.in_process), s.repeats, run))

    def run_http(self, server: ServerProcess) -> None:
        s, target = self.settings, server.target()
        run = _guarded(
            server,
            "the single-stream HTTP measurement",
            lambda: client.stream_once(target, self.messages, s.max_tokens),
        )
        self.http.append(_logged("HTTP single stream", len(self.http), s.repeats, run))

    def alternate(self, server: ServerProcess) -> None:
        """Warm both sides, then alternate their runs (ABBA...)."""
        self.warm_in_process()
        self.warm_http(server)
        for i in range(self.settings.repeats):
            if i % 2 == 0:
                self.run_in_process()
                self.run_http(server)
            else:
                self.run_http(server)
                self.run_in_process()


def _long_prompt_reference(
    settings: BenchSettings, baseline: inprocess.LoadedBaseline, rng: random.Random
) -> StreamRun:
    """mlx-lm's TTFT on a long prompt of its own (the server never sees this prefix)."""

    def count_tokens(text: str) -> int:
        return len(baseline.tokenizer.encode(text, add_special_tokens=False))

    text, _ = workloads.long_prefix(count_tokens, settings.prefix_tokens, rng)
    messages = workloads.prefix_messages(text, workloads.COLD_QUESTION)
    tokens = inprocess.prompt_tokens(baseline.tokenizer, messages)
    run = inprocess.timed_generate(baseline, tokens, 2, settings.prefill_step_size)
    log.info("in-process long prompt: %d tokens, TTFT %.3f s", run.prompt_tokens, run.ttft_s)
    return run


def run(settings: BenchSettings) -> dict[str, Any]:
    """Run every measurement of ``settings`` and return the JSON-ready result."""
    started = time.perf_counter()
    load_start = report.load_average()
    seed = settings.seed if settings.seed is not None else secrets.randbits(32)
    rng = random.Random(seed)

    log.info("loading the model in-process for the mlx-lm baseline")
    baseline = inprocess.load_baseline(settings.model)
    tokenizer = baseline.tokenizer
    model_facts = baseline.facts
    decode = _DecodeComparison(settings, baseline)
    long_run: StreamRun | None = None
    # The server gets the folder the baseline loaded: both sides run the same weights even
    # where the model argument could resolve differently (the default model's storage type
    # follows the OpenBLAS setting; GGUF conversions are cached by type).
    server = bench_server(model_facts["path"], settings)
    with contextlib.ExitStack() as stack:
        if settings.sequential:
            decode.warm_in_process()
            for _ in range(settings.repeats):
                decode.run_in_process()
            long_run = _long_prompt_reference(settings, baseline, rng)
            inprocess.release(baseline)
        stack.enter_context(server)
        server.start(settings.startup_timeout)
        if settings.sequential:
            decode.warm_http(server)
            for _ in range(settings.repeats):
                decode.run_http(server)
        else:
            decode.alternate(server)
            long_run = _long_prompt_reference(settings, baseline, rng)
            inprocess.release(baseline)

        target = server.target()
        concurrency = _guarded(
            server,
            "the concurrency measurement",
            lambda: client.measure_concurrency(
                target,
                settings.concurrency,
                max_tokens=settings.max_tokens,
                repeats=settings.repeats,
            ),
        )
        prefix = _guarded(
            server,
            "the prefix-cache measurement",
            lambda: client.measure_prefix_cache(
                target,
                lambda text: len(tokenizer.encode(text, add_special_tokens=False)),
                prefix_tokens=settings.prefix_tokens,
                max_tokens=settings.followup_max_tokens,
                repeats=settings.repeats,
                rng=rng,
            ),
        )
        server_openblas = server.openblas

    in_process = summarize(decode.in_process)
    in_process["long_prompt"] = long_run.to_json() if long_run is not None else None
    result: dict[str, Any] = {
        "machine": report.machine_facts(server_openblas, load_start),
        "model": model_facts,
        "settings": _settings_json(settings, seed),
        "in_process": in_process,
        "http_single": summarize(decode.http),
        "concurrency": concurrency,
        "prefix_cache": prefix,
    }
    report.add_ratios_and_targets(result)
    result["elapsed_s"] = round(time.perf_counter() - started, 2)
    return result


def main(args: argparse.Namespace) -> int:
    """``mlxcore bench``: run, then print the table (or the JSON); write ``--output``."""
    settings = settings_from_args(args)
    result = run(settings)
    text = json.dumps(result, indent=2)
    if settings.output is not None:
        settings.output.write_text(text + "\n")
        log.info("wrote %s", settings.output)
    if settings.json:
        print(text)
    else:
        print(report.format_table(result))
    sys.stdout.flush()
    return 0
