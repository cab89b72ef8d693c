"""``mlxcore launch``: start the ranks of a distributed ``mlxcore serve`` and watch them.

For the ``ring`` backend it writes the hostfile (one ``ip:port`` per rank), starts each
rank with ``MLX_RANK`` and ``MLX_HOSTFILE`` (a plain process for a local host, ``ssh``
for a remote one), forwards every rank's output line by line with a ``[rank N]`` prefix
(blocking reads, one thread per stream: nothing polls), and stops the group as a unit:
when a rank ends, the others get ``grace`` seconds to end on their own (rank 0 fails its
open requests and exits once it notices), then SIGTERM, then SIGKILL. Ctrl-C or SIGTERM
reaches rank 0 first, which finishes its requests and tells the other ranks to stop.
The exit status is 0 only when every rank exited 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import attrs

from mlxcore.errors import UsageError

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
STOP_SECONDS = 10.0
"""Seconds between SIGTERM and SIGKILL."""


def free_ports(count: int) -> list[int]:
    """``count`` TCP ports free on 127.0.0.1 right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


Hostfile = list[list[str]]
"""The ring backend's hostfile: a list of ``["ip:port", ...]`` per rank."""


def ring_hostfile(hosts: Sequence[str], base_port: int = 52000) -> Hostfile:
    """The ring backend's hostfile: one ``ip:port`` per rank. Local ranks get ports free
    here; remote ones ``base_port + rank``."""
    local = iter(free_ports(len(hosts)))
    entries = []
    for rank, host in enumerate(hosts):
        port = next(local) if host in LOCAL_HOSTS else base_port + rank
        entries.append([f"{host}:{port}"])
    return entries


def read_hosts(
    hosts: str | None, hostfile: Path | None
) -> tuple[list[str], list[list[str]] | None]:
    """The hosts (one per rank), and the hostfile's contents when one was given."""
    if hostfile is not None:
        try:
            entries = json.loads(Path(hostfile).read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the hostfile {hostfile}: {exc}") from exc
        if not isinstance(entries, list) or not all(isinstance(e, list) and e for e in entries):
            raise UsageError(f'{hostfile}: expected a JSON list of ["ip:port", ...] per rank')
        return [str(e[0]).rsplit(":", 1)[0] for e in entries], entries
    names = [h.strip() for h in (hosts or "").split(",") if h.strip()]
    if len(names) < 2:
        raise UsageError("give at least two hosts: --hosts HOST1,HOST2 (or --hostfile FILE)")
    return names, None


def rank_command(argv: Sequence[str]) -> list[str]:
    """The ``mlxcore`` command a rank runs: ``argv`` (``serve MODEL ...``) with
    ``--distributed`` added when missing."""
    args = list(argv)
    if not args or args[0] != "serve":
        raise UsageError("mlxcore launch runs `serve`: mlxcore launch --hosts A,B -- serve MODEL")
    if "--distributed" not in args:
        args.insert(1, "--distributed")
    return [sys.executable, "-m", "mlxcore", *args]


@attrs.define
class Rank:
    """One started rank."""

    rank: int
    host: str
    process: subprocess.Popen[bytes]
    code: int | None = None


class Launcher:
    """Start, forward and stop a group of ranks.

    Args:
        hosts: one host per rank (rank 0 first: it serves HTTP).
        argv: the ``mlxcore`` arguments every rank runs (``serve MODEL ...``).
        grace: seconds the other ranks get to end on their own after one ended.
        hostfile: the ring hostfile to use (default: written for ``hosts``).
    """

    def __init__(
        self,
        hosts: Sequence[str],
        argv: Sequence[str],
        grace: float = 30.0,
        hostfile: Hostfile | None = None,
        out: IO[str] | None = None,
    ) -> None:
        self.hosts = list(hosts)
        self.command = rank_command(argv)
        self.grace = grace
        self.entries = hostfile or ring_hostfile(self.hosts)
        self.out = out or sys.stdout
        self.ranks: list[Rank] = []
        self.folder = Path(tempfile.mkdtemp(prefix="mlxcore-launch-"))
        """Where the hostfile is written (removed by :func:`launch` at the end)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(self) -> None:
        """Write the hostfile and start every rank."""
        folder = self.folder
        path = folder / "hostfile.json"
        text = json.dumps(self.entries)
        path.write_text(text)
        for rank, host in enumerate(self.hosts):
            env = {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(path)}
            if host in LOCAL_HOSTS:
                cmd = self.command
                proc = subprocess.Popen(
                    cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                )
            else:
                remote = (
                    f"mkdir -p {shlex.quote(str(folder))} && "
                    f"printf %s {shlex.quote(text)} > {shlex.quote(str(path))} && "
                    f"cd {shlex.quote(os.getcwd())} && "
                    + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
                    + " exec "
                    + shlex.join(self.command)
                )
                proc = subprocess.Popen(
                    ["ssh", "-o", "BatchMode=yes", host, remote],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            self.ranks.append(Rank(rank, host, proc))
            threading.Thread(target=self._forward, args=(rank, proc), daemon=True).start()

    def _forward(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self._lock:
                self.out.write(f"[rank {rank}] {line}\n")
                self.out.flush()

    def wait(self) -> int:
        """Wait until every rank ended; the exit status of the group."""
        ended: float | None = None  # when the first rank ended, or a stop was asked
        terminated: float | None = None  # when every rank was sent SIGTERM
        asked = killed = False
        while any(r.code is None for r in self.ranks):
            for r in self.ranks:
                if r.code is None and (code := r.process.poll()) is not None:
                    r.code = code
                    self._note(f"rank {r.rank} ({r.host}) exited with status {code}")
                    ended = ended or time.monotonic()
            now = time.monotonic()
            if self._stop.is_set() and not asked:
                # rank 0 stops the others itself once its requests are done
                asked, ended = True, ended or now
                self._signal(signal.SIGTERM, self.ranks[:1])
            if terminated is None and ended is not None and now - ended > self.grace:
                self._note(f"stopping the ranks still running {self.grace:.0f} s later")
                terminated = now
                self._signal(signal.SIGTERM, self.ranks)
            elif terminated is not None and not killed and now - terminated > STOP_SECONDS:
                killed = True
                self._signal(signal.SIGKILL, self.ranks)
            time.sleep(0.2)
        codes = [r.code for r in self.ranks]
        bad = next((c for c in codes if c), 0)
        return 0 if not bad else (bad if bad > 0 else 128 - bad)

    def stop(self, *_: Any) -> None:
        """Stop every rank (Ctrl-C, SIGTERM)."""
        self._stop.set()

    def _signal(self, sig: int, ranks: list[Rank]) -> None:
        for r in ranks:
            if r.process.poll() is None:
                with contextlib.suppress(OSError):
                    r.process.send_signal(sig)

    def _note(self, text: str) -> None:
        with self._lock:
            self.out.write(f"[launch] {text}\n")
            self.out.flush()


def launch(
    hosts: str | None,
    hostfile: Path | None,
    backend: str,
    argv: Sequence[str],
    grace: float = 30.0,
) -> int:
    """``mlxcore launch``: run ``argv`` on every rank and return the group's status."""
    if backend != "ring":
        raise UsageError(
            f"mlxcore launch starts ring ranks; for {backend} start `mlxcore serve "
            f"--distributed --distributed-backend {backend}` with mlx.launch or mpirun"
        )
    names, entries = read_hosts(hosts, hostfile)
    launcher = Launcher(names, argv, grace, entries)
    previous = {sig: signal.signal(sig, launcher.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        launcher.start()
        return launcher.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(launcher.folder, ignore_errors=True)
