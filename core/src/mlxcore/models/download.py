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
from collections.abc import Sequence
from pathlib import Path

import httpx

from mlxcore.errors import ModelLoadError

CHUNK = 1 << 20
PARTIAL = ".mlxcore-partial"


def _storage(repo_id: str) -> Path:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")


def download_repo(
    repo_id: str, patterns: Sequence[str], *, revision: str = "main", progress: bool = True
) -> Path:
    """Fetch the files of ``repo_id`` matching ``patterns`` into the Hugging Face cache,
    resuming any file a previous run left part-way; return the snapshot folder.

    Raises:
        ModelLoadError: the repo or a file cannot be had (named), or a file arrived with
            another size than the Hub announced.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import filter_repo_objects

    api = HfApi()
    try:
        info = api.model_info(repo_id, revision=revision)
    except HfHubHTTPError as exc:
        raise ModelLoadError(f"cannot get {repo_id} from the Hub: {exc}") from exc
    except httpx.HTTPError as exc:
        raise ModelLoadError(f"cannot reach the Hub for {repo_id}: {exc}") from exc
    commit = info.sha
    if not commit:
        raise ModelLoadError(f"the Hub gave no revision for {repo_id}")
    names = [s.rfilename for s in info.siblings or []]
    wanted = list(filter_repo_objects(names, allow_patterns=list(patterns)))
    storage = _storage(repo_id)
    snapshot = storage / "snapshots" / commit
    for name in wanted:
        _fetch(repo_id, commit, name, storage, snapshot, progress)
    refs = storage / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / revision).write_text(commit)
    return snapshot


def _fetch(
    repo_id: str, commit: str, name: str, storage: Path, snapshot: Path, progress: bool
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
    except (HfHubHTTPError, httpx.HTTPError) as exc:
        raise ModelLoadError(f"cannot get {name} of {repo_id}: {exc}") from exc
    if not meta.etag or meta.size is None:
        raise ModelLoadError(f"the Hub gave no etag or size for {name} of {repo_id}")
    blob = storage / "blobs" / meta.etag
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.is_file() or blob.stat().st_size != meta.size:
        partial = blob.with_name(blob.name + PARTIAL)
        _transfer(meta.location or url, partial, meta.size, build_hf_headers(), name, progress)
        partial.replace(blob)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))


def _transfer(
    url: str, partial: Path, size: int, headers: dict[str, str], name: str, progress: bool
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
                    raise ModelLoadError(f"cannot download {name}: HTTP {r.status_code}")
                mode = "ab" if r.status_code == 206 else "wb"
                if mode == "wb":
                    bar.reset(total=size)
                with partial.open(mode) as out:
                    for chunk in r.iter_bytes(CHUNK):
                        out.write(chunk)
                        bar.update(len(chunk))
        except httpx.HTTPError as exc:
            raise ModelLoadError(f"download of {name} broke off ({exc}); run it again to resume") from exc
        finally:
            bar.close()
    got = partial.stat().st_size
    if got != size:
        raise ModelLoadError(f"{name}: got {got} bytes, the Hub announced {size}; run it again")
