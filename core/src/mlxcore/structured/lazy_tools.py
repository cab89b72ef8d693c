"""The processor of a :class:`~mlxcore.structured.call_grammar.LazyToolGrammar`.

Free text costs nothing: until the output contains the call opener the logits pass
through untouched (the output is the same as without the grammar), and each new token
is only compared with the opener. When a token completes the opener (a special token,
or the last piece of a text opener), a fresh matcher of the call grammar starts; any
text the same token holds past the opener is fed to it first. From then on only tokens
the grammar allows may follow, the end of sequence included only where the call may
end, until the closer: then the text is free again and the next opener starts another
call (unless the request allows one call only: a one-token opener is then banned).

Speculative decoders may roll the context back: the processor rolls back the call's
matcher, or forgets a call whose opener was taken back.
"""

from __future__ import annotations

from typing import Any

import attrs
import llguidance
import mlx.core as mx

from mlxcore.structured.compiler import CompiledTokenizer, compiled_tokenizer
from mlxcore.structured.constraints import LazyToolGrammar
from mlxcore.structured.processor import ConstrainedProcessor, ConstraintViolation


@attrs.define
class _Call:
    trigger: int
    """Output index of the token that completed the opener."""
    matcher: llguidance.LLMatcher
    end: int | None = None
    """Output length after its closer (``None``: still open)."""

    @property
    def done(self) -> bool:
        """The call's closer has been written."""
        return self.end is not None


class LazyToolCallProcessor(ConstrainedProcessor):
    """Constrains tool calls in free text (see the module docstring).

    Args:
        pristine: a matcher of the call grammar at its start (copied for each call).
        compiled: the model's compiled tokenizer.
        opener: the text that opens a call.
        prompt_len: the prompt's length in tokens.
        parallel: more than one call allowed.
        opener_token: the opener's id when it is one token (banned after the first
            call without ``parallel``).
        after: text (``</think>``) before which an opener does not count: the model
            is still reasoning (``None``: from the first token).
        may_open: with ``after``: the reasoning is open only if the output starts with
            this text (``<think>``); otherwise openers count from the first token.
        in_reasoning: an opener inside the reasoning starts a call ``"anywhere"`` or at
            the start of a ``"line"`` (the reasoning parser ends the reasoning there);
            ``None``: only after ``after``.
    """

    __name__ = "tool-call grammar"

    def __init__(
        self,
        pristine: llguidance.LLMatcher,
        compiled: CompiledTokenizer,
        opener: str,
        *,
        prompt_len: int | None = None,
        parallel: bool = True,
        opener_token: int | None = None,
        after: str | None = None,
        may_open: str | None = None,
        in_reasoning: str | None = None,
    ) -> None:
        super().__init__(pristine, compiled, "tool-call grammar", prompt_len=prompt_len)
        self.pristine = pristine
        self.opener = opener.encode()
        self.parallel = parallel
        self.opener_token = opener_token
        self.calls: list[_Call] = []
        self._tail = b""
        self._gate = after.encode() if after else b""
        self._may_open = may_open.encode() if after and may_open else b""
        self._in_reasoning = in_reasoning if self._gate else None
        self._armed_at: int | None = None if self._gate and not self._may_open else 0
        """Output index from which the text is the answer (``None``: still reasoning)."""
        self._blank = True
        """No reasoning text but whitespace yet (a line start for ``in_reasoning``)."""

    @property
    def active(self) -> bool:
        """True inside a call (its grammar holds)."""
        return bool(self.calls) and not self.calls[-1].done

    @property
    def done(self) -> bool:
        """Never: the output may go on after a call."""
        return False

    def __call__(self, tokens: Any, logits: mx.array) -> mx.array:
        """The logits masked inside a call, untouched outside (but for a banned opener)."""
        out = super().__call__(tokens, logits)
        if self.active or self.parallel or not self.calls or self.opener_token is None:
            return out
        if self.opener_token >= out.shape[-1]:
            return out
        ban = mx.arange(out.shape[-1]) == self.opener_token
        return mx.where(ban, mx.array(-mx.inf, dtype=out.dtype), out)

    def _advance(self, new: list[int]) -> None:
        for token in new:
            index = len(self.generated)
            self.generated.append(token)
            if self.active:
                call = self.calls[-1]
                if not call.matcher.consume_token(token):
                    raise ConstraintViolation(
                        f"token {token} ({self.compiled.decode(token)!r}) at output position "
                        f"{index} is not allowed by the {self.what}: {self._error()}"
                    )
                self._mask = None
                if call.matcher.is_stopped():  # the closer: free text again
                    call.end = len(self.generated)
                    self._tail = b""
                continue
            self._watch(index, token)

    def _watch(self, index: int, token: int) -> None:
        """Look for the opener in the free text ending with ``token``."""
        if self.calls and not self.parallel:
            return
        piece = self.compiled.ll.decode_bytes([token])
        if index == 0 and self._may_open and piece == self._may_open:
            self._armed_at = None  # the model opened its reasoning: wait for its end
            return
        self._tail += piece
        if self._armed_at is None:
            found = self._tail.find(self._gate)
            if found >= 0:
                self._armed_at = index + 1
                self._tail = self._tail[found + len(self._gate) :]
            elif not self._opens_in_reasoning():
                self._blank = self._blank and not piece.strip()
                keep = max(len(self._gate), len(self.opener))
                self._tail = self._tail[-keep:]
                return
            else:
                self._armed_at = index  # the call ends the reasoning
        found = self._tail.find(self.opener)
        if found < 0:
            keep = len(self.opener) - 1
            self._tail = self._tail[-keep:] if keep else b""
            return
        rest = self._tail[found + len(self.opener) :]
        self._tail = b""
        matcher = self.pristine.deep_copy()
        if rest:
            ids = self.compiled.ll.tokenize_bytes(rest)
            if matcher.try_consume_tokens(ids) != len(ids):
                return  # the token went on past the opener in a way no call can: free
        self.calls.append(_Call(index, matcher))
        self.matcher = matcher
        self._mask = None

    def _opens_in_reasoning(self) -> bool:
        """True when the tail now holds an opener that starts a call inside reasoning."""
        if self._in_reasoning is None:
            return False
        found = self._tail.find(self.opener)
        if found < 0:
            return False
        if self._in_reasoning == "anywhere":
            return True
        prior = self._tail[:found]
        return prior.endswith(b"\n") or (self._blank and not prior.strip())

    def _rewind(self, count: int) -> None:
        count = min(count, len(self.generated))
        for _ in range(count):
            index = len(self.generated) - 1
            self.generated.pop()
            if not self.calls:
                continue
            call = self.calls[-1]
            if call.end is not None and index >= call.end:
                continue  # free text after the call
            if index == call.trigger:
                self.calls.pop()
            elif index > call.trigger:
                if not call.matcher.rollback(1):
                    raise ConstraintViolation(f"cannot roll back the call: {self._error()}")
                call.end = None
        if self._armed_at is not None and len(self.generated) < self._armed_at:
            self._armed_at = None  # back inside the reasoning
            recent = self.generated[:64]
            self._blank = len(self.generated) <= 64 and not (
                self.compiled.ll.decode_bytes(recent).replace(self._may_open, b"", 1).strip()
            )
        if not self.generated:
            self._armed_at = None if self._gate and not self._may_open else 0
            self._blank = True
        if self.active:
            self.matcher = self.calls[-1].matcher
        self._mask = None
        self._tail = self._free_tail()

    def _free_tail(self) -> bytes:
        """The end of the free text after the last call (what may begin an opener)."""
        if self.active:
            return b""
        start = self.calls[-1].end if self.calls and self.calls[-1].end is not None else 0
        start = max(start, self._armed_at or 0)
        if self._armed_at is None:  # the reasoning's end or an opener may be under way
            keep = max(len(self._gate), len(self.opener))
        else:
            keep = len(self.opener) - 1
        recent = self.generated[max(start, len(self.generated) - keep) :]
        tail = self.compiled.ll.decode_bytes(recent) if recent else b""
        return tail[-keep:] if keep else b""


def make_lazy_processor(
    tokenizer: Any,
    constraint: LazyToolGrammar,
    *,
    prompt_len: int | None = None,
    after: str | None = None,
    may_open: str | None = None,
) -> LazyToolCallProcessor:
    """A fresh processor holding ``constraint`` inside the calls of one request.

    Args:
        tokenizer: the model's tokenizer (its compiled form is built once and reused).
        constraint: the call grammar (a bad one raises
            :class:`~mlxcore.structured.constraints.ConstraintError`).
        prompt_len: the prompt length.
        after: see :class:`LazyToolCallProcessor`.
        may_open: see there.
    """
    compiled = compiled_tokenizer(tokenizer)
    ids = tokenizer.encode(constraint.opener, add_special_tokens=False)
    return LazyToolCallProcessor(
        compiled.matcher(constraint),
        compiled,
        constraint.opener,
        prompt_len=prompt_len,
        parallel=constraint.parallel,
        opener_token=int(ids[0]) if len(ids) == 1 else None,
        after=after,
        may_open=may_open,
        in_reasoning=constraint.in_reasoning,
    )
