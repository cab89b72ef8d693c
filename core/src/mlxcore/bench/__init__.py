"""``mlxcore bench``: measure one model in one run, mlx-lm in-process next to mlxcore over HTTP.

The run has four parts, all on the same model and (on Linux) the same OpenBLAS setting:

1. decode speed and time to first token of mlx-lm's own ``stream_generate`` in this
   process (greedy): the ceiling the server is measured against;
2. the same request streamed through a real ``mlxcore serve`` subprocess over HTTP;
3. aggregate throughput with 1, 4, 8 and 16 concurrent streams;
4. time to first token of a follow-up turn sharing a ~4,000-token system prompt, cold
   and served from the prefix cache.

Modules: :mod:`~mlxcore.bench.options` (flags and settings), :mod:`~mlxcore.bench.workloads`
(prompts), :mod:`~mlxcore.bench.inprocess` (the mlx-lm baseline), :mod:`~mlxcore.bench.server`
(the server subprocess), :mod:`~mlxcore.bench.client` (the HTTP measurements),
:mod:`~mlxcore.bench.compare` (``--compare-body``: a plugin's feature on vs off on one server),
:mod:`~mlxcore.bench.agent` (``--agent-session``), :mod:`~mlxcore.bench.peer` and
:mod:`~mlxcore.bench.scenarios` (``--peer URL``: mlxcore vs another server, alternating),
:mod:`~mlxcore.bench.report` (machine facts, ratios, targets, table) and
:mod:`~mlxcore.bench.runner` (the whole run). Importing this package is cheap (no MLX).
"""

from __future__ import annotations

import argparse
from typing import Any


def run_bench(args: argparse.Namespace, config: Any = None, hooks: Any = None) -> int:
    """Run ``mlxcore bench`` from parsed command-line arguments; return the exit code."""
    if getattr(args, "agent_session", False):
        from mlxcore.bench.agent import main_agent

        return main_agent(args, config, hooks)
    if getattr(args, "peer", None) is not None:
        from mlxcore.bench.peer import main_peer

        return main_peer(args)
    if getattr(args, "compare_body", None) is not None:
        from mlxcore.bench.compare import main_compare

        return main_compare(args)
    from mlxcore.bench.runner import main

    return main(args)


__all__ = ["run_bench"]
