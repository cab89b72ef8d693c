"""Several mlx.distributed ranks on this machine, for tests: the ``ring`` backend over
127.0.0.1, each rank a plain process started with ``MLX_RANK`` and ``MLX_HOSTFILE`` (no
``mlx.launch``: its log forwarding busy-waits), bounded in time and stopped by PID.

``python -m mlxcore.testing.ranks MODEL MODE TOKENS PROMPT...`` is the probe a rank runs:
it loads ``MODEL`` split by :func:`~mlxcore.distributed.load.load_split` (``MODE``
``tensor`` or ``pipeline``), generates ``TOKENS`` greedy tokens after each prompt (token ids, comma
separated) and, on rank 0, prints one JSON line: the token ids per prompt and the
rank's timings. :func:`greedy_alone` is the same generation in one process.

:func:`launch_group` starts a whole distributed server through ``mlxcore launch``: a
:class:`LaunchedGroup` is a :class:`~mlxcore.testing.server.Server` whose rank 0
answers HTTP.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from mlxcore.distributed.launch import free_ports
from mlxcore.testing.server import Server, free_port, listens_on


def write_hostfile(path: Path, size: int) -> Path:
    """The ring backend's hostfile for ``size`` ranks on 127.0.0.1 (one address each)."""
    path.write_text(json.dumps([[f"127.0.0.1:{port}"] for port in free_ports(size)]))
    return path


@attrs.frozen
class RankResult:
    """How each rank ended: exit codes and output, rank by rank."""

    codes: list[int | None]
    stdout: list[str]
    stderr: list[str]

    def report(self) -> Any:
        """Rank 0's last JSON line."""
        lines = [line for line in self.stdout[0].splitlines() if line.startswith("{")]
        if not lines or any(code != 0 for code in self.codes):
            raise AssertionError(f"ranks failed: {self.codes}\n{self.stderr}")
        return json.loads(lines[-1])


def run_ranks(args: Sequence[str], size: int, workdir: Path, timeout: float = 120) -> RankResult:
    """Run ``python args...`` as ``size`` ring ranks; every rank still running after
    ``timeout`` seconds is killed (by PID) and reported with exit code ``None``."""
    hostfile = write_hostfile(workdir / "hostfile.json", size)
    procs = []
    logs = []
    for rank in range(size):
        env = {**os.environ, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
        out = open(workdir / f"rank{rank}.out", "w+")  # noqa: SIM115 (closed below)
        err = open(workdir / f"rank{rank}.err", "w+")  # noqa: SIM115
        logs.append((out, err))
        procs.append(subprocess.Popen([sys.executable, *args], env=env, stdout=out, stderr=err))
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    stdout: list[str] = []
    stderr: list[str] = []
    for out, err in logs:
        for f, into in ((out, stdout), (err, stderr)):
            f.seek(0)
            into.append(f.read())
            f.close()
    return RankResult(codes, stdout, stderr)


def _generate(model: Any, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    out = []
    for prompt in prompts:
        ids = []
        steps = generate_step(mx.array(prompt), model, max_tokens=tokens, sampler=make_sampler(0.0))
        for token, _ in steps:
            ids.append(int(token))
        out.append(ids)
    return out


def greedy_alone(model_path: Path, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """The reference: the same greedy generation in one process, unsplit."""
    from mlx_lm import load

    model = load(str(model_path))[0]
    return _generate(model, prompts, tokens)


def main(argv: list[str]) -> None:
    import mlx.core as mx

    from mlxcore.distributed.load import load_split

    model_path, mode, tokens, *prompts = argv
    group = mx.distributed.init(strict=True, backend="ring")
    started = time.perf_counter()
    model = load_split(model_path, mode, group)
    loaded = time.perf_counter()
    ids = [[int(t) for t in p.split(",")] for p in prompts]
    out = _generate(model, ids, int(tokens))
    done = time.perf_counter()
    tick = time.perf_counter()
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))
    small_sum = time.perf_counter() - tick
    if group.rank() == 0:
        report = {
            "size": group.size(),
            "tokens": out,
            "load_s": loaded - started,
            "generate_s": done - loaded,
            "small_all_sum_s": small_sum,
        }
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])


def family(pid: int) -> list[int]:
    """``pid`` and its descendants (from ``/proc``; just ``[pid]`` where it cannot tell)."""
    found = [pid]
    for parent in found:
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                found.extend(int(child) for child in task.read_text().split())
    return found


class LaunchedGroup(Server):
    """``mlxcore launch --hosts 127.0.0.1,... -- serve MODEL --port PORT flags``: the
    launcher's process, whose rank 0 answers HTTP. :meth:`stop` stops the launcher (which
    stops its ranks) and kills whatever of the group is left."""

    def listening(self) -> bool:
        """True when one of the launcher's ranks holds the port."""
        return any(listens_on(pid, self.port) for pid in family(self.proc.pid))

    def ranks(self) -> list[int]:
        """The PIDs of the ranks (the launcher's children), rank 0 first."""
        return sorted(family(self.proc.pid)[1:])

    def stop(self) -> None:
        """SIGINT to the launcher; SIGKILL to the whole group after 40 s."""
        if self.alive():
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=40)
        for pid in family(self.proc.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def launch_group(
    model: Path | str,
    logs: Path,
    *flags: str,
    ranks: int = 2,
    wait: bool = True,
    launcher: tuple[str, ...] = (),
) -> LaunchedGroup:
    """Start ``ranks`` local ranks serving ``model`` through ``mlxcore launch``
    (``launcher``: the launcher's own flags, e.g. ``("--grace", "5")``)."""
    port = free_port()
    log_path = logs / f"group-{port}.log"
    hosts = ",".join(["127.0.0.1"] * ranks)
    cmd = [sys.executable, "-m", "mlxcore", "launch", "--hosts", hosts, *launcher, "--"]
    cmd += ["serve", str(model), "--port", str(port), "--log-level", "warning", *flags]
    with log_path.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    group = LaunchedGroup(proc, port, log_path)
    if wait:
        group.wait_ready()
    return group
