"""What one timed generation produced, and medians over repeats.

Both sides of the comparison (mlx-lm in-process and mlxcore over HTTP) are reduced to the
same :class:`StreamRun`, timed the same way:

* TTFT: from sending the request (or calling ``stream_generate``) to the first generated
  output;
* decode tok/s: ``(completion_tokens - 1) / (t_last - t_first)``, the rate after the first
  token, where ``t_last`` is when the final token (or the finish) arrived.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import attrs


@attrs.define
class StreamRun:
    """One timed generation.

    Attributes:
        prompt_tokens: tokens of the prompt.
        completion_tokens: tokens generated (the stop token included when one ended it).
        ttft_s: seconds from the request to the first generated output.
        decode_s: seconds from the first to the last generated token.
        total_s: seconds from the request to the end of the response.
        cached_tokens: prompt tokens served from the prefix cache (HTTP only).
        finish_reason: ``"length"``, ``"stop"``...
        usage_extra: the usage fields beyond OpenAI's (plugins' extensions, HTTP only).
        chunk_times: arrival times (``time.perf_counter()``) of the chunks that carried
            output (HTTP only; the gaps between them are the inter-token latencies).
    """

    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    decode_s: float
    total_s: float
    cached_tokens: int = 0
    finish_reason: str | None = None
    usage_extra: dict[str, Any] = attrs.field(factory=dict)
    chunk_times: list[float] = attrs.field(factory=list, repr=False)

    @property
    def decode_tok_s(self) -> float:
        """Tokens per second after the first one (0.0 when it cannot be measured)."""
        if self.completion_tokens < 2 or self.decode_s <= 0:
            return 0.0
        return (self.completion_tokens - 1) / self.decode_s

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the JSON report."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "ttft_s": round(self.ttft_s, 6),
            "decode_s": round(self.decode_s, 6),
            "total_s": round(self.total_s, 6),
            "decode_tok_s": round(self.decode_tok_s, 3),
            "finish_reason": self.finish_reason,
            **({"usage_extra": self.usage_extra} if self.usage_extra else {}),
        }


def median_of(values: Sequence[float]) -> float:
    """The median (0.0 for no values)."""
    return float(statistics.median(values)) if values else 0.0


def summarize(runs: Sequence[StreamRun]) -> dict[str, Any]:
    """Medians of decode tok/s, TTFT and token counts over ``runs``, plus every run."""

    def med(get: Callable[[StreamRun], float]) -> float:
        return median_of([get(r) for r in runs])

    return {
        "decode_tok_s": round(med(lambda r: r.decode_tok_s), 3),
        "ttft_s": round(med(lambda r: r.ttft_s), 6),
        "prompt_tokens": int(med(lambda r: r.prompt_tokens)),
        "completion_tokens": int(med(lambda r: r.completion_tokens)),
        "repeats": len(runs),
        "runs": [r.to_json() for r in runs],
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linearly interpolated (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (pos - low))


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator
