"""Streaming detokenizers that keep the continuation's text exact.

mlx-lm's streaming detokenizers drop a leading space from the first piece of text
they produce (``BPEStreamingDetokenizer`` always, ``SPMStreamingDetokenizer`` with
``trim_space``): right for decoding a whole text from its first token, wrong for a
continuation, where the space belongs to the answer (``" Paris"`` after ``"The
capital of France is"``). The server keeps it, as OpenAI and vLLM do, so that the
prompt text followed by the generated text is the decoding of prompt + output
tokens. Detokenizers of other kinds decode the generated tokens as they stand.
"""

from __future__ import annotations

import copy
from typing import Any

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer


class _ContinuationBPEDetokenizer(BPEStreamingDetokenizer):
    """The byte-level BPE detokenizer without the first-space trim."""

    def _maybe_trim_space(self, current_text: str) -> str:
        return current_text


def continuation_detokenizer(tokenizer: Any) -> Any:
    """A fresh streaming detokenizer for ``tokenizer`` (an mlx-lm ``TokenizerWrapper``)
    whose text keeps the first generated token's leading space."""
    detokenizer = tokenizer.detokenizer  # a reset copy of the wrapper's prototype
    if isinstance(detokenizer, SPMStreamingDetokenizer):
        detokenizer.trim_space = False
    elif type(detokenizer) is BPEStreamingDetokenizer:
        exact = copy.copy(detokenizer)
        exact.__class__ = _ContinuationBPEDetokenizer
        return exact
    return detokenizer
