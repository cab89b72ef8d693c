"""One whole bench run: the mlx-lm baseline, then the server and its three measurements.

The parts run one after the other, never at the same time, so each has the machine to
itself: first mlx-lm in this process (then its weights are released), then the server
subprocess with single-stream, concurrency and prefix-cache requests.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import secrets
import sys
import time
from typing import Any

from mlxcore.bench import client, inprocess, report, workloads
from mlxcore.bench.options import BenchSettings, settings_from_args
from mlxcore.bench.results import summarize
from mlxcore.bench.server import ServerProcess

log = logging.getLogger(__name__)


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
        "quick": settings.quick,
    }


def run(settings: BenchSettings) -> dict[str, Any]:
    """Run every measurement of ``settings`` and return the JSON-ready result."""
    started = time.perf_counter()
    load_start = report.load_average()
    seed = settings.seed if settings.seed is not None else secrets.randbits(32)
    rng = random.Random(seed)

    log.info("loading the model in-process for the mlx-lm baseline")
    baseline = inprocess.load_baseline(settings.model)
    tokenizer = baseline.tokenizer

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    messages = workloads.writing_messages(0)
    # The in-process prefill reference uses a prefix of its own (the server never sees it).
    long_text, _ = workloads.long_prefix(count_tokens, settings.prefix_tokens, rng)
    base = inprocess.run_baseline(
        baseline,
        messages,
        max_tokens=settings.max_tokens,
        repeats=settings.repeats,
        prefill_step_size=settings.prefill_step_size,
        long_messages=workloads.prefix_messages(long_text, workloads.COLD_QUESTION),
    )
    model_facts = baseline.facts
    inprocess.release(baseline)

    in_process = summarize(base["runs"])
    if base["long_prompt"] is not None:
        in_process["long_prompt"] = base["long_prompt"].to_json()

    server_level = settings.log_level if settings.log_level in ("debug", "trace") else "warning"
    with ServerProcess(
        settings.model,
        settings.serve_args,
        host=settings.host,
        port=settings.port,
        log_level=server_level,
    ) as server:
        server.start(settings.startup_timeout)
        target = client.HttpTarget(server.base_url, server.model_id)
        single = client.measure_single(
            target, messages, max_tokens=settings.max_tokens, repeats=settings.repeats
        )
        concurrency = client.measure_concurrency(
            target, settings.concurrency, max_tokens=settings.max_tokens, repeats=settings.repeats
        )
        prefix = client.measure_prefix_cache(
            target,
            count_tokens,
            prefix_tokens=settings.prefix_tokens,
            max_tokens=settings.followup_max_tokens,
            repeats=settings.repeats,
            rng=rng,
        )
        server_openblas = server.openblas

    result: dict[str, Any] = {
        "machine": report.machine_facts(server_openblas, load_start),
        "model": model_facts,
        "settings": _settings_json(settings, seed),
        "in_process": in_process,
        "http_single": summarize(single),
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
