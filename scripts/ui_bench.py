"""The web page's weight, its time to first render, and the server's throughput with the
dashboard open against without it (rounds alternating, one server).

    .venv/bin/python scripts/ui_bench.py [--model PATH] [--rounds 3] [--requests 48]

Starts a real ``mlxcore serve`` (the embedded default model unless ``--model``) and a
headless Debian Chromium driven by Playwright. Prints a JSON report; docs/ui.md records it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from mlxcore.testing.server import ServerPool
from mlxcore_ui.browser import CHROMIUM_ARGS, chromium_path
from mlxcore_ui.routes import assets


def weight() -> dict[str, int]:
    files = assets()
    raw = sum(len(body) for body, _ in files.values())
    packed = sum(len(gzip.compress(body)) for body, _ in files.values())
    return {"files": len(files), "bytes": raw, "gzip_bytes": packed}


def first_render(browser: Any, base: str, times: int) -> dict[str, float]:
    """Median first contentful paint and DOMContentLoaded of a fresh page, in ms."""
    paints, loaded = [], []
    for _ in range(times):
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{base}/", wait_until="load")
        page.wait_for_selector("#model option", state="attached")
        timing = page.evaluate(
            "() => ({fcp: performance.getEntriesByName('first-contentful-paint')[0]?.startTime,"
            " dcl: performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd})"
        )
        paints.append(timing["fcp"])
        loaded.append(timing["dcl"])
        context.close()
    return {
        "first_contentful_paint_ms": round(statistics.median(paints), 1),
        "dom_content_loaded_ms": round(statistics.median(loaded), 1),
    }


def load(base: str, requests: int, concurrency: int, max_tokens: int) -> float:
    """Generated tokens per second over ``requests`` greedy chats, ``concurrency`` at once."""
    tokens = 0
    lock = threading.Lock()
    todo = list(range(requests))

    def worker() -> None:
        nonlocal tokens
        with httpx.Client(timeout=600) as client:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                body = {
                    "messages": [{"role": "user", "content": f"Write a story about #{i}."}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                }
                answer = client.post(f"{base}/v1/chat/completions", json=body).json()
                with lock:
                    tokens += answer["usage"]["completion_tokens"]

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tokens / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--chromium", default=chromium_path())
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from mlxcore.models.default import ensure_default_model

    pool = ServerPool(Path(tempfile.mkdtemp(prefix="ui-bench-")))
    report: dict[str, Any] = {"page": weight()}
    try:
        server = pool(args.model or str(ensure_default_model()))
        base = server.base_url
        load(base, args.concurrency, args.concurrency, 8)  # warm-up
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            report["render"] = first_render(browser, base, 5)
            rows = []
            for r in range(args.rounds):
                row: dict[str, float] = {}
                for open_ in (False, True) if r % 2 == 0 else (True, False):
                    context = page = None
                    if open_:
                        context = browser.new_context()
                        page = context.new_page()
                        page.goto(f"{base}/ui#dashboard")
                        page.wait_for_selector("#models tbody tr td")
                    key = "dashboard_open" if open_ else "no_page"
                    row[key] = load(base, args.requests, args.concurrency, args.max_tokens)
                    if context is not None:
                        context.close()
                rows.append(row)
                print(json.dumps({"round": r, **row}), file=sys.stderr)
            browser.close()
        ratios = [row["dashboard_open"] / row["no_page"] for row in rows]
        report["throughput"] = {
            "rounds": rows,
            "ratio_median": round(statistics.median(ratios), 3),
            "requests": args.requests,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
        }
    finally:
        pool.close()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
