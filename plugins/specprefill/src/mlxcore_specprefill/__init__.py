"""mlxcore plugin `specprefill`: SpecPrefill attention-scored sparse prefill.

This distribution is a skeleton: it installs, is discovered (`mlxcore plugins`)
and can be named with `--plugin specprefill`, but the feature is not built yet, so
enabling it stops start-up with a message saying so rather than serving
without the feature.
"""

from __future__ import annotations

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.errors import UsageError

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with `--plugin specprefill`."""

FEATURE = "SpecPrefill attention-scored sparse prefill"


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Refuse to start: the feature this plugin will provide does not exist yet."""
    raise UsageError(
        f"plugin 'specprefill' is installed but not built yet: {FEATURE} is not implemented "
        "in this version; remove --plugin specprefill"
    )
