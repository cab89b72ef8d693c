"""Hooks are called by pluggy's own rules: wrappers work, tracing sees every call,
answers and failures are tied to their plugin, routes are owned per (method, path)."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from litestar import Controller, Router, get, post

from mlxcore import hookimpl, hookspecs
from mlxcore.cli.main import build_parser
from mlxcore.config import ServerConfig
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.errors import OptionError, PluginError
from mlxcore.hookcalls import WRAPPER_NAME
from mlxcore.hooks import PluginHooks
from mlxcore.lifecycle import RequestRecord
from mlxcore.parsers.base import ParsedDelta, ToolParser
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.runtime import build_runtime
from mlxcore.testing.runtime import Result


class ExtraParser(ToolParser):
    name = "extra-from-wrapper"

    def feed(self, text: str) -> ParsedDelta:
        return ParsedDelta(content=text)


class Wrapping:
    """A plugin whose implementations are new-style pluggy wrappers."""

    def __init__(self) -> None:
        self.seen_errors: list[BaseException] = []

    @hookimpl(wrapper=True)
    def mlxcore_tool_parsers(self) -> Generator[None, list[Any], list[Any]]:
        offered = yield
        return [*offered, [ExtraParser]]

    @hookimpl(wrapper=True)
    def mlxcore_validate_options(self) -> Generator[None, None, None]:
        try:
            return (yield)
        except OptionError as exc:
            self.seen_errors.append(exc)
            raise


def manager(*plugins: tuple[str, object]) -> PluginHooks:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(autoload=False))
    for name, plugin in plugins:
        pm.register(plugin, name=name)
    return PluginHooks(pm)


def test_a_wrapper_implementation_works_and_its_result_is_attributed() -> None:
    wrapping = Wrapping()
    hooks = manager(("wrapping", wrapping))
    registry = hooks.tool_parsers()
    assert registry.get("extra-from-wrapper") is ExtraParser
    assert registry.plugin_of("extra-from-wrapper") == WRAPPER_NAME
    assert registry.plugin_of("hermes") == "mlxcore.builtin.parsers"


def test_a_wrapper_sees_the_typed_option_error_of_an_inner_plugin() -> None:
    class Strict:
        @hookimpl
        def mlxcore_validate_options(self, options: dict[str, Any]) -> None:
            if options.get("level", 0) > 3:
                raise OptionError("level", "must be at most 3")

    wrapping = Wrapping()
    hooks = manager(("strict", Strict()), ("wrapping", wrapping))
    hooks.validate_options({"level": 1}, ServerConfig())
    with pytest.raises(OptionError, match="level: must be at most 3"):
        hooks.validate_options({"level": 9}, ServerConfig())
    assert [str(e) for e in wrapping.seen_errors] == ["level: must be at most 3"]


def test_a_failing_wrapper_is_named() -> None:
    class Broken:
        @hookimpl(wrapper=True)
        def mlxcore_configure(self) -> Generator[None, None, None]:
            yield
            raise RuntimeError("teardown bug")

    hooks = manager(("broken", Broken()))
    with pytest.raises(PluginError, match=r"'broken' in hook mlxcore_configure.*teardown bug"):
        hooks.configure(ServerConfig())


def test_firstresult_is_on_the_spec() -> None:
    specs = {
        name: getattr(hookspecs, name).mlxcore_spec["firstresult"]
        for name in dir(hookspecs)
        if name.startswith("mlxcore_")
    }
    assert {name for name, first in specs.items() if first} == {
        "mlxcore_load_model",
        "mlxcore_chat_template",
    }


def finished_record() -> RequestRecord:
    return RequestRecord(
        request_id="r", http_request_id="h", method="POST", path="/v1/completions",
        traceparent=None, tracestate=None, model="m", received_ns=1, submitted_ns=2,
        admitted_ns=3, first_token_ns=4, finished_ns=5, finish_reason="stop",
        prompt_tokens=1, cached_tokens=0, completion_tokens=1,
    )  # fmt: skip


def test_a_failing_request_observer_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    """``mlxcore_request_finished`` runs after the request is over: an observer's error is
    logged and never raised to the service (so never to the client)."""
    pm = create_plugin_manager()
    seen: list[str] = []

    class Broken:
        @hookimpl
        def mlxcore_request_finished(self, record: RequestRecord) -> None:
            raise RuntimeError("observer bug")

    class Counting:
        @hookimpl(tryfirst=True)
        def mlxcore_request_finished(self, record: RequestRecord) -> None:
            seen.append(record.request_id)

    pm.register(Broken(), name="broken")
    pm.register(Counting(), name="counting")
    with caplog.at_level("ERROR"):
        PluginHooks(pm).request_finished(finished_record())
    assert seen == ["r"]
    assert "failed observing request r" in caplog.text


def test_trace_sees_every_hook_call(tiny_llama: Path) -> None:
    """Start-up, model load, engine strategies and a request: pluggy's tracing sees each
    hook mlxcore declares (none is called behind pluggy's back)."""
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(autoload=False))

    class Flagged:  # no built-in plugin adds flags
        @hookimpl
        def mlxcore_addoption(self, parser: Any) -> None:
            parser.add_argument("--flagged-level", type=int, default=1)

    pm.register(Flagged(), name="flagged")
    traced: list[str] = []
    pm.trace.root.setwriter(traced.append)
    undo = pm.enable_tracing()
    called: list[str] = []
    pm.add_hookcall_monitoring(lambda name, impls, kw: called.append(name), lambda *a: None)
    hooks = PluginHooks(pm)
    try:
        build_parser(hooks)  # mlxcore_addoption, mlxcore_add_commands
        config = ServerConfig(model=str(tiny_llama))
        hooks.configure(config)
        hooks.routes(config)
        runtime = build_runtime(config, hooks)  # load, patch, template, parsers
        try:
            result = Result()
            request = GenerationRequest(
                prompt_tokens=(1, 2, 3),
                max_tokens=2,
                sampling=SamplingParams(),
                request_id="traced",
            )
            hooks.validate_options({}, config)
            hooks.request_options()  # body fields the plugins read
            hooks.request_finished(finished_record())  # observers of finished requests
            hooks.server_lifespans(object())  # background work for the server's lifetime
            runtime.engine.submit(request, result.sink)  # strategies, processors
            assert result.done.wait(60)
            assert result.finish is not None and result.finish.reason in ("stop", "length")
        finally:
            runtime.engine.shutdown()
    finally:
        undo()
    declared = {
        name
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if name.startswith("mlxcore_")
    }
    assert declared <= set(called)
    text = "".join(traced)
    assert all(name in text for name in declared)


def test_two_plugins_claiming_one_route_are_refused_naming_both() -> None:
    class Messages(Controller):
        path = "/v1/extra"

        @get("/items")
        async def items(self) -> str:
            return "a"

    @post("/items")
    async def other_items() -> str:
        return "b"

    class First:
        @hookimpl
        def mlxcore_routes(self) -> list[Any]:
            return [Messages]

    class Second:
        @hookimpl
        def mlxcore_routes(self) -> list[Any]:
            return [Router(path="/v1/extra", route_handlers=[other_items])]

    @get("/v1/extra/items")
    async def clash() -> str:
        return "c"

    class Third:
        @hookimpl
        def mlxcore_routes(self) -> list[Any]:
            return [clash]

    # GET and POST on one path belong to two plugins without a clash
    table = manager(("first", First()), ("second", Second())).routes(ServerConfig())
    assert table.owner("GET", "/v1/extra/items") == "first"
    assert table.owner("POST", "/v1/extra/items") == "second"
    # a second GET on that path (through a Controller, a Router or a plain handler) is not
    with pytest.raises(PluginError) as err:
        manager(("first", First()), ("third", Third())).routes(ServerConfig())
    message = str(err.value)
    assert "GET /v1/extra/items" in message and "'first'" in message and "'third'" in message


def test_a_plugin_claiming_a_built_in_route_is_refused() -> None:
    @post("/v1/chat/completions")
    async def mine() -> str:
        return "mine"

    class Greedy:
        @hookimpl
        def mlxcore_routes(self) -> list[Any]:
            return [mine]

    with pytest.raises(PluginError, match=r"'greedy'.*POST /v1/chat/completions.*openai"):
        manager(("greedy", Greedy())).routes(ServerConfig())


def test_addoption_gives_each_plugin_its_own_group() -> None:
    class Opts:
        @hookimpl
        def mlxcore_addoption(self, parser: Any) -> None:
            parser.add_argument("--opts-level", type=int, default=2)

    hooks = manager(("opts", Opts()))
    parser = argparse.ArgumentParser()
    hooks.addoption(parser)
    titles = [g.title for g in parser._action_groups]
    assert "plugin opts" in titles
    assert parser.parse_args(["--opts-level", "5"]).opts_level == 5
