"""``mlxcore launch``: the flags, and the call into :mod:`mlxcore.distributed.launch`."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "start the ranks of a distributed server: mlxcore launch --hosts A,B -- serve MODEL"


def add_launch_command(cmd: argparse.ArgumentParser) -> None:
    """The ``launch`` subcommand's flags."""
    cmd.add_argument(
        "--hosts",
        help="comma-separated hosts, one per rank, rank 0 first (it serves HTTP); "
        "127.0.0.1 / localhost start local processes, other hosts are reached with ssh",
    )
    cmd.add_argument(
        "--hostfile",
        type=Path,
        help='a ring hostfile instead of --hosts: a JSON list of ["ip:port"] per rank',
    )
    cmd.add_argument(
        "--backend",
        default="ring",
        choices=("ring", "jaccl", "mpi"),
        help="mlx.distributed backend (the launcher starts ring ranks; default ring)",
    )
    cmd.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="seconds the other ranks get to end on their own after one ended, "
        "before SIGTERM (default 30)",
    )
    cmd.add_argument(
        "rank_args",
        nargs=argparse.REMAINDER,
        metavar="-- serve MODEL ...",
        help="what every rank runs",
    )


def run_launch(args: argparse.Namespace) -> int:
    """Run ``mlxcore launch``."""
    from mlxcore.distributed.launch import launch

    rank_args = list(args.rank_args)
    if rank_args[:1] == ["--"]:
        rank_args = rank_args[1:]
    return launch(args.hosts, args.hostfile, args.backend, rank_args, args.grace)
