"""A test plugin: the plain decoder, declared unable to apply position offsets."""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.defaults.decoder import PlainDecoder


class OffsetlessDecoder(PlainDecoder):
    """Like ``plain`` but without ``supports_position_offset`` (as a speculative decoder
    that does not know about M-RoPE shifts)."""

    name = "offsetless"
    supports_position_offset = False


@hookimpl
def mlxcore_decoder(model: Any, info: Any, config: Any) -> OffsetlessDecoder:
    return OffsetlessDecoder(model)
