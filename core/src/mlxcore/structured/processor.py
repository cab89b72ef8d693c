"""The per-request logits processor that enforces a constraint, token by token.

It follows mlx-lm's processor signature, ``(tokens, logits) -> logits``, where
``tokens`` is the whole context so far (prompt, then generated tokens). On each call
it feeds the tokens generated since its last call to the grammar matcher (the last
one may still be a lazy MLX array in the pipelined decoder; reading it waits for
it), computes the set of allowed next tokens as a bitmask and sets every other
logit to ``-inf``. When the grammar is complete only EOS is allowed, so the
request ends. A token the mask forbade (another processor undid the mask, a
speculative decoder skipped it) raises :class:`ConstraintViolation`, which the
engine turns into a failure of that request alone. A context shorter than the last
one (a speculative decoder rolled back) rolls the matcher back too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import llguidance
import mlx.core as mx
import numpy as np

from mlxcore.errors import RequestFault
from mlxcore.structured.compiler import CompiledTokenizer, compiled_tokenizer
from mlxcore.structured.constraints import Constraint


class ConstraintViolation(RuntimeError):
    """A generated token broke the constraint, or the matcher failed."""


class ConstraintUnsatisfiable(ConstraintViolation, RequestFault):
    """No token the grammar allows next can be consumed: the constraint cannot be followed
    with this model's tokenizer (the request's fault, answered with a 400)."""

    code = "unsatisfiable_constraint"


@mx.compile
def _masked(words: mx.array, logits: mx.array) -> mx.array:
    """``logits`` with every token whose bit is 0 in ``words`` set to ``-inf`` (when no
    allowed token has a finite logit left, the allowed tokens get 0 each).

    ``words`` holds 32 token bits per int32 (bit ``i`` of word ``w`` is token
    ``32 * w + i``) and covers at least the width of ``logits``.
    """
    # Built here, not at import: a lazy module-level array belongs to the importing
    # thread's stream, and the engine evaluates on its own thread.
    shifts = mx.arange(32, dtype=mx.int32)
    bits = ((words[:, None] >> shifts) & 1).reshape(-1)[: logits.shape[-1]].astype(mx.bool_)
    never = mx.array(-mx.inf, dtype=logits.dtype)
    masked = mx.where(bits, logits, never)
    # An earlier processor may have banned every token the constraint allows (min_tokens
    # bans the end of sequence once the grammar is complete): the constraint wins, and
    # its tokens are then equally likely instead of a distribution of -inf only.
    fallback = mx.where(bits, mx.zeros_like(logits), never)
    return mx.where(mx.any(masked > never), masked, fallback)


def apply_bitmask(logits: mx.array, words: mx.array) -> mx.array:
    """Mask ``logits`` (shape ``(1, vocab)`` or ``(vocab,)``) with an int32 token bitmask.

    Measured on the CPU back end as the fastest of the candidates (see
    docs/decisions/0002-constrained-decoding.md): about 0.15 ms for 152k tokens.
    """
    return _masked(words, logits)


class ConstrainedProcessor:
    """Enforces one constraint on one request (see the module docstring).

    Args:
        matcher: an llguidance matcher at its start state, owned by this processor.
        compiled: the model's compiled tokenizer (vocabulary size, token texts).
        what: the constraint's description, for error messages.
        prompt_len: the prompt's length in tokens; by default the length of the
            context at the first call (the engine's first call is the prompt alone).
        start_after: token ids that open the constrained part: until they appear in
            the output, generation is free (e.g. the ids of ``</think>`` to let a
            reasoning model think first). Empty means constrain from the start.
        may_open: a token that may instead open a free block at the first output
            position (the id of ``<think>``): constrained from the first token, unless
            the model opens its reasoning there; then free until ``start_after``.
        exit_token: a token that, inside the free part, starts the constrained part
            itself (a tool-call opener that ends unclosed reasoning): the grammar
            begins with it.
        exit_anywhere: the exit token counts anywhere, not only at the start of a line
            (or of the reasoning).
    """

    __name__ = "structured output"

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        compiled: CompiledTokenizer,
        what: str,
        *,
        prompt_len: int | None = None,
        start_after: Sequence[int] = (),
        may_open: int | None = None,
        exit_token: int | None = None,
        exit_anywhere: bool = False,
    ) -> None:
        self.matcher = matcher
        self.exit_token = exit_token if start_after else None
        self.exit_anywhere = exit_anywhere
        self.compiled = compiled
        self.what = what
        self.start_after = list(start_after)
        self.may_open = may_open if self.start_after else None
        self.generated: list[int] = []
        self._initial: int | None = 0 if not self.start_after or self.may_open is not None else None
        self.active_from: int | None = self._initial
        """Index in ``generated`` where the constrained part starts (``None``: not yet)."""
        self._seen = prompt_len
        self._words: np.ndarray | None = None
        self._mask: mx.array | None = None

    @property
    def active(self) -> bool:
        """True once the constrained part has started."""
        return self.active_from is not None

    @property
    def done(self) -> bool:
        """True when the constraint is satisfied and only EOS may follow."""
        return self.active and bool(self.matcher.is_stopped())

    def __call__(self, tokens: Any, logits: mx.array) -> mx.array:
        """Bring the matcher to ``tokens`` (the context: prompt and output so far) and
        return the masked ``logits``.

        Between two calls the context may have grown, shrunk, or had its last tokens
        replaced (a speculative decoder conditions each verified position on drafts that
        the next round may have rejected): the matcher is rolled back to the part both
        contexts share, then fed what is new.
        """
        length = len(tokens)
        if self._seen is None:
            self._seen = length
        else:
            self._sync(tokens, length)
        if not self.active:
            return logits
        return apply_bitmask(logits, self._current_mask(logits.shape[-1]))

    def _sync(self, tokens: Any, length: int) -> None:
        """Roll back to what ``tokens`` shares with the context seen, then feed the rest.

        The last :data:`RECHECK` output tokens and the new ones are read in one go (one
        wait for the newest token); earlier ones only when the difference starts before.
        """
        assert self._seen is not None
        prompt = self._seen - len(self.generated)
        overlap = min(len(self.generated), length - prompt)
        start = prompt + max(0, overlap - RECHECK)
        window = _token_list(tokens[start:length]) if length > start else []
        if overlap <= 0:
            shared = min(length, self._seen)
        else:
            shared = self._shared(tokens, window, start, prompt + overlap)
        if shared < self._seen:
            self._rewind(self._seen - shared)
            self._seen = shared
        if length > self._seen:
            if self._seen >= start:
                self._advance(window[self._seen - start :])
            else:
                self._advance(_token_list(tokens[self._seen :]))
            self._seen = length

    def _shared(self, tokens: Any, window: list[int], start: int, end: int) -> int:
        """How many leading tokens of ``tokens`` are those the matcher has seen (up to
        ``end``), from ``window`` (``tokens[start:]``) unless the difference starts before."""
        prompt = self._seen - len(self.generated) if self._seen is not None else 0
        now = window[: end - start]
        before = self.generated[start - prompt : end - prompt]
        first = next((i for i, (a, b) in enumerate(zip(now, before, strict=True)) if a != b), None)
        if first is None:
            return end
        if first > 0 or start == prompt:
            return start + first
        everything = _token_list(tokens[prompt:end])  # the difference may start earlier
        first = next(
            (i for i, (a, b) in enumerate(zip(everything, self.generated, strict=False)) if a != b),
            len(everything),
        )
        return prompt + first

    def _advance(self, new: list[int]) -> None:
        for token in new:
            if not self.generated and token == self.may_open and self.active_from == 0:
                self.generated.append(token)  # the model opened its reasoning: free now
                self.active_from = None
                self._mask = None
                continue
            self.generated.append(token)
            if self.active_from is None:
                if token == self.exit_token and self._line_start():
                    self.active_from = len(self.generated) - 1  # the call ends the reasoning
                else:
                    tail = self.generated[-len(self.start_after) :]
                    if tail == self.start_after:
                        self.active_from = len(self.generated)
                    continue
            if not self.matcher.consume_token(token):
                raise ConstraintViolation(
                    f"token {token} ({self.compiled.decode(token)!r}) at output position "
                    f"{len(self.generated) - 1} is not allowed by the {self.what}: "
                    f"{self._error()}"
                )
            self._mask = None

    def _line_start(self) -> bool:
        """The last generated token (the exit token) starts a line of the free part."""
        if self.exit_anywhere:
            return True
        before = self.generated[:-1]
        if before and before[0] == self.may_open:
            before = before[1:]
        if not before:
            return True
        text = self.compiled.ll.decode_bytes(before[-1:])
        if text.endswith(b"\n"):
            return True
        return len(before) <= 64 and not self.compiled.ll.decode_bytes(before).strip()

    def _rewind(self, count: int) -> None:
        count = min(count, len(self.generated))
        if self.active_from is not None:
            consumed = len(self.generated) - self.active_from
            undo = min(count, consumed)
            if undo and not self.matcher.rollback(undo):
                raise ConstraintViolation(f"cannot roll back {undo} tokens: {self._error()}")
            self._mask = None
        del self.generated[len(self.generated) - count :]
        if self.active_from is not None and len(self.generated) < self.active_from:
            self.active_from = None if self.start_after else 0
        if not self.generated:
            self.active_from = self._initial
            self._mask = None

    def _current_mask(self, width: int) -> mx.array:
        if self._mask is None:
            if self._words is None:
                size = (max(width, self.compiled.vocab_size) + 31) // 32
                self._words = np.zeros(size, dtype=np.int32)
            filled = (self.compiled.vocab_size + 31) // 32 * 4
            self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, filled)
            if self.matcher.is_error():
                raise ConstraintViolation(f"the {self.what} matcher failed: {self._error()}")
            self._drop_unconsumable(self._words)
            words = self._words
            if self.may_open is not None and not self.generated:
                words = words.copy()  # the first token may also open the reasoning
                words.view(np.uint32)[self.may_open // 32] |= np.uint32(1 << (self.may_open % 32))
            self._mask = mx.array(words)
        return self._mask

    def _drop_unconsumable(self, words: np.ndarray) -> None:
        """Clear, in a narrow mask (at most :data:`NARROW` tokens), the tokens the matcher's
        own consume step refuses, and raise :class:`ConstraintUnsatisfiable` when none is
        left.

        llguidance 1.9 can allow a token it then refuses to consume: the first byte of a
        forced 4-byte UTF-8 character, on byte-level tokenizers. Such masks are forced
        paths, one or two tokens wide; wide masks are left as they are.
        """
        nonzero = np.flatnonzero(words)
        if len(nonzero) > NARROW:
            return
        bits = words.view(np.uint32)
        tokens = [32 * int(w) + b for w in nonzero for b in range(32) if bits[w] >> b & 1]
        if len(tokens) > NARROW:
            return
        kept = 0
        for token in tokens:
            if token in self.compiled.eos_token_ids or self._consumable(token):
                kept += 1
            else:
                bits[token // 32] &= ~np.uint32(1 << (token % 32))
        if tokens and not kept:
            raise ConstraintUnsatisfiable(
                f"the {self.what} cannot be followed with this model's tokenizer at output "
                f"position {len(self.generated)}: no token it allows can be produced "
                f"(characters outside the Basic Multilingual Plane in a forced part of the "
                f"pattern are a known cause)"
            )

    def _consumable(self, token: int) -> bool:
        consumed = self.matcher.try_consume_tokens([token])
        if consumed:
            self.matcher.rollback(consumed)
        return consumed == 1

    def _error(self) -> str:
        return str(self.matcher.get_error()).split("\n<state>", 1)[0].strip() or "no detail"


NARROW = 8
"""Masks allowing at most this many tokens are checked token by token."""

RECHECK = 64
"""Output tokens compared at each call to find where the context changed."""


def _token_list(tokens: Any) -> list[int]:
    """Token ids as ints; reading an MLX array waits for a token still being computed."""
    if isinstance(tokens, mx.array):
        ids: list[int] = tokens.tolist()  # type: ignore[assignment]
        return ids
    return [int(t) for t in tokens]


def make_processor(
    tokenizer: Any,
    constraint: Constraint,
    *,
    prompt_len: int | None = None,
    start_after: Sequence[int] = (),
    may_open: int | None = None,
    exit_token: int | None = None,
    exit_anywhere: bool = False,
) -> ConstrainedProcessor:
    """A fresh processor enforcing ``constraint`` for one request.

    Args:
        tokenizer: the model's tokenizer (mlx-lm ``TokenizerWrapper``); its compiled form
            is built at the first call and then reused.
        constraint: what the output must be (validated: a bad one raises
            :class:`~mlxcore.structured.constraints.ConstraintError`).
        prompt_len: the prompt length (see :class:`ConstrainedProcessor`).
        start_after: token ids after which the constraint starts (see there).
        may_open: a token that may open a free block first (see there).
        exit_token: a token that starts the constrained part inside the free one.
        exit_anywhere: see :class:`ConstrainedProcessor`.
    """
    compiled = compiled_tokenizer(tokenizer)
    return ConstrainedProcessor(
        compiled.matcher(constraint),
        compiled,
        constraint.describe(),
        prompt_len=prompt_len,
        start_after=start_after,
        may_open=may_open,
        exit_token=exit_token,
        exit_anywhere=exit_anywhere,
    )
