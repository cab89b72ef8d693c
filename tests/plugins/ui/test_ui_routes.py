"""The page's routes over HTTP (no browser): where a browser is sent, the security headers,
what is open behind the API key and what is not, the JSON view of the metrics the
dashboard reads, the admin pin routes, ``--no-ui``, and the page's files themselves."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from mlxcore.testing.server import Server, ServerFactory
from mlxcore_ui.routes import CONTENT_SECURITY_POLICY, assets, page_weight

pytestmark = [pytest.mark.e2e]

API_KEY = "ui-test-key"
"""The key ``ui_server`` is started with (conftest.py)."""
AUTH = {"Authorization": f"Bearer {API_KEY}"}
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
STATIC = Path(__file__).parents[3] / "plugins/ui/src/mlxcore_ui/static"


def test_a_browser_is_sent_to_the_page_and_clients_get_json(ui_server: Server) -> None:
    sent = httpx.get(f"{ui_server.base_url}/?x=1", headers={"Accept": BROWSER_ACCEPT})
    assert sent.status_code == 302 and sent.headers["location"] == "/ui?x=1"
    for accept in ("*/*", "application/json", None):
        headers = {"Accept": accept} if accept else {}
        answer = httpx.get(f"{ui_server.base_url}/", headers=headers)
        assert answer.status_code == 200
        assert answer.json()["object"] == "server"


def test_the_page_is_open_and_locked_down(ui_server: Server) -> None:
    page = httpx.get(f"{ui_server.base_url}/ui")  # no API key: the page asks for it
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert policy == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in policy and "unsafe" not in policy
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    # every file the page names is served, with its media type and the same policy
    names = re.findall(r'(?:src|href)="/ui/([^"]+)"', page.text)
    names += [
        m for f in STATIC.glob("*.js") for m in re.findall(r'from "\./([^"]+)"', f.read_text())
    ]
    assert {"app.js", "style.css", "api.js", "chat.js", "dashboard.js", "markdown.js"} <= set(names)
    for name in set(names):
        asset = httpx.get(f"{ui_server.base_url}/ui/{name}")
        assert asset.status_code == 200, name
        kind = "text/javascript" if name.endswith(".js") else "text/css"
        assert asset.headers["content-type"].startswith(kind)
        assert asset.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    missing = httpx.get(f"{ui_server.base_url}/ui/nope.js")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    # the page's routes are not API: not in the OpenAPI document
    paths = httpx.get(f"{ui_server.base_url}/openapi.json", headers=AUTH).json()["paths"]
    assert "/ui" not in paths and "/metrics/json" in paths


def test_data_stays_behind_the_key(ui_server: Server) -> None:
    for path in ("/metrics/json", "/v1/models", "/metrics"):
        assert httpx.get(f"{ui_server.base_url}{path}").status_code == 401, path
    for path in ("/v1/models/qwen/pin", "/v1/models/qwen/unpin", "/v1/models/qwen/unload"):
        assert httpx.post(f"{ui_server.base_url}{path}").status_code == 401, path


def test_metrics_as_json_with_recent_requests(ui_server: Server) -> None:
    answer = httpx.post(
        f"{ui_server.v1}/chat/completions",
        headers=AUTH,
        json={
            "messages": [{"role": "user", "content": "metrics please"}],
            "max_tokens": 8,
            "test_script": "one two three",
        },
        timeout=60,
    ).json()
    view = httpx.get(f"{ui_server.base_url}/metrics/json", headers=AUTH).json()
    assert view["object"] == "metrics"
    text = httpx.get(f"{ui_server.base_url}/metrics", headers=AUTH).text
    # the same registry: every sample of the JSON view is in the Prometheus text
    for name, samples in view["metrics"].items():
        assert re.search(rf"^{name}(\{{| )", text, re.M), name
        for sample in samples:
            assert set(sample) == {"labels", "value"}
    assert any(
        s["labels"] == {"finish_reason": "stop"} and s["value"] >= 1
        for s in view["metrics"]["mlxcore_requests_total"]
    )
    newest = view["recent_requests"][0]
    usage = answer["usage"]
    assert newest["model"] == "qwen" and newest["finish_reason"] == "stop"
    assert newest["prompt_tokens"] == usage["prompt_tokens"]
    assert newest["completion_tokens"] == usage["completion_tokens"]
    assert 0 < newest["ttft_seconds"] <= newest["seconds"]
    assert newest["tokens_per_second"] > 0


def test_pin_and_unpin(ui_server: Server) -> None:
    pinned = httpx.post(f"{ui_server.v1}/models/llama/pin", headers=AUTH).json()
    assert pinned["id"] == "llama" and pinned["pinned"] is True
    assert httpx.get(f"{ui_server.v1}/models/llama", headers=AUTH).json()["pinned"] is True
    unpinned = httpx.post(f"{ui_server.v1}/models/llama/unpin", headers=AUTH).json()
    assert unpinned["pinned"] is False
    unknown = httpx.post(f"{ui_server.v1}/models/nope/pin", headers=AUTH)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    entry = httpx.get(f"{ui_server.v1}/models/qwen", headers=AUTH).json()
    assert entry["memory_bytes"] > 0


def test_no_ui(mlxcore_server: ServerFactory, tiny_qwen3: Path) -> None:
    server = mlxcore_server(tiny_qwen3, "--no-ui")
    assert httpx.get(f"{server.base_url}/ui").status_code == 404
    root = httpx.get(f"{server.base_url}/", headers={"Accept": BROWSER_ACCEPT})
    assert root.status_code == 200 and root.json()["object"] == "server"


def test_model_text_is_never_parsed_as_html() -> None:
    """The page's scripts never hand a string to the HTML parser or to eval: model output
    reaches the page as text nodes only (the browser test checks the effect)."""
    sinks = re.compile(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|"
        r"setTimeout\(\s*['\"`]|createContextualFragment|srcdoc"
    )
    for script in STATIC.glob("*.js"):
        found = sinks.findall(script.read_text())
        assert not found, (script.name, found)
    html = (STATIC / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "inline script in index.html"
    assert not re.search(r"\son[a-z]+=", html), "inline event handler in index.html"
    assert "http://" not in html and "https://" not in html  # nothing from elsewhere


def test_page_weight() -> None:
    """Every file ships in the wheel and the whole page stays small."""
    assert set(assets()) == {p.name for p in STATIC.iterdir() if p.is_file()}
    assert page_weight() < 64 * 1024
