"""Suite-wide ordering: the long test modules start first.

``make test`` runs on two pytest-xdist workers with ``--dist loadfile``: each test module
runs whole on one worker, so a module's server or model fixture is set up once (with
``load``-style distribution the tests of one module were spread over both workers and
interleaved with others, and each worker started the module's server again, sometimes
several times). Modules are handed out in collection order; collected in file order, the
heaviest ones (vision, several models, the end-to-end servers) came last, and one worker
ran them alone for minutes while the other sat idle. Started first, they overlap with the
many short modules instead. The heaviest are marked ``xdist_group``; the end-to-end ones
carry the ``e2e`` mark.
"""

from __future__ import annotations

import pytest


def _weight(item: pytest.Item) -> int:
    if item.get_closest_marker("xdist_group") is not None:
        return 0
    if item.get_closest_marker("e2e") is not None or "/e2e/" in item.nodeid.replace("\\", "/"):
        return 1
    return 2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the heaviest modules' tests ahead of the rest (stable order, so each module's
    tests stay together)."""
    items.sort(key=_weight)
