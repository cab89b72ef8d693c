"""The default decoder: plain batched decoding, pipelined like ``mlx_lm.generate``.

Each step launches the forward pass for the tokens sampled in the previous step
(still lazy arrays) and only then materialises those tokens, so Python's
per-step work overlaps with MLX's computation. A sequence's tokens are
therefore reported one step after they were sampled, and a sequence that just
joined gets nothing from its first step.

**On the CPU, greedy batches skip the normalisation.** ``mlx_lm.generate`` picks a greedy token as
``argmax(logits - logsumexp(logits))``; on the CPU the ``exp`` over a 150K-token
vocabulary costs more than the model's own forward pass for small models (measured: 70 ms
of a 160 ms step at batch 32). Subtracting a per-row constant keeps the order of the
logits, and it can only change the argmax when rounding makes a smaller logit equal to
the largest one, which needs the two within a few units in the last place. So when every
sequence is greedy and no one asked for logprobs, a step takes ``argmax(logits)`` and
also flags the rows where another logit lies within
:data:`~mlxcore.engine.row_sampling.NEAR_TIE` of the maximum; before
the tokens are reported, a flagged row gets mlx-lm's exact computation instead. The tokens
are always those of the exact path.

**The check runs after the next step is launched.** Waiting for a step's flags before
building the next step's graph left the CPU idle while Python built it (5% of a step on a
small model), and reading a flag through a new operation queued it behind the next step.
So the next step is launched on the raw argmax first, then the flags (computed with their
step) are read; where a flagged row's exact pick is another token, the batch cache takes
the step's token back (``trim``) and the step is launched again (counted in
``greedy_relaunched_steps``). Layers that cannot take a token back (recurrent state) and
rows with a logits processor that keeps state (a grammar; mlx-lm's penalties are marked
:func:`~mlxcore.engine.strategies.stateless`) check before launching, as before. On
a GPU (``settle_free``, see :mod:`mlxcore.engine.row_sampling`) steps take mlx-lm's exact
pick and draw lazily instead: the next step's graph is then built while the GPU computes.

**Rows leave lazily.** Taking a row out of mlx-lm's batch caches copies every layer's
keys and values, and must first wait for the step in flight: done at every removal, it
stretched the running streams' gap to about two steps each time a stream ended (16
streams ending together: a dozen such gaps, the inter-token p99). A removed sequence's
cache is extracted at once (lazily), but its row stays in the batch, computed and
ignored, until the next join (which waits for the step in flight anyway) or until
:data:`LEFT_SHARE` of the rows have left; then one compaction drops them all.
"""

from __future__ import annotations

from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache

from mlxcore.engine.adapters import adapters_of, forward
from mlxcore.engine.kv_quant import BatchQuantizedKVCache, KVQuantization
from mlxcore.engine.row_sampling import (
    BatchDraws,
    PendingDraw,
    exact_greedy,
    near_ties,
    settle,
    settle_free_default,
)
from mlxcore.engine.sampling import (
    RandomSampler,
    greedy,
    token_with_logprobs,
    tokens_with_logprobs,
)
from mlxcore.engine.strategies import (
    Decoder,
    DecodeSequence,
    LayerCache,
    Salvaged,
    SequenceCache,
    StepToken,
    is_stateless,
)


class _BatchKVCache(BatchKVCache):
    """mlx-lm's batch KV cache, but a lone row's one-token step gets no mask, as
    mlx-lm's own ``KVCache`` gives it: with one row there is no padding to hide (a merge
    of one cache has none, and ``filter`` shifts the kept rows' common padding away), so
    the all-true mask only cost its construction and a masked attention each layer."""

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> Any:
        lone = self.keys is not None and self.keys.shape[0] == 1
        if N == 1 and lone and not return_array and kwargs.get("window_size") is None:
            return None
        return super().make_mask(N, return_array=return_array, **kwargs)


def _merged(layers: list[Any]) -> Any:
    """One layer's batch cache for the sequences' own ``layers``."""
    if type(layers[0]) is KVCache:
        return _BatchKVCache.merge(layers)
    return type(layers[0]).merge(layers)


_TAKES_BACK = (BatchKVCache, BatchQuantizedKVCache, _BatchKVCache)
"""Batch cache layers whose last token can be taken back (``trim``): a step on them need
not wait for the previous step's near-tie check."""

JOIN_BYTES = 256 * 2**20
"""The most cache that joins the batch in one step: merging copies every joining cache
into the batch's (16 choices of one 2,500-token prompt on SmolLM2, 1.8 GB, held a stream
beside them for 2.7 s); more joiners wait for the next steps."""

LEFT_SHARE = 0.25
"""Compact the batch once this share of its rows belongs to removed sequences."""


@attrs.define(eq=False)
class _Slot:
    """A sequence in the batch and its in-flight (sampled, unreported) token."""

    seq: DecodeSequence
    fed: int
    """How many of ``seq.tokens`` the batch cache holds."""
    in_flight: bool = False
    """True when a sampled token for this sequence is waiting in ``_pending``."""
    left: bool = False
    """The sequence was removed; its row stays until the batch is compacted."""
    stateful: bool = attrs.field(init=False)
    """A logits processor of the sequence keeps state (it must not see a token that a
    near tie's check may still replace)."""

    def __attrs_post_init__(self) -> None:
        self.stateful = not all(is_stateless(p) for p in self.seq.logits_processors)


class PlainDecoder(Decoder):
    """One token per sequence per step, all sequences in one forward pass.

    A joining sequence's own cache is merged into mlx-lm's batch caches
    (``BatchKVCache``, ``ArraysCache``, ...) and extracted back when it leaves. With
    ``kv_quant`` the attention layers switch to
    :class:`~mlxcore.engine.kv_quant.BatchQuantizedKVCache` once a sequence of the batch
    reaches the quantization start (see :mod:`mlxcore.engine.kv_quant`).
    """

    name = "plain"
    runs_in_lockstep = True
    supports_position_offset = True
    supports_kv_quantization = True
    supports_adapters = True
    supports_hold = True

    def __init__(
        self,
        model: Any,
        kv_quant: KVQuantization | None = None,
        *,
        settle_free: bool | None = None,
    ) -> None:
        self.model = model
        self.settle_free = settle_free_default() if settle_free is None else settle_free
        """Steps leave nothing to settle (see :mod:`mlxcore.engine.row_sampling`): no
        fast greedy path, no proposals; the default on a GPU."""
        self._adapted = adapters_of(model) is not None
        """LoRA adapters are attached (fixed at load): only then are rows' requests read."""
        self.kv_quant = kv_quant
        self._quantized = False
        """True while the batch cache's attention layers are quantized."""
        self.slots: list[_Slot] = []
        self._left = 0
        """How many of ``slots`` belong to removed sequences (kept until a compaction)."""
        self.cache: LayerCache = []
        self._takes_back = True
        """Every layer of ``cache`` can take a token back (set when the batch cache is built:
        the layer types follow the model, and quantizing keeps the answer)."""
        self._joining: list[DecodeSequence] = []
        self._pending: Any = None  # lazy (B,) tokens sampled last step
        self._pending_logprobs: Any = None  # lazy (B, vocab) or None
        self._unchecked: tuple[Any, Any] | None = None  # (logits, near-tie rows) of a fast step
        self._draw: PendingDraw | None = None
        """The last sampled step's draw, until its flagged rows are redone."""
        self._rows = BatchDraws()
        """The rows' sampling settings and random keys, in batch order."""
        self._touched = False
        """True from the moment a step changes the batch cache until the step returns: a
        failure then leaves the cache in an unknown state (nothing can be salvaged)."""
        self.exact_fallbacks = 0
        """Rows of fast greedy steps that took the exact path (near ties)."""
        self.redrawn = 0
        """Rows of sampled steps drawn again the direct way (all proposals rejected,
        or a greedy row's near tie)."""
        self.relaunched = 0
        """Steps launched again because a near tie's exact pick changed their input."""

    def stats(self) -> dict[str, float]:
        return {
            "greedy_exact_fallbacks": self.exact_fallbacks,
            "sampling_redraws": self.redrawn,
            "greedy_relaunched_steps": self.relaunched,
        }

    def __len__(self) -> int:
        return len(self.slots) - self._left + len(self._joining)

    def add(self, seq: DecodeSequence) -> None:
        self._joining.append(seq)

    def remove(self, uid: int) -> SequenceCache | None:
        """Take ``uid`` out: its own cache now (lazily), its row at the next compaction."""
        for i, seq in enumerate(self._joining):
            if seq.uid == uid:
                del self._joining[i]
                return SequenceCache(seq.cache, len(seq.tokens) - 1)
        idx = next((i for i, s in enumerate(self.slots) if s.seq.uid == uid and not s.left), None)
        if idx is None:
            return None
        slot = self.slots[idx]
        own = SequenceCache([layer.extract(idx) for layer in self.cache], slot.fed)
        slot.left = True
        self._left += 1
        if self._left == len(self.slots):
            self._compact()
        return own

    def _compact_if_due(self) -> None:
        left = self._left
        if left and (self._joining or left >= LEFT_SHARE * len(self.slots)):
            self._compact()

    def _compact(self) -> None:
        """Drop the rows of removed sequences from the batch (waits for the step in flight)."""
        self._settle()
        keep = [i for i, slot in enumerate(self.slots) if not slot.left]
        self.slots = [self.slots[i] for i in keep]
        self._left = 0
        self._rows.keep(keep)
        if keep:
            for layer in self.cache:
                layer.filter(keep)
            keep_idx = mx.array(keep)
            if self._pending is not None:
                self._pending = self._pending[keep_idx]
            if self._pending_logprobs is not None:
                self._pending_logprobs = self._pending_logprobs[keep_idx]
        else:
            self.cache = []
            self._quantized = False
            self._pending = self._pending_logprobs = None

    def _joins_quantized(self, joining: list[DecodeSequence]) -> bool:
        """Whether the batch must be quantized once ``joining`` are in it."""
        kv = self.kv_quant
        if kv is None:
            return False
        return (
            self._quantized
            or any(len(s.tokens) - 1 >= kv.start for s in joining)
            or any(type(layer) is QuantizedKVCache for s in joining for layer in s.cache)
        )

    def _merge_joining(self) -> None:
        """Move joining sequences into the batch cache (their first token is known)."""
        if not self._joining:
            return
        self._settle()
        joining, self._joining = _join_group(self._joining)
        first_cache = joining[0].cache
        if self._joins_quantized(joining):
            self._quantize_batch()
            new = [
                self._merge_quantized([s.cache[i] for s in joining])
                for i in range(len(first_cache))
            ]
        else:
            new = [_merged([s.cache[i] for s in joining]) for i in range(len(first_cache))]
        shifts = [s.position_offset for s in joining]
        if any(shifts):
            # Batch KV caches keep one rotary offset per row, apart from the storage index:
            # shifting it places an M-RoPE sequence's next token at its true position.
            shift = mx.array(shifts)
            for layer in new:
                if isinstance(getattr(layer, "offset", None), mx.array):
                    layer.offset = layer.offset + shift
        if self.cache:
            for mine, theirs in zip(self.cache, new, strict=True):
                mine.extend(theirs)
        else:
            self.cache = new
            self._takes_back = all(type(layer) in _TAKES_BACK for layer in new)
        known = mx.array([s.next_token for s in joining])
        if self._pending is None:
            self._pending = known
        else:
            self._pending = mx.concatenate([self._pending, known])
        if self._pending_logprobs is not None:
            # joining sequences have no unreported logprobs; pad with zeros
            pad = mx.zeros((len(joining), self._pending_logprobs.shape[-1]))
            self._pending_logprobs = mx.concatenate([self._pending_logprobs, pad])
        self._rows.join([_row_of(s.sampler, s.request.sampling) for s in joining])
        for seq in joining:
            seq.cache = []  # the batch cache owns the state now
            self.slots.append(_Slot(seq, fed=len(seq.tokens) - 1))

    def _merge_quantized(self, layers: list[Any]) -> Any:
        assert self.kv_quant is not None
        if type(layers[0]) in (KVCache, QuantizedKVCache):
            return self.kv_quant.merge(layers)
        return type(layers[0]).merge(layers)  # recurrent state keeps its dtype

    def _quantize_batch(self) -> None:
        """Switch the running batch's attention layers to quantized storage."""
        if self.kv_quant is not None and not self._quantized:
            self.kv_quant.quantize_batch(self.cache)
            self._quantized = True

    def salvage(self) -> list[Salvaged] | None:
        """The batch's sequences with their own caches, when the failed step had not yet
        touched the batch cache; the token each had sampled but not reported is read
        (and returned as unreported)."""
        if self._touched:
            return None
        try:
            self._settle()
            pending: list[int] = self._pending.tolist() if self.slots else []
        except Exception:
            return None
        out = [Salvaged(seq) for seq in self._joining]
        out += [self._take_out(i, pending) for i, s in enumerate(self.slots) if not s.left]
        self._rows.keep([])
        self.slots, self._joining, self.cache = [], [], []
        self._left = 0
        return out

    def hold(self, uids: set[int]) -> list[Salvaged]:
        """Take the sequences ``uids`` out between two steps, each with its own cache and
        the token it had sampled but not reported (as :meth:`salvage` gives them back),
        ready to be added again later (waits for the step in flight)."""
        out = [Salvaged(seq) for seq in self._joining if seq.uid in uids]
        self._joining = [seq for seq in self._joining if seq.uid not in uids]
        rows = [i for i, s in enumerate(self.slots) if not s.left and s.seq.uid in uids]
        if not rows:
            return out
        self._settle()
        pending: list[int] = self._pending.tolist()
        for i in rows:
            out.append(self._take_out(i, pending))
            self.slots[i].left = True
        self._compact()
        return out

    def _take_out(self, i: int, pending: list[int]) -> Salvaged:
        """Row ``i`` as a sequence of its own: its cache extracted, and the token it had
        sampled but not reported (``pending[i]``) appended and returned as unreported."""
        slot = self.slots[i]
        seq = slot.seq
        seq.cache = [layer.extract(i) for layer in self.cache]
        if not slot.in_flight:
            return Salvaged(seq)
        tok = int(pending[i])
        seq.tokens.append(tok)
        seq.next_token = tok
        sampling = seq.request.sampling
        if sampling.logprobs and self._pending_logprobs is not None:
            top = sampling.top_logprobs
            return Salvaged(seq, [token_with_logprobs(tok, self._pending_logprobs[i], top)])
        return Salvaged(seq, [StepToken(tok)])

    def step(self) -> dict[int, list[StepToken]]:
        self._touched = True
        self._compact_if_due()
        self._merge_joining()
        if not self.slots:
            self._touched = False
            return {}
        deferred = self._deferrable_check()
        if deferred is not None:
            inputs, input_logprobs = self._pending, self._pending_logprobs
            self._launch(inputs)
            inputs = self._recheck(deferred, inputs, launched=True)
        elif self._checks_before_processors():
            # a stateful processor: the forward pass's graph is built on the raw argmax
            # first, the check read next, the processors (which wait for the previous
            # token anyway) see only the checked token
            unchecked, self._unchecked = self._unchecked, None
            assert unchecked is not None
            inputs, input_logprobs = self._pending, self._pending_logprobs
            logits = self._forward(inputs)
            checked = self._recheck(unchecked, inputs, launched=False)
            if checked is not inputs:
                inputs, logits = checked, self._forward(checked)
            self._sample(logits, inputs)
        else:
            self._settle()
            inputs, input_logprobs = self._pending, self._pending_logprobs
            self._launch(inputs)
        out = self._materialise(inputs, input_logprobs)
        self._touched = False
        return out

    def _recheck(self, deferred: tuple[Any, Any], inputs: Any, *, launched: bool) -> Any:
        """The tokens the step is to be fed after the previous step's near-tie check
        (``inputs`` unless a near tie's exact pick differs: then the batch cache takes
        the token back, and a ``launched`` step is launched again)."""
        fixed = self._checked(deferred, inputs)
        if fixed is None:
            return inputs
        for layer in self.cache:
            layer.trim(1)
        if launched:
            self.relaunched += 1
            self._launch(fixed)
        return fixed

    def _checks_before_processors(self) -> bool:
        """The last step was a fast greedy one and this step's check cannot be deferred
        only because of a stateful processor (the cache can take a token back)."""
        return self._unchecked is not None and self._draw is None and self._takes_back

    def _forward(self, inputs: Any) -> Any:
        """This step's forward pass on ``inputs`` (lazy): the last position's logits."""
        requests = [s.seq.request for s in self.slots] if self._adapted else ()
        return forward(self.model, inputs[:, None], self.cache, requests)[:, -1, :]

    def _launch(self, inputs: Any) -> None:
        """Build this step's forward pass on ``inputs`` and start computing it; the
        sampled tokens become ``_pending`` (lazy)."""
        self._sample(self._forward(inputs), inputs)

    def _sample(self, logits: Any, inputs: Any) -> None:
        """Apply the processors to this step's ``logits``, pick the tokens (``_pending``)
        and start computing them."""
        logits = self._process(logits, inputs)
        live = [s for s in self.slots if not s.left]
        wants = any(s.seq.request.sampling.logprobs for s in live)
        all_greedy = all(s.seq.sampler is greedy for s in live)
        if all_greedy and not wants and self.settle_free:
            self._pending = exact_greedy(logits)
            self._pending_logprobs = None
            mx.async_eval(self._pending)
            return
        if all_greedy and not wants and logits.dtype == mx.float32:
            self._pending = mx.argmax(logits, axis=-1)
            self._unchecked = (logits, near_ties(logits))
            self._pending_logprobs = None
            mx.async_eval(self._pending, self._unchecked[1])
            return
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True) if wants else None
        self._draw = self._rows.draw(logits, settle_free=self.settle_free)
        self._pending = self._draw.tokens
        self._pending_logprobs = logprobs
        redo = [] if self._draw.redo is None else [self._draw.redo]
        mx.async_eval(self._pending, *redo, *([logprobs] if wants else []))

    def _deferrable_check(self) -> tuple[Any, Any] | None:
        """The last fast greedy step's near-tie check, taken out to run after this step is
        launched (see the module's docstring), or None where this step must settle first:
        a cache layer that cannot take a token back, or logits processors (which may keep
        state and must not see a token twice)."""
        if self._unchecked is None or self._draw is not None:
            return None
        if not self._takes_back:
            return None
        if any(slot.stateful for slot in self.slots if not slot.left):
            return None
        deferred, self._unchecked = self._unchecked, None
        return deferred

    def _checked(self, deferred: tuple[Any, Any], fed: Any) -> Any | None:
        """The tokens the step that produced ``deferred`` should have given, where they
        differ from ``fed`` (a near tie whose exact pick is another token); else None."""
        logits, ties = deferred
        flagged = sum(ties.tolist())  # computed with its step: no new work to wait behind
        if not flagged:
            return None
        self.exact_fallbacks += flagged
        exact = mx.where(ties, exact_greedy(logits), fed)
        return None if mx.array_equal(exact, fed).item() else exact

    def _settle(self) -> None:
        """Give the rows of the last step that had a near tie mlx-lm's exact pick, and
        draw the sampled rows whose proposals were all rejected again (waits for that
        step's computation)."""
        if self._draw is not None:
            self._pending, redone = settle(self._draw)
            self._draw = None
            self.redrawn += redone
        if self._unchecked is None:
            return
        logits, ties = self._unchecked
        self._unchecked = None
        flagged = sum(ties.tolist())
        if flagged:
            self.exact_fallbacks += flagged
            self._pending = mx.where(ties, exact_greedy(logits), self._pending)

    def _process(self, logits: Any, inputs: Any) -> Any:
        """The step's logits after the rows' logits processors (only the rows that have
        some are touched; each sees its context grown incrementally, the in-flight token
        last)."""
        touched = [i for i, s in enumerate(self.slots) if s.seq.logits_processors and not s.left]
        if not touched:
            return logits
        rows = []
        for i in touched:
            slot = self.slots[i]
            seq, row = slot.seq, logits[i : i + 1]
            context = seq.context.array(seq.tokens, inputs[i : i + 1] if slot.in_flight else None)
            for proc in seq.logits_processors:
                row = proc(context, row)
            rows.append(row)
        if len(touched) == len(self.slots):
            return mx.concatenate(rows, axis=0)
        processed = mx.concatenate(rows, axis=0)
        if processed.dtype != logits.dtype:  # as a concatenation of all rows would promote
            logits = logits.astype(processed.dtype)
        logits[mx.array(touched)] = processed
        return logits

    def _materialise(self, inputs: Any, input_logprobs: Any) -> dict[int, list[StepToken]]:
        """Materialise the tokens fed this step; report those not reported before (the
        rows that asked for logprobs get them in one computation)."""
        tokens: list[int] = inputs.tolist()
        out: dict[int, list[StepToken]] = {}
        scored: list[int] = []
        for i, (slot, tok) in enumerate(zip(self.slots, tokens, strict=True)):
            slot.fed += 1
            if slot.in_flight and not slot.left:
                seq = slot.seq
                seq.tokens.append(tok)
                seq.next_token = tok
                if seq.request.sampling.logprobs and input_logprobs is not None:
                    scored.append(i)
                else:
                    out[seq.uid] = [StepToken(tok)]
            slot.in_flight = True
        if scored:
            rows = input_logprobs[mx.array(scored)] if len(scored) < len(tokens) else input_logprobs
            tops = [self.slots[i].seq.request.sampling.top_logprobs for i in scored]
            found = tokens_with_logprobs([tokens[i] for i in scored], rows, tops)
            for i, step_token in zip(scored, found, strict=True):
                out[self.slots[i].seq.uid] = [step_token]
        kv = self.kv_quant
        if kv is not None and not self._quantized and max(s.fed for s in self.slots) >= kv.start:
            self._quantize_batch()  # after the step that reached the start, as mlx-lm does
        return out


def _join_group(joining: list[DecodeSequence]) -> tuple[list[DecodeSequence], list[DecodeSequence]]:
    """The sequences that join the batch this step, and those left for the next: at most
    :data:`JOIN_BYTES` of cache (at least one sequence)."""
    total = 0
    for i, seq in enumerate(joining):
        total += sum(int(getattr(layer, "nbytes", 0)) for layer in seq.cache)
        if i and total > JOIN_BYTES:
            return joining[:i], joining[i:]
    return joining, []


def _row_of(sampler: Any, params: Any) -> tuple[Any, Any]:
    """A joining row for :class:`BatchDraws`: greedy, or the request's settings and key."""
    if sampler is greedy:
        return None, None
    if isinstance(sampler, RandomSampler):
        return params, sampler
    raise TypeError(f"the plain decoder draws with mlxcore's samplers only, not {sampler!r}")
