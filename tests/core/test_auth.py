"""Who may call what (mlxcore.server.auth) on a small Litestar app with the real hook:
no key or a wrong one is a 401, an ordinary key on an admin route a 403 in the API's own
shape, the metrics routes follow --metrics-access, an in-process request is the tenant it
names (a removed one: 401), and the key reaches the handler as the request's tenant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar, get, post
from litestar.testing import AsyncTestClient

from mlxcore.routes import ADMIN_OPTION, METRICS_OPTION
from mlxcore.server.auth import before_request
from mlxcore.server.errors import api_error_handler
from mlxcore.server.internal import INTERNAL_HEADER, new_token
from mlxcore.server.keys import KeyTable
from mlxcore.server.tenants import ON_BEHALF_HEADER, cache_scope, current_owner

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@get("/who")
async def who() -> dict[str, Any]:
    return {"owner": current_owner(), "scope": cache_scope()}


@post("/admin-thing", status_code=200, opt={ADMIN_OPTION: True})
async def admin_thing() -> dict[str, Any]:
    return {"done": True}


@get("/metrics", opt={METRICS_OPTION: True})
async def metrics() -> str:
    return "ok"


def app(tmp_path: Path, access: str = "keys") -> Litestar:
    path = tmp_path / "keys.toml"
    path.write_text(
        '[keys.alice]\nkey = "sk-alice"\ncache_group = "team"\n'
        '[keys.ops]\nkey = "sk-ops"\nrole = "admin"\n'
    )
    keys = KeyTable.from_config((), str(path))
    built = Litestar(
        [who, admin_thing, metrics],
        before_request=before_request(keys, access),
        exception_handlers={Exception: api_error_handler},
    )
    built.state.internal_token = new_token()
    built.state.api_keys = keys
    return built


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_keys_roles_and_tenants(tmp_path: Path) -> None:
    served = app(tmp_path)
    async with AsyncTestClient(served) as client:
        assert (await client.get("/who")).status_code == 401
        assert (await client.get("/who", headers=bearer("sk-wrong"))).status_code == 401
        mine = await client.get("/who", headers={"x-api-key": "sk-alice"})
        assert mine.json() == {"owner": "alice", "scope": "group:team"}
        refused = await client.post("/admin-thing", headers=bearer("sk-alice"))
        assert refused.status_code == 403
        assert refused.json()["error"]["type"] == "permission_error"
        assert refused.json()["error"]["code"] == "permission_denied"
        assert (await client.post("/admin-thing", headers=bearer("sk-ops"))).status_code == 200
        assert (await client.get("/metrics", headers=bearer("sk-alice"))).status_code == 200
        assert (await client.get("/metrics")).status_code == 401
        inside = {INTERNAL_HEADER: served.state.internal_token}
        as_alice = await client.get("/who", headers={**inside, ON_BEHALF_HEADER: "alice"})
        assert as_alice.json()["owner"] == "alice"
        assert (await client.get("/who", headers=inside)).json()["owner"] is None
        gone = await client.get("/who", headers={**inside, ON_BEHALF_HEADER: "mallory"})
        assert gone.status_code == 401
        # the on-behalf header means nothing without the in-process secret
        forged = await client.get("/who", headers={ON_BEHALF_HEADER: "ops"})
        assert forged.status_code == 401


@pytest.mark.parametrize("access", ["admin", "public"])
async def test_metrics_access(tmp_path: Path, access: str) -> None:
    async with AsyncTestClient(app(tmp_path, access)) as client:
        ordinary = await client.get("/metrics", headers=bearer("sk-alice"))
        admin = await client.get("/metrics", headers=bearer("sk-ops"))
        anonymous = await client.get("/metrics")
        if access == "admin":
            assert (ordinary.status_code, admin.status_code, anonymous.status_code) == (
                403,
                200,
                401,
            )
        else:
            assert ordinary.status_code == admin.status_code == anonymous.status_code == 200
