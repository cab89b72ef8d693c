"""Compiled state shared across requests: one llguidance tokenizer per model, recent grammars.

Building llguidance's view of a 150k-token vocabulary takes about a second of CPU (and
holds the GIL), so it happens once per tokenizer: lazily at the first constrained
request, or up front with :func:`prepare`. Compiled grammars are kept in a small LRU
keyed by grammar text; each request gets a cheap copy of a pristine matcher.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

import llguidance
import llguidance.hf

from mlxcore.structured.constraints import Constraint, ConstraintError, grammar_text

GRAMMAR_CACHE_SIZE = 64
"""How many compiled grammars each tokenizer keeps."""


class CompiledTokenizer:
    """llguidance's tokenizer for one model, plus an LRU of compiled grammars.

    Thread-safe: requests are set up on the engine thread, while front ends may call
    :func:`prepare` from elsewhere.

    Args:
        tokenizer: mlx-lm's ``TokenizerWrapper`` or a Hugging Face fast tokenizer.
        cache_size: how many compiled grammars to keep.
    """

    def __init__(self, tokenizer: Any, cache_size: int = GRAMMAR_CACHE_SIZE) -> None:
        hf = getattr(tokenizer, "_tokenizer", tokenizer)
        eos = sorted(getattr(tokenizer, "eos_token_ids", None) or {hf.eos_token_id})
        self.eos_token_ids: tuple[int, ...] = tuple(eos)
        try:
            self.ll = llguidance.hf.from_tokenizer(hf, eos_token=list(eos))
        except Exception as exc:
            raise RuntimeError(f"constrained decoding cannot use this tokenizer: {exc}") from exc
        self.vocab_size: int = self.ll.vocab_size
        self.cache_size = cache_size
        self._grammars: collections.OrderedDict[str, llguidance.LLMatcher] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A fresh matcher for ``constraint`` at its start state.

        Raises :class:`ConstraintError` when the grammar does not compile.
        """
        grammar = grammar_text(constraint)
        with self._lock:
            pristine = self._grammars.get(grammar)
            if pristine is not None:
                self._grammars.move_to_end(grammar)
                return pristine.deep_copy()
        pristine = llguidance.LLMatcher(self.ll, grammar, log_level=0)
        if pristine.is_error():
            raise ConstraintError(f"invalid {constraint.describe()}: {pristine.get_error()}")
        with self._lock:
            self._grammars[grammar] = pristine
            while len(self._grammars) > self.cache_size:
                self._grammars.popitem(last=False)
            return pristine.deep_copy()

    def decode(self, token: int) -> str:
        """The text of one token (for error messages)."""
        return str(self.ll.decode_str([token]))

    def cached_grammars(self) -> int:
        """How many compiled grammars are kept now."""
        with self._lock:
            return len(self._grammars)


_compiled: weakref.WeakKeyDictionary[Any, CompiledTokenizer] = weakref.WeakKeyDictionary()
_compiled_lock = threading.Lock()


def compiled_tokenizer(tokenizer: Any) -> CompiledTokenizer:
    """The :class:`CompiledTokenizer` of ``tokenizer``, built at the first call.

    Kept as long as ``tokenizer`` lives (one per loaded model).
    """
    with _compiled_lock:
        found = _compiled.get(tokenizer)
        if found is None:
            found = CompiledTokenizer(tokenizer)
            _compiled[tokenizer] = found
        return found


def prepare(tokenizer: Any, constraint: Constraint | None = None) -> None:
    """Compile ``tokenizer`` (and ``constraint``'s grammar) now, so request set-up is cheap.

    The first call per tokenizer costs about a second of CPU and holds the GIL; call it
    at server start to keep that pause away from running requests. Raises
    :class:`ConstraintError` for a constraint that does not compile.
    """
    compiled = compiled_tokenizer(tokenizer)
    if constraint is not None:
        compiled.matcher(constraint)
