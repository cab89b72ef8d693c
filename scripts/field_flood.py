"""Flood a running server with bodies full of made-up field names and report its RSS
(issue 61: a client must not grow the server). Usage:

    scripts/field_flood.py PORT PID [ROUNDS] [REQUESTS] [FIELDS]

Each round sends REQUESTS chat completions (8 at a time, max_tokens 1) of FIELDS random
12-letter top-level fields, then waits 3 s (the engine's idle release) and prints the
server's RSS and the statuses. Run two rounds with FIELDS 0 first to warm the server up.
"""

from __future__ import annotations

import json
import queue
import random
import string
import sys
import threading
import time
import urllib.error
import urllib.request


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


def one(port: int, seed: int, fields: int, statuses: dict[int, int], lock: threading.Lock) -> None:
    rnd = random.Random(seed)
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
    }
    for _ in range(fields):
        body["".join(rnd.choices(string.ascii_letters, k=12))] = 1
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            code = answer.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    with lock:
        statuses[code] = statuses.get(code, 0) + 1


def main() -> None:
    port, pid = int(sys.argv[1]), int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    total = int(sys.argv[4]) if len(sys.argv) > 4 else 200
    fields = int(sys.argv[5]) if len(sys.argv) > 5 else 20_000
    lock = threading.Lock()
    for r in range(rounds):
        statuses: dict[int, int] = {}
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for seed in range(r * total, (r + 1) * total):
            todo.put(seed)

        def worker(todo: queue.SimpleQueue[int] = todo, got: dict[int, int] = statuses) -> None:
            while True:
                try:
                    seed = todo.get_nowait()
                except queue.Empty:
                    return
                one(port, seed, fields, got, lock)

        before = rss_mb(pid)
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(3)
        print(f"round {r + 1}: RSS {before} -> {rss_mb(pid)} MB, statuses {statuses}")


if __name__ == "__main__":
    main()
