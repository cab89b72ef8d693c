"""The real ``mlxcore serve`` as a subprocess of the bench.

The server gets the bench's model and engine flags and the same OpenBLAS setting as the
bench process: when this process has the system OpenBLAS preloaded, the server inherits
``LD_PRELOAD``; when it has not, the server is told not to preload it either
(``MLXCORE_NO_OPENBLAS=1``). Whether the server really mapped the library is then read
from its ``/proc/<pid>/maps`` and reported.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import httpx

from mlxcore import blas
from mlxcore.bench.client import HttpTarget
from mlxcore.errors import MlxcoreError

if TYPE_CHECKING:
    from mlxcore.bench.options import BenchSettings

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: the bench's, with the bench's OpenBLAS setting enforced."""
    env = dict(os.environ if base is None else base)
    if not blas.openblas_preloaded():
        env[blas.DISABLE_ENV] = "1"
    return env


def _system_openblas_paths(env: dict[str, str]) -> set[str]:
    paths = {
        os.path.realpath(e)
        for e in env.get("LD_PRELOAD", "").replace(" ", ":").split(":")
        if "openblas" in Path(e).name
    }
    found = blas.openblas_path()
    if found is not None:
        paths.add(os.path.realpath(found))
    return paths


def process_has_openblas(pid: int, env: dict[str, str]) -> bool | None:
    """True when the system OpenBLAS is mapped into process ``pid`` (None: cannot tell).

    A symbol-renamed copy bundled with numpy does not count: only the library the bench
    would preload (or did preload) is looked for.
    """
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None
    paths = _system_openblas_paths(env)
    return any(p in maps for p in paths) if paths else False


class ServerProcess:
    """``python -m mlxcore serve`` running in the background until :meth:`stop`.

    Args:
        model: the model argument (None: the embedded default).
        serve_args: more flags for ``mlxcore serve``.
        host: the address to listen on.
        port: the port (None: a free one).
        log_level: the server's log level.
    """

    def __init__(
        self,
        model: str | None,
        serve_args: Sequence[str] = (),
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_level: str = "warning",
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.env = server_env()
        self.argv = [
            sys.executable,
            "-m",
            "mlxcore",
            "serve",
            *([model] if model else []),
            "--host",
            host,
            "--port",
            str(self.port),
            "--log-level",
            log_level,
            *serve_args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.log_path: Path | None = None
        self.keep_log = False
        self.model_id = ""
        self.openblas: bool | None = None

    @property
    def base_url(self) -> str:
        """The server's root URL."""
        return f"http://{self.host}:{self.port}"

    def target(self) -> HttpTarget:
        """Where clients reach the started server, and the model name to send."""
        return HttpTarget(self.base_url, self.model_id)

    def start(self, timeout: float) -> None:
        """Start the server and wait for ``/health``; learn the model id clients must send.

        Raises:
            MlxcoreError: the server exited or did not answer in ``timeout`` seconds (with the
                end of its log).
        """
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="mlxcore-bench-server-", suffix=".log", delete=False
        )
        self.log_path = Path(self._log.name)
        log.info("starting server: %s", " ".join(self.argv[1:]))
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=self.env
        )
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while True:
                if self.proc.poll() is not None:
                    raise MlxcoreError(
                        f"the server exited with code {self.proc.returncode} before it was "
                        f"ready:\n{self.log_tail()}"
                    )
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise MlxcoreError(
                        f"the server did not answer /health within {timeout:.0f} s:\n"
                        f"{self.log_tail()}"
                    )
                time.sleep(0.2)
            models = client.get("/v1/models").json()
        self.model_id = str(models["data"][0]["id"])
        self.openblas = process_has_openblas(self.proc.pid, self.env)
        log.info("server ready at %s (pid %d)", self.base_url, self.proc.pid)

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's output."""
        if self.log_path is None:
            return ""
        if self._log is not None:
            self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str, exc: BaseException) -> MlxcoreError:
        """An error for a failed measurement: the cause, the server's state and log.

        The log file is kept (its path is in the message) so the failure can be studied.
        """
        state = "running"
        if self.proc is not None and self.proc.poll() is not None:
            state = f"exited with code {self.proc.returncode}"
        self.keep_log = True
        return MlxcoreError(
            f"{what} failed: {type(exc).__name__}: {exc}\nthe server is {state}; its log is "
            f"{self.log_path}; it ends with:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """Stop the server (SIGINT, then SIGKILL after 20 s); delete its log unless a failure
        asked to keep it."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.log_path is not None and not self.keep_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None and not isinstance(exc, KeyboardInterrupt):
            self.keep_log = True
        self.stop()


def bench_server(path: str, settings: BenchSettings) -> ServerProcess:
    """The server of a bench run on ``path``: the run's serve arguments, host and port,
    logging at ``warning`` unless the bench itself debugs."""
    level = settings.log_level if settings.log_level in ("debug", "trace") else "warning"
    return ServerProcess(
        path, settings.serve_args, host=settings.host, port=settings.port, log_level=level
    )
