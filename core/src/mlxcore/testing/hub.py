"""A local stand-in for the Hugging Face Hub, for tests without internet.

``LocalHub`` serves model folders as repos over the part of the Hub's HTTP API that
``huggingface_hub.snapshot_download`` uses: the revision info
(``/api/models/OWNER/NAME/revision/REV``), the file tree (``.../tree/REV``) and the files
(``/OWNER/NAME/resolve/REV/FILE``, HEAD and GET, with ``Range`` so a cut download
resumes). Point ``HF_ENDPOINT`` at :attr:`LocalHub.url`. Every request is logged
(:attr:`LocalHub.requests`), and :meth:`LocalHub.stall_after` holds a file's download
after some bytes, so a test can kill a client mid-download.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_API = re.compile(r"^/api/models/([^/]+/[^/]+)/(revision|tree)/([^/?]+)")


class LocalHub:
    """Serves ``repos`` (``{"owner/name": folder}``) on 127.0.0.1 until :meth:`close`."""

    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = {repo: Path(folder) for repo, folder in repos.items()}
        self.requests: list[tuple[str, str, str]] = []
        """``(method, path, Range header)`` of every request, in order."""
        self._stall: dict[str, int] = {}
        self._release = threading.Event()
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, body=False)

            def do_GET(self) -> None:
                hub._serve(self, body=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The endpoint (``HF_ENDPOINT``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def commit(self, repo: str) -> str:
        """The repo's revision: a hash of its files' names and contents' hashes."""
        digest = hashlib.sha1()
        for name in self.files(repo):
            digest.update(name.encode() + self._etag(self.repos[repo] / name).encode())
        return digest.hexdigest()

    def files(self, repo: str) -> list[str]:
        """The repo's files, relative to its folder."""
        root = self.repos[repo]
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    def stall_after(self, filename: str, size: int) -> None:
        """Send at most ``size`` bytes of any file named ``filename``, then hold the
        connection until :meth:`release`."""
        self._stall[filename] = size
        self._release.clear()

    def release(self) -> None:
        """End every stall: held downloads are dropped, later ones are served whole."""
        self._stall.clear()
        self._release.set()

    def downloads(self) -> list[tuple[str, str]]:
        """``(file path, Range)`` of every GET of a file."""
        return [
            (path, rng)
            for method, path, rng in self.requests
            if method == "GET" and "/resolve/" in path
        ]

    def close(self) -> None:
        """Stop serving."""
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    @staticmethod
    def _etag(path: Path) -> str:
        return hashlib.sha1(path.read_bytes()).hexdigest()

    def _serve(self, handler: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = handler.path.split("?", 1)[0]
        with self._lock:
            self.requests.append((handler.command, path, handler.headers.get("Range", "")))
        api, resolve = _API.match(path), _RESOLVE.match(path)
        if api is not None and api.group(1) in self.repos:
            repo = api.group(1)
            info: Any
            if api.group(2) == "revision":
                info = {
                    "id": repo,
                    "sha": self.commit(repo),
                    "siblings": [{"rfilename": f} for f in self.files(repo)],
                }
            else:
                root = self.repos[repo]
                info = [
                    {"type": "file", "path": f, "size": (root / f).stat().st_size,
                     "oid": self._etag(root / f)}
                    for f in self.files(repo)
                ]  # fmt: skip
            self._send(
                handler, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body
            )
            return
        if resolve is None or resolve.group(1) not in self.repos:
            self._send(
                handler,
                404,
                b'{"error": "Repository not found"}',
                {"X-Error-Code": "RepoNotFound"},
                body,
            )
            return
        repo, _, name = resolve.groups()
        file = self.repos[repo] / name
        if not file.is_file():
            self._send(
                handler,
                404,
                b'{"error": "Entry not found"}',
                {"X-Error-Code": "EntryNotFound"},
                body,
            )
            return
        data = file.read_bytes()
        headers = {
            "X-Repo-Commit": self.commit(repo),
            "ETag": f'"{self._etag(file)}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        start = 0
        ranged = re.match(r"bytes=(\d+)-", handler.headers.get("Range", ""))
        if ranged is not None and body:
            start = int(ranged.group(1))
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        limit = self._stall.get(Path(name).name)
        if not body or limit is None:
            self._send(handler, 206 if start else 200, data[start:], headers, body)
            return
        handler.send_response(206 if start else 200)
        for key, value in {**headers, "Content-Length": str(len(data) - start)}.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data[start : max(start, limit)])
        handler.wfile.flush()
        self._release.wait(timeout=120)  # held: the client is killed meanwhile

    @staticmethod
    def _send(
        handler: BaseHTTPRequestHandler,
        status: int,
        data: bytes,
        headers: dict[str, str],
        body: bool,
    ) -> None:
        handler.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            handler.send_header(key, value)
        handler.end_headers()
        if body:
            handler.wfile.write(data)
