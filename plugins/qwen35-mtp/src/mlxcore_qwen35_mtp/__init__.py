"""mlxcore plugin `qwen35-mtp`: Qwen3.5 / Qwen3-Next multi-token-prediction speculative decoding.

This distribution is a skeleton: it installs, is discovered (`mlxcore plugins`)
and can be named with `--plugin qwen35-mtp`, but the feature is not built yet, so
enabling it stops start-up with a message saying so rather than serving
without the feature.
"""

from __future__ import annotations

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.errors import UsageError

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with `--plugin qwen35-mtp`."""

FEATURE = "Qwen3.5 / Qwen3-Next multi-token-prediction speculative decoding"


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Refuse to start: the feature this plugin will provide does not exist yet."""
    raise UsageError(
        f"plugin 'qwen35-mtp' is installed but not built yet: {FEATURE} is not implemented "
        "in this version; remove --plugin qwen35-mtp"
    )
