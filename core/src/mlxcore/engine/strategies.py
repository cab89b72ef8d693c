"""The strategy interfaces the engine composes: cache, prefill and decoder.

Plugins return instances of these from the ``mlxcore_cache_strategy``,
``mlxcore_prefill_strategy`` and ``mlxcore_decoder`` hooks at model load (and fresh
ones whenever the engine restarts after a fault).
The engine then calls the objects directly in its loop (no hook call per token).
The built-in defaults (LRU prefix cache, chunked prefill, plain batched decode)
implement the same interfaces, in :mod:`mlxcore.defaults`.

All three run on the engine's generation thread, the only thread that touches
MLX. A per-layer cache is a list of mlx-lm cache objects (``KVCache``,
``ArraysCache``, ``RotatingKVCache`` ...), as ``mlx_lm.models.cache.make_prompt_cache``
builds it.

Request flow through the strategies::

    lookup = cache.lookup(prompt)                 # reuse a stored prefix, or a fresh cache
    result = yield from prefill.prefill(task)     # fill the cache, one chunk per engine step
    decoder.add(sequence)                         # join the running batch
    decoder.step() ... decoder.step()             # one or more tokens per sequence per step
    cache.store(tokens, decoder.remove(uid))      # offer the finished cache for reuse
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs

from mlxcore.engine.cache_explain import CacheExplanation
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.token_context import TokenContext
from mlxcore.errors import MlxcoreError

if TYPE_CHECKING:
    from mlxcore.engine.prefix_pool import PoolSeat
    from mlxcore.engine.prefix_tree import TreeWatcher

LayerCache = list[Any]
"""One mlx-lm cache object per model layer."""

Sampler = Callable[[Any], Any]
"""Maps log-probabilities of shape (1, vocab) to a sampled token array of shape (1,)."""

LogitsProcessor = Callable[[Any, Any], Any]
"""mlx-lm's processor signature: ``(tokens_so_far, logits) -> logits``."""

_STATELESS = "mlxcore_stateless"

P = TypeVar("P", bound=LogitsProcessor)


def stateless(proc: P) -> P:
    """Mark ``proc`` as a pure function of its arguments (no state kept between calls,
    nothing waited for): a decoder may call it again for a step it launches again, so
    rows whose processors are all stateless keep the pipelined greedy check (see
    :mod:`mlxcore.defaults.decoder`). mlx-lm's penalties and logit bias are; a grammar is
    not."""
    setattr(proc, _STATELESS, True)
    return proc


def is_stateless(proc: LogitsProcessor) -> bool:
    """Whether ``proc`` was marked with :func:`stateless`."""
    return getattr(proc, _STATELESS, False) is True


@attrs.define
class CacheLookup:
    """A cache for a new sequence, and how much of its prompt it already holds.

    Attributes:
        cache: a per-layer cache the sequence owns and may mutate (never shared
            with the store).
        cached_tokens: the leading prompt tokens whose state ``cache`` holds. Always
            smaller than the prompt length, so prefill produces the next-token logits.
        explanation: why the rest of the prompt missed (see
            :mod:`mlxcore.engine.cache_explain`); None when the strategy cannot tell.
    """

    cache: LayerCache
    cached_tokens: int = 0
    explanation: CacheExplanation | None = None


@attrs.frozen
class CacheStats:
    """Counters a cache strategy reports for /metrics and logs."""

    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    entries: int = 0
    nbytes: int = 0
    capacity_bytes: int = 0
    """The most bytes the strategy keeps (0: not bounded in bytes, or unknown)."""
    lookups: Mapping[str, int] = attrs.field(factory=dict)
    """Lookups by explanation reason (:data:`~mlxcore.engine.cache_explain.REASONS`)."""
    extra: Mapping[str, float] = attrs.field(factory=dict)
    """Strategy-specific gauges (a disk tier's bytes, reads, writes ...), exposed in
    /metrics as ``mlxcore_prefix_cache_<name>``."""

    def gauges(self) -> dict[str, float]:
        """These counters as ``prefix_cache_*`` gauges for ``/metrics``."""
        return {
            "prefix_cache_hits": self.hits,
            "prefix_cache_misses": self.misses,
            "prefix_cache_reused_tokens": self.reused_tokens,
            "prefix_cache_entries": self.entries,
            "prefix_cache_bytes": self.nbytes,
            **{f"prefix_cache_lookups_{k}": v for k, v in self.lookups.items()},
            **{f"prefix_cache_{k}": v for k, v in self.extra.items()},
            "memory_prefix_cache_budget_bytes": self.capacity_bytes,
        }


class CacheStrategy(abc.ABC):
    """Prefix reuse across requests.

    The strategy decides what to keep and where reuse is safe. Caches whose state
    cannot be rewound (the recurrent state of hybrid models such as Qwen3.5's
    GatedDeltaNet layers) may only be reused at exact stored boundaries; trimmable
    KV caches may be cut back to any shared prefix.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def lookup(self, tokens: Sequence[int]) -> CacheLookup:
        """Return the best reusable cache for ``tokens`` (or a fresh one)."""

    @abc.abstractmethod
    def store(self, tokens: Sequence[int], cache: LayerCache) -> None:
        """Offer ``cache`` (holding the state of exactly ``tokens``) for later reuse.

        Ownership of ``cache`` passes to the strategy; the caller will not use it again.
        """

    def store_checkpoint(self, tokens: Sequence[int], cache: LayerCache) -> None:
        """Offer a snapshot taken while a prompt is prefilled, at one of its checkpoints
        (the end of a chat's history, where the conversation's next turn will start) or
        at one of :meth:`snapshot_points`. ``cache`` holds exactly ``tokens`` and is only
        lent: the prefill goes on filling it after this call, so copy what you keep.
        Default: :meth:`store` of a deep copy."""
        self.store(tokens, copy.deepcopy(cache))

    def snapshot_points(self, request: GenerationRequest, start: int) -> list[int]:
        """Positions of ``request``'s prompt past ``start`` (the tokens the lookup reused)
        where its prefill should stop and offer a snapshot (:meth:`store_checkpoint`),
        besides the request's own checkpoints: where later prompts are likely to leave
        this one (a hybrid model resumes only where a snapshot was kept). Called once per
        request, after :meth:`lookup`. Default: none."""
        return []

    def size_from_pool(self, seat: PoolSeat) -> bool:
        """The engine offers its seat in the process's prefix-cache pool, once, after
        building the strategy (:mod:`mlxcore.engine.prefix_pool`). A strategy sized
        ``auto`` (``--prefix-cache-size``, the default) takes the pool's capacity as its
        bound and calls ``seat.settle()`` after it grows; a wrapper (a disk tier)
        forwards the seat to the cache it wraps. Returns True when taken. Default: not
        taken (the strategy keeps its own bound)."""
        return False

    def prefetch(self, request: GenerationRequest) -> None:
        """``request`` waits in the engine's queue: start bringing its stored prefix
        closer (a disk tier reads its files on a thread of its own) so that its
        :meth:`lookup` at admission does not wait. Called once per waiting request, on
        the engine thread; must not block. Default: nothing."""

    def clear(self) -> None:
        """Drop everything stored."""

    def evict(self, nbytes: int) -> None:
        """Free at least ``nbytes`` of stored state if possible, least useful first (the
        engine calls it when live requests need the memory). Default: :meth:`clear`."""
        self.clear()

    def stats(self) -> CacheStats:
        """Current counters."""
        return CacheStats()

    def follow_evictions(self) -> None:
        """Stop evicting by this strategy's own bounds; evict only through
        :meth:`trim_entries`. A distributed rank other than 0 calls it: its entries must
        stay those of rank 0, whose decisions it follows. Default: refused."""
        raise MlxcoreError(
            f"cache strategy {self.name!r} cannot follow another rank's evictions "
            "(distributed serving needs the built-in lru strategy)"
        )

    def shared_settings(self) -> Any:
        """Decisions a distributed rank other than 0 must take from rank 0 because they
        depend on the rank's own shard (the radix cache's snapshot spacing is measured on
        the layers a rank holds); rank 0 sends them once. Default: ``None`` (nothing)."""
        return None

    def adopt_settings(self, settings: Any) -> None:
        """Take rank 0's :meth:`shared_settings`. Default: refuse anything but ``None``
        (the ranks chose different cache strategies)."""
        if settings is not None:
            raise MlxcoreError(
                f"cache strategy {self.name!r} cannot take rank 0's cache settings "
                f"{settings!r}: the ranks chose different cache strategies"
            )

    def trim_entries(self, count: int) -> None:
        """Keep the ``count`` entries that would be evicted last (fewer, if fewer are
        stored), evicting the others. The default keeps nothing when ``count`` is 0."""
        if count == 0:
            self.clear()

    def watch(self, watcher: TreeWatcher) -> bool:
        """Tell ``watcher`` of every change to the prefixes this strategy holds in memory
        from now on (and :meth:`TreeWatcher.cleared` when it closes); False when it
        cannot (the default: only the radix tree's changes are told)."""
        return False

    def close(self) -> None:
        """Release threads and files (the engine stops, or replaces the strategy after a
        fault). The default does nothing."""


@attrs.define
class PrefillTask:
    """One prompt to prefill.

    Attributes:
        request: the generation request (prompt tokens, options).
        cache: the per-layer cache to fill; it already holds ``start`` tokens.
        start: how many leading prompt tokens are already in ``cache``.
        snapshot: call ``snapshot(n)`` when ``cache`` holds exactly the first ``n``
            prompt tokens and ``n`` is one of :attr:`checkpoints`; the engine then
            stores a copy for prefix reuse. Strategies that fill the cache densely
            should stop their chunks at the checkpoints to allow it.
        extra_checkpoints: checkpoints the engine adds, also while the prefill runs (where
            another request waiting for this one shares the prompt up to; see
            :attr:`PrefillStrategy.stops_at_checkpoints`).
        step_tokens: the most tokens the next chunk should process, set by the engine
            before each step while other sequences decode (None: the strategy's own chunk
            size). Strategies that chunk should honour it.
    """

    request: GenerationRequest
    cache: LayerCache
    start: int = 0
    snapshot: Callable[[int], None] | None = None
    extra_checkpoints: list[int] = attrs.field(factory=list)
    step_tokens: int | None = None

    @property
    def checkpoints(self) -> list[int]:
        """The request's checkpoints this prefill will pass (after ``start``, before
        the last prompt token)."""
        last = len(self.request.prompt_tokens) - 1
        every = {*self.request.checkpoints, *self.extra_checkpoints}
        return sorted(c for c in every if self.start < c < last)

    @property
    def remaining(self) -> Sequence[int]:
        """The prompt tokens still to process."""
        return self.request.prompt_tokens[self.start :]


@attrs.define
class PrefillResult:
    """The outcome of a prefill.

    Attributes:
        logits: the model's logits for the token after the prompt, shape (1, vocab).
        reusable: ``False`` when the cache must never be stored as a reusable prefix
            (for example when only a subset of the prompt's positions was filled).
        usage: extension fields for the response's ``usage`` (e.g. kept tokens).
        prompt_logprobs: see the attribute.
        position_offset: how far the rotary position of the next token is from its
            index in the cache (0 for text). Multimodal RoPE (Qwen-VL's M-RoPE) gives an
            image fewer distinct positions than tokens, so decoding continues at
            ``cache length + position_offset``; a decoder without
            ``supports_position_offset`` refuses such sequences.
    """

    logits: Any
    reusable: bool = True
    usage: dict[str, Any] = attrs.field(factory=dict)
    position_offset: int = 0
    prompt_logprobs: list[StepToken] | None = None
    """For a request with ``sampling.prompt_logprobs``: the logprob of every prompt token
    after the first, in order (a strategy that cannot compute them leaves ``None`` and
    the request fails)."""


PrefillGenerator = Generator[int, None, PrefillResult]
"""A prefill in progress: yields the count of prompt tokens processed after each
chunk (the engine runs decode steps for other sequences in between) and returns
the :class:`PrefillResult`."""

T = TypeVar("T")


def run_to_completion(gen: Generator[Any, None, T]) -> T:
    """Drive a generator (e.g. a :data:`PrefillGenerator`) to its end; return its value.

    For scripts and tests that prefill outside the engine, which would otherwise
    interleave decode steps between the yields.
    """
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            result: T = stop.value
            return result


class PrefillStrategy(abc.ABC):
    """How a prompt's state gets into the cache.

    The default processes the prompt in chunks of ``--prefill-step-size`` tokens.
    A strategy may also fill the cache with a subset of positions (sparse prefill),
    as long as the cache then continues at position ``len(prompt)`` and the result
    says ``reusable=False``.
    """

    name: ClassVar[str]
    runs_in_lockstep: ClassVar[bool] = False
    """True when what the strategy does follows from the requests and the model alone (no
    clock, no measurements), so ranks of a distributed engine running it stay in step;
    ``--distributed`` refuses a strategy without it."""
    supports_adapters: ClassVar[bool] = False
    """True when every forward pass goes through :func:`mlxcore.engine.adapters.forward`
    (each row under its request's LoRA adapter); the engine refuses to start a model with
    adapters otherwise."""

    @abc.abstractmethod
    def prefill(self, task: PrefillTask) -> PrefillGenerator:
        """Run the prefill as a generator (see :data:`PrefillGenerator`)."""

    @property
    def stops_at_checkpoints(self) -> bool:
        """True when :meth:`prefill` stops at every checkpoint of ``task.checkpoints``,
        also those added while it runs, and calls ``task.snapshot`` there; the engine then
        lets a request that shares a prompt being prefilled wait for that prefill instead
        of repeating it. Default ``False``."""
        return False

    def can_batch(self, task: PrefillTask) -> bool:
        """True when :meth:`prefill_batch` may take ``task`` (optional capability).

        The engine asks only about tasks whose :meth:`prefill` generator has not
        started. The default is ``False``: every task goes through :meth:`prefill`.
        """
        return False

    def prefill_batch(self, tasks: Sequence[PrefillTask]) -> list[PrefillResult]:
        """Prefill several tasks together, in one engine step (optional capability).

        Called with two or more tasks for which :meth:`can_batch` said ``True``. Fills
        each ``task.cache`` (a strategy may replace the list) exactly as :meth:`prefill`
        would, calls ``task.snapshot`` at the checkpoints, and returns one result per
        task, in order. If it raises, the tasks' caches must be as they were: the engine
        then prefills them one by one through :meth:`prefill`.
        """
        raise NotImplementedError(f"prefill strategy {self.name!r} does not batch")

    def stats(self) -> dict[str, float]:
        """Strategy-specific counters for /metrics (e.g. applications, time saved)."""
        return {}


@attrs.frozen
class StepToken:
    """One token a decoder emitted for one sequence, with optional logprobs."""

    token: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    rank: int | None = None
    """The token's rank among the vocabulary by logprob (1: the best), when computed."""


@attrs.define(eq=False)
class DecodeSequence:
    """A prefilled sequence handed to the decoder.

    Attributes:
        uid: the engine's id for the sequence.
        request: the generation request.
        cache: per-layer cache holding the prompt (and any tokens decoded so far,
            except ``next_token``).
        tokens: every token decided so far (prompt then generated), the context
            that penalties look at; ``next_token`` is its last element. The decoder
            appends the tokens it reports.
        next_token: the latest sampled token, not yet fed to the model.
        sampler: draws the next token from log-probabilities.
        logits_processors: applied to the logits before sampling, in order.
        usage: per-request extension fields the decoder reports (e.g. a speculative
            decoder's acceptance rate); merged into the response's ``usage``.
        position_offset: rotary position of the next token minus its cache index
            (see :attr:`PrefillResult.position_offset`); 0 for text.
    """

    uid: int
    request: GenerationRequest
    cache: LayerCache
    tokens: list[int]
    next_token: int
    sampler: Sampler
    logits_processors: list[LogitsProcessor] = attrs.field(factory=list)
    usage: dict[str, Any] = attrs.field(factory=dict)
    position_offset: int = 0
    context: TokenContext = attrs.field(factory=TokenContext, init=False, repr=False, eq=False)
    """``tokens`` as an MLX array for the logits processors, converted incrementally
    (``seq.context.array(seq.tokens)``)."""

    def own_cache(self) -> SequenceCache:
        """This sequence's cache outside the decoder: every token but the next to feed."""
        return SequenceCache(self.cache, len(self.tokens) - 1)


@attrs.define
class SequenceCache:
    """A sequence's own cache as the decoder gives it back.

    Attributes:
        cache: the per-layer cache.
        length: how many leading tokens of ``seq.tokens`` the cache holds.
    """

    cache: LayerCache
    length: int


class Decoder(abc.ABC):
    """Owns the running batch and produces tokens for it, step by step.

    A plain decoder emits one token per sequence per step (a pipelined one may
    report a sequence's tokens one step after computing them, so a step can
    return nothing for a sequence that just joined). A speculative decoder
    proposes several, verifies them in one forward pass and rolls back what it
    rejects, per sequence; it must also serve sequences whose request turned
    speculation off (``request.options["speculative"] is False``).
    """

    name: ClassVar[str]
    runs_in_lockstep: ClassVar[bool] = False
    """True when the decoder's steps follow from the requests and the model alone (a
    speculative decoder's off-switch reads the clock: it does not); ``--distributed``
    refuses a decoder without it."""
    supports_position_offset: ClassVar[bool] = False
    """True when the decoder honours :attr:`DecodeSequence.position_offset` (needed
    by media requests on M-RoPE models); the engine fails such a request otherwise."""
    supports_kv_quantization: ClassVar[bool] = False
    """True when the decoder keeps attention caches quantized under ``--kv-cache-dtype``
    (see :mod:`mlxcore.engine.kv_quant`); the server refuses the flag otherwise."""
    supports_hold: ClassVar[bool] = False
    """True when :meth:`hold` takes sequences out for a while (the engine pauses
    background work with it while interactive requests run)."""
    supports_adapters: ClassVar[bool] = False
    """True when every forward pass goes through :func:`mlxcore.engine.adapters.forward`
    (each row under its request's LoRA adapter); the engine refuses to start a model with
    adapters otherwise."""

    @abc.abstractmethod
    def add(self, seq: DecodeSequence) -> None:
        """Add a prefilled sequence to the running batch (between steps)."""

    @abc.abstractmethod
    def remove(self, uid: int) -> SequenceCache | None:
        """Take a sequence out of the batch; return its own cache (and how many of
        its tokens that cache holds), or ``None`` if unavailable."""

    @abc.abstractmethod
    def step(self) -> dict[int, list[StepToken]]:
        """Advance the batch; return the newly decided tokens per uid."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """How many sequences are in the batch."""

    def salvage(self) -> list[Salvaged] | None:
        """After :meth:`step` raised: every sequence of the batch, each with its own cache
        as it was before that step, ready to join a fresh decoder (so the engine can retry
        the step without the sequence that made it fail); ``None`` when the decoder cannot
        tell what state the batch is in (the engine then fails the whole batch). The
        decoder is not used again afterwards. Default: ``None``."""
        return None

    def hold(self, uids: set[int]) -> list[Salvaged]:
        """Between steps, take the sequences ``uids`` out of the batch, each as
        :meth:`salvage` gives them (its own cache holding all of ``seq.tokens`` but the
        last, the tokens sampled but not reported yet), to be :meth:`add`-ed again later
        and continue exactly as they would have. Only when :attr:`supports_hold`."""
        raise NotImplementedError(f"the {self.name!r} decoder cannot hold sequences")

    def stats(self) -> dict[str, float]:
        """Decoder-specific counters for /metrics (e.g. acceptance rate)."""
        return {}

    def held_bytes(self) -> int:
        """Bytes the decoder keeps beyond its running sequences (a draft model's prefix
        store); the memory budget counts them with the prefix cache's. Default: 0."""
        return 0

    def release(self, nbytes: int) -> int:
        """Give back at least ``nbytes`` of :meth:`held_bytes` if it can (admission asks
        before refusing a request); returns the bytes freed. Default: nothing held."""
        return 0

    def side_cache_bytes_per_token(self) -> int:
        """Cache bytes this decoder keeps per token of a sequence beside the model's own
        (a draft model's KV); the memory budget counts them for every running sequence.
        Default: 0."""
        return 0


@attrs.define
class Salvaged:
    """A sequence taken out of a failed batch (:meth:`Decoder.salvage`).

    Attributes:
        seq: the sequence, its ``cache`` holding every token of ``seq.tokens`` but the last
            (``next_token``, to be fed next).
        unreported: tokens the decoder had sampled but not yet reported (now the end of
            ``seq.tokens``): the engine sends them to the client.
    """

    seq: DecodeSequence
    unreported: list[StepToken] = attrs.field(factory=list)
