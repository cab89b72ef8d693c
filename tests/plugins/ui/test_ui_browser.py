"""The web page in a real headless Chromium against a real server: log in with the API key,
chat with streamed Markdown answers, stop an answer and see the server cancel it, switch
models, keep and export conversations, and watch requests on the dashboard. Model output
that holds HTML never runs or renders as HTML.

The models have random weights; a request's ``test_script`` (added to the page's own
request on its way out, by Playwright) makes the model write a given text through the
real engine and output pipeline.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxcore.testing.server import Server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

API_KEY = "ui-test-key"
"""The admin key ``ui_server`` is started with (conftest.py)."""
USER_KEY = "ui-viewer-key"
"""Its ordinary key."""
AUTH = {"Authorization": f"Bearer {API_KEY}"}

MARKDOWN = (
    "Hello **world**, here is `code` and a [safe link](https://example.org/).\n\n"
    "```python\nprint('hi')\n```\n\n- one\n- two"
)

HOSTILE = (
    "<think>thinking <img src=x onerror=\"window.__pwned='reasoning'\"></think>"
    "<script>window.__pwned='content'</script> <img src=x onerror=\"window.__pwned='img'\">"
    " [click](javascript:window.__pwned='link') "
    '<tool_call>\n{"name": "lookup", "arguments": {"q": "<img src=x '
    'onerror=\\"window.__pwned=\'tool\'\\">"}}\n</tool_call>'
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look something up",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


class Page:
    """A page on the server, logged in, with the scripted output of its next requests."""

    def __init__(self, browser: Any, server: Server) -> None:
        self.server = server
        self.context = browser.new_context(viewport={"width": 1200, "height": 860})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.script: dict[str, Any] = {}
        self.sent: list[dict[str, Any]] = []
        self.page.route("**/v1/chat/completions", self._script)

    def _script(self, route: Any) -> None:
        body = json.loads(route.request.post_data)
        self.sent.append(dict(body))
        body.update(self.script)
        route.continue_(post_data=json.dumps(body))

    def open(self, log_in: bool = True) -> Page:
        self.page.goto(f"{self.server.base_url}/")
        if log_in:
            self.page.wait_for_selector("#key-dialog[open]")
            self.page.fill("#key-input", API_KEY)
            self.page.click("#key-save")
            self.page.wait_for_selector("#model option", state="attached")
        return self

    def send(self, text: str, wait: bool = True) -> None:
        done = ".message.assistant :is(.meta, .error)"
        before = self.page.locator(done).count()
        self.page.fill("#prompt", text)
        self.page.click("#send")
        if wait:  # the answer ended: its status line, or its error
            self.page.wait_for_function(
                "([s, n]) => document.querySelectorAll(s).length > n", arg=[done, before]
            )

    def set_parameter(self, field: str, value: str) -> None:
        """Open the parameters panel (once) and set one of its fields."""
        if self.page.locator("#params[open]").count() == 0:
            self.page.click("#params summary")
        self.page.fill(field, value)

    def last_answer(self) -> Any:
        return self.page.locator(".message.assistant").last

    def close(self) -> None:
        assert not self.errors, self.errors
        self.context.close()


@pytest.fixture
def page(browser: Any, ui_server: Server) -> Any:
    opened = Page(browser, ui_server).open()
    yield opened
    opened.close()


def metrics(server: Server) -> dict[str, Any]:
    return httpx.get(f"{server.base_url}/metrics/json", headers=AUTH, timeout=10).json()


def cancelled(server: Server) -> float:
    samples = metrics(server)["metrics"].get("mlxcore_requests_total", [])
    return sum(s["value"] for s in samples if s["labels"]["finish_reason"] == "cancelled")


def test_log_in_and_stream_a_markdown_answer(page: Page, screenshots: Path) -> None:
    page.script = {"test_script": MARKDOWN}
    page.send("Say hello", wait=False)
    page.page.wait_for_selector(".message.assistant .meta")
    answer = page.last_answer()
    assert answer.locator("strong").inner_text() == "world"
    assert answer.locator("p code").inner_text() == "code"
    assert answer.locator("pre code").inner_text() == "print('hi')"
    assert answer.locator("li").all_inner_texts() == ["one", "two"]
    link = answer.locator("a")
    assert link.get_attribute("href") == "https://example.org/"
    assert "noopener" in (link.get_attribute("rel") or "")
    assert "finish: stop" in answer.locator(".meta").inner_text()
    # what the page asked for: the chosen model, streamed, the parameters panel's values
    sent = page.sent[-1]
    assert sent["model"] == "qwen" and sent["stream"] is True
    assert sent["messages"][-1] == {"role": "user", "content": "Say hello"}
    assert sent["max_tokens"] == 1024 and sent["temperature"] == 0.7

    # mid-stream: a long free-running answer, photographed while it streams
    page.script = {"test_script": MARKDOWN, "test_script_then": "free"}
    page.set_parameter("#max-tokens", "300")
    page.send("Tell me more", wait=False)
    page.page.wait_for_function(
        "() => { const a = [...document.querySelectorAll('.message.assistant')].pop();"
        " return a && !a.querySelector('.meta') && a.querySelector('li'); }"
    )
    page.page.screenshot(path=str(screenshots / "ui-chat.png"))
    page.page.wait_for_selector("#send:not([disabled])", timeout=60_000)


def test_model_output_never_becomes_html(page: Page) -> None:
    page.script = {"test_script": HOSTILE, "tools": TOOLS}
    page.send("Be hostile")
    answer = page.last_answer()
    assert page.page.evaluate("window.__pwned") is None
    assert page.page.locator("#messages script, #messages img").count() == 0
    assert answer.locator("a").count() == 0  # javascript: links stay text
    assert "<script>window.__pwned='content'</script>" in answer.locator(".content").inner_text()
    assert "[click](javascript:" in answer.locator(".content").inner_text()
    # the reasoning, collapsed, shown as text
    reasoning = answer.locator("details.reasoning")
    assert reasoning.get_attribute("open") is None
    assert "<img src=x onerror=" in reasoning.locator(".reasoning-text").text_content()
    # the tool call, its arguments as text
    call = answer.locator(".tool-call")
    assert "lookup" in call.locator(".tool-name").inner_text()
    assert "onerror" in call.locator("pre").inner_text()
    assert page.page.evaluate("window.__pwned") is None


def test_stop_cancels_the_request_on_the_server(page: Page) -> None:
    server = page.server
    before = cancelled(server)
    page.script = {"test_script": "Counting: ", "test_script_then": "free"}
    page.set_parameter("#max-tokens", "20000")
    page.send("Count forever", wait=False)
    page.page.wait_for_function(
        "() => { const a = [...document.querySelectorAll('.message.assistant')].pop();"
        " return a && a.querySelector('.content').textContent.length > 20; }"
    )
    assert server.health()["running"] == 1
    page.page.click("#stop")
    page.page.wait_for_selector(".message.assistant .meta")
    assert page.last_answer().locator(".meta").inner_text() == "stopped"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        server.health()["running"] or cancelled(server) < before + 1
    ):
        time.sleep(0.1)
    assert server.health()["running"] == 0
    assert cancelled(server) == before + 1


def test_parameters_and_images_reach_the_request(page: Page, tmp_path: Path) -> None:
    page.page.click("#params summary")
    page.page.select_option("#thinking", "off")
    page.set_parameter("#thinking-budget", "4")
    page.set_parameter("#temperature", "0")
    page.set_parameter("#system", "Be brief.")
    png = tmp_path / "dot.png"
    png.write_bytes(
        bytes.fromhex(
            "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
            "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201a5f0"
            "4fb00000000049454e44ae426082"
        )
    )
    page.page.set_input_files("#image", str(png))
    page.page.wait_for_function(
        "() => document.querySelector('#attachments').textContent.includes('1 image')"
    )
    page.script = {"test_script": "seen"}
    page.send("What is this?")
    sent = page.sent[-1]
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}
    assert sent["thinking_token_budget"] == 4 and sent["temperature"] == 0
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    text, image = sent["messages"][1]["content"]
    assert text == {"type": "text", "text": "What is this?"}
    assert image["image_url"]["url"].startswith("data:image/png;base64,")
    # a text-only model refuses images: its error is shown under the message
    answer = page.last_answer()
    assert answer.locator(".error").count() == 1
    assert answer.locator(".error").inner_text()
    assert page.page.locator(".message.user img.attached").count() == 1


def test_switch_models(page: Page) -> None:
    page.script = {"test_script": "from the other model"}
    page.page.select_option("#model", "llama")
    page.send("Who are you?")
    answer = page.last_answer()
    assert answer.locator(".role").inner_text() == "llama"
    assert answer.locator(".content").inner_text() == "from the other model"
    assert page.sent[-1]["model"] == "llama"
    assert metrics(page.server)["recent_requests"][0]["model"] == "llama"


def test_conversations_are_kept_and_exported(page: Page) -> None:
    page.page.click("#new-chat")
    page.script = {"test_script": "remembered"}
    page.send("Keep this")
    page.page.reload()
    page.page.wait_for_selector(".message.assistant")
    assert page.last_answer().locator(".content").inner_text() == "remembered"
    assert page.page.locator(".conversation[aria-current=true]").inner_text() == "Keep this"
    with page.page.expect_download() as download:
        page.page.click("#export")
    saved = json.loads(Path(download.value.path()).read_text())
    assert saved[0]["messages"][0]["content"] == "Keep this"
    assert saved[0]["messages"][1]["content"] == "remembered"


def test_keyboard_and_labels(page: Page) -> None:
    unlabelled = page.page.evaluate(
        "() => [...document.querySelectorAll('input, select, textarea')]"
        ".filter(e => !e.labels || !e.labels.length).map(e => e.id)"
    )
    assert unlabelled == []
    # Enter in the message box sends
    page.script = {"test_script": "sent with Enter"}
    page.page.focus("#prompt")
    page.page.keyboard.type("Hello")
    page.page.keyboard.press("Enter")
    page.page.wait_for_selector(".message.assistant .meta")
    assert page.last_answer().locator(".content").inner_text() == "sent with Enter"
    # the views are buttons reachable with Tab
    page.page.focus("#tab-chat")
    page.page.keyboard.press("Tab")
    assert page.page.evaluate("document.activeElement.id") == "tab-dashboard"
    page.page.keyboard.press("Enter")
    assert page.page.locator("#view-dashboard").is_visible()
    page.page.keyboard.press("Tab")
    assert page.page.evaluate("document.activeElement.id") == "tab-models"
    page.page.keyboard.press("Enter")
    assert page.page.locator("#view-models").is_visible()
    assert not page.page.locator("#view-dashboard").is_visible()


def _load(server: Server, n: int) -> None:
    """``n`` concurrent chat requests of ~200 tokens each."""

    def one(i: int) -> None:
        httpx.post(
            f"{server.v1}/chat/completions",
            headers=AUTH,
            json={
                "model": "qwen" if i % 2 else "llama",
                "messages": [{"role": "user", "content": f"load {i}"}],
                "max_tokens": 200,
                "test_script": "x",
                "test_script_then": "free",
            },
            timeout=120,
        ).raise_for_status()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_dashboard_shows_models_requests_and_acts(page: Page, screenshots: Path) -> None:
    server = page.server
    page.page.set_viewport_size({"width": 1200, "height": 1400})
    page.page.click("#tab-dashboard")
    page.page.wait_for_selector("#engine dd")
    load = threading.Thread(target=_load, args=(server, 8))
    load.start()
    page.page.wait_for_function(
        "() => [...document.querySelectorAll('#engine dd')].some(d => d.textContent === '8')"
        " || document.querySelectorAll('#recent tbody tr').length >= 4",
        timeout=60_000,
    )
    page.page.screenshot(path=str(screenshots / "ui-dashboard.png"))
    load.join()
    page.page.wait_for_function(
        "() => document.querySelector('#recent').textContent.includes('length')", timeout=30_000
    )
    routes = page.page.locator("#routes").inner_text()
    assert "POST /v1/chat/completions" in routes
    page.page.click("#tab-models")  # the models, their buttons and "Get a model"
    page.page.wait_for_selector("#models tbody tr td")
    rows = page.page.locator("#models tbody tr").all_inner_texts()
    assert any(r.startswith("qwen") and "loaded" in r for r in rows)
    assert any(r.startswith("llama") for r in rows)

    # unload and pin through the dashboard's buttons (the API key is sent with them)
    page.page.click("button[aria-label='Unload llama']")
    page.page.wait_for_function(
        "() => [...document.querySelectorAll('#models tbody tr')]"
        ".some(r => r.textContent.startsWith('llama') && r.textContent.includes('not loaded'))"
    )
    page.page.click("button[aria-label='Pin qwen']")
    page.page.wait_for_selector("button[aria-label='Unpin qwen']")
    state = httpx.get(f"{server.v1}/models/qwen", headers=AUTH, timeout=10).json()
    assert state["pinned"] is True
    page.page.click("button[aria-label='Unpin qwen']")
    page.page.wait_for_selector("button[aria-label='Pin qwen']")
    assert httpx.get(f"{server.v1}/models/qwen", headers=AUTH, timeout=10).json()["pinned"] is False


def test_dashboard_plots_the_last_minutes_under_load(page: Page, screenshots: Path) -> None:
    """The charts draw /metrics/history: a new point each second, lines that rise with
    the load, and a server-side window that stays bounded."""
    server = page.server
    page.page.set_viewport_size({"width": 1200, "height": 1400})
    page.page.click("#tab-dashboard")
    page.page.wait_for_selector("#chart-tokens")
    count = "() => (document.querySelector('#chart-requests polyline')?.getAttribute('points')"
    count += " || '').split(' ').filter(Boolean).length"
    first = page.page.evaluate(count)
    load = threading.Thread(target=_load, args=(server, 8))
    load.start()
    page.page.wait_for_function(
        "() => [...document.querySelectorAll('#chart-tokens polyline')].some(l =>"
        " l.getAttribute('points').split(' ').some(p => Number(p.split(',')[1]) < 80))",
        timeout=60_000,
    )  # a point above the zero line (y = 92): tokens flowed
    page.page.screenshot(path=str(screenshots / "ui-dashboard-charts.png"))
    load.join()
    time.sleep(2.5)
    assert page.page.evaluate(count) >= first + 2  # points keep coming, one a second
    for chart in ("tokens", "latency", "requests", "memory", "hits"):
        assert page.page.locator(f"#chart-{chart}").count() == 1
    assert page.page.locator("#chart-latency polyline[data-series='ttft_p95']").count() >= 1
    assert page.page.locator("#chart-memory polyline[data-series='memory_active_bytes']").count()
    history = httpx.get(f"{server.base_url}/metrics/history", headers=AUTH, timeout=10).json()
    assert history["window_seconds"] == 900 and len(history["points"]) <= 900
    assert max(p["tokens_per_second"] for p in history["points"]) > 0
    recent = httpx.get(f"{server.base_url}/metrics/history?seconds=3", headers=AUTH, timeout=10)
    assert 1 <= len(recent.json()["points"]) <= 4


def test_get_a_model_with_progress_then_remove_it(
    page: Page, ui_hub: Any, screenshots: Path
) -> None:
    """The models view's "Get a model": the pull's progress shows, the model joins the
    table (served: it answers), and its Remove button deletes it again."""
    (pulled,) = ui_hub.repos

    page.page.click("#tab-models")
    page.page.wait_for_selector("#models tbody tr td")
    page.page.fill("#pull-repo", pulled)
    page.page.click("#pull-button")
    page.page.wait_for_function(
        "() => document.querySelector('#pull-status').textContent.includes('pulled and served')",
        timeout=60_000,
    )
    assert page.page.locator("#pull-progress").get_attribute("hidden") is None
    assert page.page.evaluate("() => document.querySelector('#pull-progress').value") == 1
    page.page.wait_for_selector(f"button[aria-label='Remove {pulled}']")
    page.page.screenshot(path=str(screenshots / "ui-models.png"))
    answer = httpx.post(f"{page.server.v1}/chat/completions", headers=AUTH, timeout=60, json={
        "model": pulled, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
    })  # fmt: skip
    assert answer.status_code == 200
    page.page.click(f"button[aria-label='Unload {pulled}']")
    page.page.click(f"button[aria-label='Remove {pulled}']")
    page.page.wait_for_function(
        "() => document.querySelector('#pull-status').textContent.endsWith('removed')",
        timeout=30_000,
    )
    page.page.wait_for_function(
        f"() => !document.querySelector('#models').textContent.includes('{pulled}')"
    )
    page.page.fill("#pull-repo", "tester/not-on-the-hub")
    page.page.click("#pull-button")
    page.page.wait_for_function(
        "() => document.querySelector('#pull-status').textContent.includes('not-on-the-hub:')"
    )


def test_an_ordinary_key_sees_no_admin_controls(browser: Any, ui_server: Server) -> None:
    """Loading, pinning and pulling are an admin key's: an ordinary key's page shows the
    models without their buttons and without "Get a model" (the routes answer it 403)."""
    page = Page(browser, ui_server).open(log_in=False)
    page.page.wait_for_selector("#key-dialog[open]")
    page.page.fill("#key-input", USER_KEY)
    page.page.click("#key-save")
    page.page.wait_for_selector("#model option", state="attached")
    page.page.click("#tab-models")
    page.page.wait_for_selector("#models tbody tr td")
    rows = page.page.locator("#models tbody tr").all_inner_texts()
    assert any(r.startswith("qwen") for r in rows)
    assert page.page.locator("#models button").count() == 0
    assert page.page.locator("#pull-form").is_hidden()
    refused = httpx.post(
        f"{ui_server.v1}/models/qwen/pin", headers={"Authorization": f"Bearer {USER_KEY}"}
    )
    assert refused.status_code == 403
    page.close()


def test_wrong_key_asks_again(browser: Any, ui_server: Server) -> None:
    page = Page(browser, ui_server).open(log_in=False)
    page.page.wait_for_selector("#key-dialog[open]")
    page.page.fill("#key-input", "wrong")
    page.page.click("#key-save")
    page.page.wait_for_selector("#key-dialog[open]")
    assert page.page.locator("#model option").count() == 0
    page.page.fill("#key-input", API_KEY)
    page.page.click("#key-save")
    page.page.wait_for_selector("#model option", state="attached")
    assert page.page.locator("#model option").count() == 2
    page.close()
