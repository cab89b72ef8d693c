"""Real English prose for the SpecPrefill fidelity study, from files every machine
with this project's environment has (no network).

Sources (each window records which one, and its character range):

* ``pydoc`` -- ``pydoc_data.topics.topics`` of the CPython standard library: the
  text of the Python Language and Library Reference sections that ``help()`` shows
  (CPython 3.11.7 here; another Python version gives slightly different text).
  Topics that other topics contain (``specialnames``, ``compound``) are skipped in
  favour of their parts, so no text appears twice.
* ``licence`` -- the licence texts in ``/usr/share/common-licenses`` (Debian's
  ``base-files`` package), symlinked duplicates and older versions of a licence
  that is also there in a newer one removed (GFDL-1.2, GPL-1, LGPL-2).
* ``cpython-licence`` -- ``LICENSE.txt`` of the running Python's standard library
  (the history of the software and the licence texts).

A document is split at blank lines into consecutive windows of ``min_tokens`` to
``max_tokens`` tokens (at most ``per_doc`` windows per document; a shorter rest is
dropped). Each window becomes one chat prompt: the text, then a question whose
answer depends on it, under the model's chat template.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

SKIPPED_TOPICS = {"specialnames", "compound"}
"""pydoc topics that contain other topics' text."""

SKIPPED_LICENCES = {"GFDL-1.2", "GPL-1", "LGPL-2"}
"""Older versions of licences whose newer text is also there (near-duplicates)."""

QUESTIONS = (
    "What is the main subject of the text above? Answer in one sentence.",
    "Summarize the text above in two sentences.",
)
"""Asked after the text, alternating by window index."""


@attrs.frozen
class Window:
    """One prompt's text and where it comes from."""

    source: str
    """``pydoc:<topic>``, ``licence:<file name>`` or ``cpython-licence``."""
    start: int
    """First character of the window in the source text."""
    end: int
    """One past its last character."""
    text: str


def documents() -> Iterator[tuple[str, str]]:
    """``(source name, text)`` of every candidate document, in a fixed order."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        if name not in SKIPPED_TOPICS:
            yield f"pydoc:{name}", topics[name]
    seen: set[Path] = set()
    for path in sorted(Path("/usr/share/common-licenses").glob("*")):
        real = path.resolve()
        if path.is_file() and real not in seen and path.name not in SKIPPED_LICENCES:
            seen.add(real)
            yield f"licence:{path.name}", path.read_text(encoding="utf-8", errors="replace")
    lic = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
    if lic.is_file():
        yield "cpython-licence", lic.read_text(encoding="utf-8", errors="replace")


def windows(tokenizer: Any, min_tokens: int, max_tokens: int, per_doc: int) -> Iterator[Window]:
    """Windows of ``min_tokens`` .. ``max_tokens`` tokens cut at blank lines."""
    for source, text in documents():
        offsets = _paragraph_starts(text)
        taken = 0
        i = 0
        while taken < per_doc and i < len(offsets) - 1:
            start = offsets[i]
            j = i + 1
            best = None
            while j < len(offsets):
                size = len(tokenizer.encode(text[start : offsets[j]]))
                if size > max_tokens:
                    break
                best = j
                j += 1
            if best is None:
                i += 1  # a single paragraph longer than max_tokens: skip it
                continue
            chunk = text[start : offsets[best]]
            if len(tokenizer.encode(chunk)) < min_tokens:
                break  # the rest of the document is too short
            yield Window(source, start, offsets[best], chunk.strip())
            taken += 1
            i = best


def _paragraph_starts(text: str) -> list[int]:
    """Offsets where paragraphs start, plus ``len(text)``."""
    starts = [0]
    pos = text.find("\n\n")
    while pos != -1:
        starts.append(pos + 2)
        pos = text.find("\n\n", pos + 2)
    starts.append(len(text))
    return sorted(set(starts))


def chat_prompt(tokenizer: Any, window: Window, index: int) -> list[int]:
    """The window and a question, as the model's chat template tokenizes them."""
    question = QUESTIONS[index % len(QUESTIONS)]
    content = f"{window.text}\n\nQuestion: {question}"
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict):  # some tokenizer versions return a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]
