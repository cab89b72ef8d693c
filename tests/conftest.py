"""Suite-wide ordering: the long test groups start first.

``make test`` runs on two pytest-xdist workers with ``--dist loadgroup``: a module marked
``xdist_group`` runs whole on one worker. Collected in file order, the heaviest groups
(vision, several models) came last, and one worker ran them alone for minutes while the
other sat idle. Started first, they overlap with the many short tests instead.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the tests of ``xdist_group`` modules ahead of the rest (stable order)."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
