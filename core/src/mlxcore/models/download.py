"""Resumable downloads of a Hugging Face repo into the standard Hugging Face cache.

``huggingface_hub`` (2.x) downloads each file to a temporary name unique to the process
and drops it on failure, so a download killed at 90% starts again from zero. Models are
tens of GB; :func:`download_repo` keeps what arrived: each file goes to
``blobs/ETAG.mlxcore-partial`` and the next run asks only for the rest (an HTTP
``Range`` request). Finished files land where ``huggingface_hub`` puts them (``blobs/``,
``snapshots/COMMIT/`` links, ``refs/REVISION``), so ``mlxcore serve owner/name``, the
``hf`` CLI and every other tool find them. The metadata calls are ``huggingface_hub``'s:
``HF_ENDPOINT``, ``HF_HOME`` / ``HF_HUB_CACHE`` and ``HF_TOKEN`` are honoured.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from mlxcore.errors import ModelLoadError
from mlxcore.models.folder import is_complete


class DownloadError(ModelLoadError):
    """A download that failed, with what kind of failure it was (``status``, as HTTP
    says it: 404 no such repo or file, 503 the Hub cannot be reached, 502 it answered
    wrongly)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _network_errors() -> tuple[type[BaseException], ...]:
    """What a failed connection raises: huggingface_hub 2.x talks through ``httpx2``,
    earlier releases and our own downloads through ``httpx``."""
    kinds: list[type[BaseException]] = [httpx.HTTPError, OSError]
    try:
        import httpx2

        kinds.append(httpx2.HTTPError)
    except ImportError:  # an older huggingface_hub
        pass
    return tuple(kinds)


NETWORK_ERRORS = _network_errors()


CHUNK = 1 << 20
PARTIAL = ".mlxcore-partial"

Progress = Callable[[str, str, int, int], None]
"""Called as a download goes: ``(file, etag, bytes so far, file size)``."""


def _storage(repo_id: str) -> Path:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")


def download_repo(
    repo_id: str,
    patterns: Sequence[str],
    *,
    revision: str = "main",
    progress: bool = True,
    on_progress: Progress | None = None,
) -> Path:
    """Fetch the files of ``repo_id`` matching ``patterns`` into the Hugging Face cache,
    resuming any file a previous run left part-way; return the snapshot folder
    (``progress``: bars on the terminal; ``on_progress``: told of every chunk).

    Raises:
        ModelLoadError: the repo or a file cannot be had (named), or a file arrived with
            another size than the Hub announced.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError
    from huggingface_hub.utils import filter_repo_objects

    api = HfApi()
    try:
        info = api.model_info(repo_id, revision=revision)
    except HFValidationError as exc:
        raise DownloadError(f"{repo_id!r} is not a Hugging Face repo id: {exc}", 404) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 502
        kind = 404 if status in (401, 403, 404) else 502
        raise DownloadError(f"cannot get {repo_id} from the Hub: {exc}", kind) from exc
    except NETWORK_ERRORS as exc:
        raise DownloadError(f"cannot reach the Hub for {repo_id}: {exc}", 503) from exc
    commit = info.sha
    if not commit:
        raise DownloadError(f"the Hub gave no revision for {repo_id}", 502)
    names = [s.rfilename for s in info.siblings or []]
    wanted = list(filter_repo_objects(names, allow_patterns=list(patterns)))
    storage = _storage(repo_id)
    snapshot = storage / "snapshots" / commit
    for name in wanted:
        _fetch(repo_id, commit, name, storage, snapshot, progress, on_progress)
    refs = storage / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / revision).write_text(commit)
    return snapshot


def cached_or_downloaded(
    repo_id: str,
    patterns: Sequence[str],
    *,
    progress: bool = True,
    on_progress: Progress | None = None,
) -> tuple[Path, bool]:
    """``repo_id``'s folder from the Hugging Face cache when it is whole there (no
    network at all), else from :func:`download_repo`; and whether it was downloaded."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        here = Path(
            snapshot_download(repo_id, allow_patterns=list(patterns), local_files_only=True)
        )
        if is_complete(here):
            return here, False
    except LocalEntryNotFoundError:
        pass
    except HFValidationError as exc:
        raise DownloadError(f"{repo_id!r} is not a Hugging Face repo id: {exc}", 404) from exc
    return download_repo(repo_id, patterns, progress=progress, on_progress=on_progress), True


def _fetch(
    repo_id: str,
    commit: str,
    name: str,
    storage: Path,
    snapshot: Path,
    progress: bool,
    on_progress: Progress | None,
) -> None:
    """One file: its blob (resumed from the partial one) and the snapshot's link to it."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import build_hf_headers

    link = snapshot / name
    if link.exists():
        return
    url = hf_hub_url(repo_id, name, revision=commit)
    try:
        meta = get_hf_file_metadata(url)
    except (HfHubHTTPError, *NETWORK_ERRORS) as exc:  # type: ignore[misc]
        raise DownloadError(f"cannot get {name} of {repo_id}: {exc}", 503) from exc
    if not meta.etag or meta.size is None:
        raise DownloadError(f"the Hub gave no etag or size for {name} of {repo_id}", 502)
    blob = storage / "blobs" / meta.etag
    blob.parent.mkdir(parents=True, exist_ok=True)
    etag, size = meta.etag, meta.size

    def told(done: int) -> None:
        if on_progress is not None:
            on_progress(name, etag, done, size)

    if not blob.is_file() or blob.stat().st_size != size:
        partial = blob.with_name(blob.name + PARTIAL)
        _transfer(meta.location or url, partial, size, build_hf_headers(), name, progress, told)
        partial.replace(blob)
    else:
        told(size)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))


def _transfer(
    url: str,
    partial: Path,
    size: int,
    headers: dict[str, str],
    name: str,
    progress: bool,
    told: Callable[[int], None],
) -> None:
    """Append the rest of ``url`` to ``partial`` (everything when the server ignores the
    range) until it holds ``size`` bytes."""
    from tqdm.auto import tqdm

    have = partial.stat().st_size if partial.is_file() else 0
    if have > size:
        partial.unlink()
        have = 0
    if have < size:
        ask = {**headers, "Range": f"bytes={have}-"} if have else headers
        bar = tqdm(
            total=size, initial=have, unit="B", unit_scale=True, desc=name, disable=not progress
        )
        try:
            with httpx.stream("GET", url, headers=ask, follow_redirects=True, timeout=60) as r:
                if r.status_code not in (200, 206):
                    raise DownloadError(f"cannot download {name}: HTTP {r.status_code}", 502)
                mode = "ab" if r.status_code == 206 else "wb"
                if mode == "wb":
                    bar.reset(total=size)
                done = have if mode == "ab" else 0
                told(done)
                with partial.open(mode) as out:
                    for chunk in r.iter_bytes(CHUNK):
                        out.write(chunk)
                        bar.update(len(chunk))
                        done += len(chunk)
                        told(done)
        except httpx.HTTPError as exc:
            message = f"download of {name} broke off ({exc}); run it again to resume"
            raise DownloadError(message, 503) from exc
        finally:
            bar.close()
    got = partial.stat().st_size
    if got != size:
        message = f"{name}: got {got} bytes, the Hub announced {size}; run it again"
        raise DownloadError(message, 502)
