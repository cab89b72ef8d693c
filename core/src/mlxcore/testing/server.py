"""Real ``mlxcore serve`` subprocesses for end-to-end tests.

:class:`ServerPool` starts ``python -m mlxcore serve MODEL --port PORT *flags`` on a
free port, waits for ``GET /health`` and stops every server it started when closed.
The pytest plugin exposes it as the module fixture ``mlxcore_server`` (servers stop
when the module's tests end) and the session fixture ``mlxcore_session_server``
(``(model, *flags) -> Server``), for this project's tests and for third-party plugin
authors alike.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

STARTUP_TIMEOUT = 120.0


def free_port() -> int:
    """A TCP port nothing listens on right now (bind to port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listens_on(pid: int, port: int) -> bool | None:
    """True when process ``pid`` holds a TCP socket listening on ``port``; None where
    ``/proc`` cannot tell (not Linux)."""
    inodes: set[str] = set()
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(FileNotFoundError):
                for line in Path(table).read_text().splitlines()[1:]:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return True
    return False


class Server:
    """One ``mlxcore serve`` subprocess."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"

    @property
    def v1(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"{self.base_url}/v1"

    def log(self) -> str:
        """Everything the server wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def health(self, timeout: float = 5.0) -> dict[str, object]:
        """``GET /health`` (no key needed); raises on anything but 200."""
        r = httpx.get(f"{self.base_url}/health", timeout=timeout)
        r.raise_for_status()
        body: dict[str, object] = r.json()
        return body

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        """Poll ``/health`` until it answers 200; fail with the server's log otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                pytest.fail(
                    f"mlxcore serve exited with {self.proc.returncode} before it was ready:\n"
                    f"{self.log()}",
                    pytrace=False,
                )
            with contextlib.suppress(httpx.HTTPError):
                ok = httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200
                # Another test run may have taken the port: only our own listener counts.
                if ok and self.listening():
                    return
            time.sleep(0.2)
        self.stop()
        pytest.fail(
            f"mlxcore serve did not answer /health within {timeout:.0f}s:\n{self.log()}",
            pytrace=False,
        )

    def listening(self) -> bool:
        """True unless ``/proc`` shows that this server's process does not hold the port."""
        return listens_on(self.proc.pid, self.port) is not False

    def stop(self) -> None:
        """SIGINT, then SIGKILL if it does not exit within 15 s."""
        if self.alive():
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


ServerFactory = Callable[..., Server]
"""``(model, *flags) -> Server``, ready to serve."""


class ServerPool:
    """Starts servers on free ports; :meth:`close` stops every one still running."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[Server] = []

    def __call__(self, model: Path | str, *flags: str) -> Server:
        """Start ``mlxcore serve model *flags`` and wait until it is ready."""
        for attempt in range(3):
            port = free_port()
            log_path = self.logs / f"server-{port}.log"
            cmd = [sys.executable, "-m", "mlxcore", "serve", str(model), "--port", str(port)]
            cmd += ["--log-level", "warning", *flags]
            with log_path.open("wb") as out:
                proc = subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ)
                )
            server = Server(proc, port, log_path)
            self.started.append(server)
            # Another process may take the port between free_port() and the bind.
            try:
                server.wait_ready()
            except pytest.fail.Exception:
                if attempt < 2 and "address already in use" in server.log().lower():
                    continue
                raise
            return server
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Stop every server this pool started."""
        for server in self.started:
            server.stop()
