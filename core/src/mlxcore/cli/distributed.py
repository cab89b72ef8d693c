"""``mlxcore serve --distributed``: one rank of a model served over an mlx.distributed group.

Every rank runs this with the same command line. In order, before any weight is read:
join the group (``MLX_RANK`` / ``MLX_HOSTFILE`` or the launcher's equivalent), check
that the backend exists here and that the model can be split this way
(:func:`~mlxcore.distributed.plan.plan_parallel`), and compare a fingerprint of the
model files, flags and plugins with rank 0's. Then each rank loads its share, builds the
same engine, and refuses what cannot run in lockstep. Rank 0 serves HTTP with a
:class:`~mlxcore.distributed.lockstep.Lockstep` announcing each engine step; the other
ranks follow those steps until rank 0 stops (exit 0) or a rank is lost (exit 70).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

import attrs

from mlxcore.config import ServerConfig
from mlxcore.distributed.control import ControlChannel
from mlxcore.distributed.load import barrier, split_model
from mlxcore.distributed.lockstep import Lockstep
from mlxcore.distributed.plan import (
    PIPELINE,
    TENSOR,
    ParallelPlan,
    check_agreement,
    check_backend,
    fingerprint,
    plan_parallel,
)
from mlxcore.engine.strategies import CacheStrategy
from mlxcore.errors import UsageError
from mlxcore.hooks import PluginHooks
from mlxcore.runtime import Runtime, build_runtime, resolve_model_path

log = logging.getLogger(__name__)

EXIT_RANK_LOST = 70
"""Exit status of a rank whose group lost a member (as a failed engine's)."""


def parallel_mode(config: ServerConfig) -> str:
    """``tensor`` or ``pipeline`` from the flags (tensor when neither is given)."""
    if config.tensor_parallel and config.pipeline_parallel:
        raise UsageError("--tensor-parallel and --pipeline-parallel exclude each other")
    if (config.tensor_parallel or config.pipeline_parallel) and not config.distributed:
        raise UsageError("--tensor-parallel / --pipeline-parallel need --distributed")
    return PIPELINE if config.pipeline_parallel else TENSOR


def join(config: ServerConfig, plugins: list[str]) -> tuple[Any, ParallelPlan, ControlChannel]:
    """Join the group and run the checks every rank must pass before loading."""
    import mlx.core as mx

    mode = parallel_mode(config)
    check_backend(config.distributed_backend)
    try:
        group = mx.distributed.init(strict=True, backend=config.distributed_backend)
    except Exception as exc:
        raise UsageError(
            f"could not join the {config.distributed_backend} group ({exc}); start the ranks "
            "with `mlxcore launch` or set MLX_RANK and MLX_HOSTFILE"
        ) from exc
    _, resolved = resolve_model_path(config.model)
    plan = plan_parallel(resolved.path, mode, group.size())
    channel = ControlChannel(group)
    settings = attrs.asdict(config, recurse=False)
    check_agreement(channel.agree(fingerprint(resolved.path, settings, plugins)))
    return group, plan, channel


def refuse_unsupported(rt: Runtime) -> None:
    """Refuse, on every rank alike, what cannot run in lockstep."""
    engine = rt.engine
    if not engine.decoder.runs_in_lockstep:
        raise UsageError(
            f"decoder {engine.decoder.name!r} does not run distributed yet (its off-switch "
            "reads each rank's clock); serve without its plugin or without --distributed"
        )
    if not engine.prefill.runs_in_lockstep:
        raise UsageError(
            f"prefill strategy {engine.prefill.name!r} does not run distributed yet; "
            "serve without its plugin or without --distributed"
        )
    if type(engine.cache).follow_evictions is CacheStrategy.follow_evictions:
        raise UsageError(
            f"cache strategy {engine.cache.name!r} cannot follow rank 0's evictions; "
            "distributed serving needs the built-in lru cache"
        )
    if rt.media is not None:
        raise UsageError("image and video input does not run distributed yet")


def start_rank(config: ServerConfig, hooks: PluginHooks) -> tuple[Runtime, Lockstep]:
    """Join, load this rank's share, build the engine; every rank returns together."""
    plugins = [name for name, plugin in hooks.pm.list_name_plugin() if plugin is not None]
    group, plan, channel = join(config, plugins)
    rank = channel.rank
    log.info("rank %d of %d: %s", rank, channel.size, plan.describe())
    rt = build_runtime(config, hooks, split=lambda model: split_model(model, plan.mode, group))
    barrier(group)
    refuse_unsupported(rt)
    weights = rt.engine.memory.weights
    shares = channel.agree(weights // (1024 * 1024))
    log.info(
        "rank %d holds %.1f MiB of weights (every rank, MiB: %s)",
        rank,
        weights / 2**20,
        ", ".join(map(str, shares)),
    )
    lockstep = Lockstep(channel, config.distributed_timeout)
    lockstep.weights_mib = shares
    return rt, lockstep


def follow(rt: Runtime, lockstep: Lockstep) -> int:
    """A rank other than 0: run rank 0's engine steps until it stops."""
    import mlx.core as mx

    loop = rt.engine.new_loop()
    threading.Thread(
        target=_watch, args=(lockstep,), name="mlxcore-rank-watch", daemon=True
    ).start()
    try:
        with mx.stream(mx.default_stream(mx.default_device())):
            lockstep.follow(loop)
    except Exception as exc:
        log.critical("rank %d stops: %s: %s", lockstep.channel.rank, type(exc).__name__, exc)
        return EXIT_RANK_LOST
    log.info("rank %d: rank 0 stopped; exiting", lockstep.channel.rank)
    return 0


def _watch(lockstep: Lockstep) -> None:
    """A follower's deadline: mlx's collectives wait forever for a rank that died in the
    middle of one, so a step or exchange that outlives the deadline ends the process."""
    while True:
        time.sleep(0.25)
        since = lockstep.busy_since
        if since is not None and time.monotonic() - since > lockstep.deadline:
            log.critical(
                "rank %d: no word from the other ranks for %.0f s; a rank was lost, exiting",
                lockstep.channel.rank,
                lockstep.deadline,
            )
            exit_now(EXIT_RANK_LOST)


def exit_now(code: int) -> None:
    """End the process at once: a thread stuck in a collective would hold up a normal
    exit forever."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
