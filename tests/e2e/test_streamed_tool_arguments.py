"""Tool-call arguments stream as the model writes them, with the clients people use: the
openai SDK (chat completions and Responses), the anthropic SDK, and instructor's
``create_partial`` (in its own environment, ``.venv-instructor``: it pins older openai
and jiter versions than the main one). Three parsers: Hermes JSON and Qwen XML bodies
(the ``<tool_call>`` parser of the tiny Qwen3's template) and MiniMax ``<invoke>``
(``--tool-call-parser minimax_m2``).

The scripted test plugin makes the model write a call token by token; each client must
see several argument fragments before the call is complete, and their concatenation
must be the call's arguments."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from mlxcore.testing.server import Server, ServerFactory

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NOTE = {"title": "Groceries", "body": "Milk, eggs, bread, apples and a long list of other things"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_note",
            "description": "Write a note",
            "parameters": {
                "type": "object",
                "properties": {"title": {"type": "string"}, "body": {"type": "string"}},
                "required": ["title", "body"],
            },
        },
    }
]
SCRIPTS = {
    "hermes": '<tool_call>\n{"name": "write_note", "arguments": '
    + json.dumps(NOTE)
    + "}\n</tool_call>",
    "qwen-xml": "<tool_call>\n<function=write_note>\n"
    + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in NOTE.items())
    + "</function>\n</tool_call>",
    "minimax": '<minimax:tool_call>\n<invoke name="write_note">\n'
    + "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in NOTE.items())
    + "</invoke>\n</minimax:tool_call>",
}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def minimax_server(mlxcore_server: ServerFactory, tiny_qwen3: Path) -> Server:
    return mlxcore_server(
        tiny_qwen3, "--served-model-name", "tiny", "--tool-call-parser", "minimax_m2",
        "--plugin", "mlxcore.testing.scripted",
    )  # fmt: skip


@pytest.fixture
def server(request: pytest.FixtureRequest, scripted_server: Server) -> Server:
    if request.param == "minimax":
        return request.getfixturevalue("minimax_server")  # type: ignore[no-any-return]
    return scripted_server


FORMATS = pytest.mark.parametrize(
    ("server", "script"),
    [(name, SCRIPTS[name]) for name in SCRIPTS],
    indirect=["server"],
    ids=list(SCRIPTS),
)


@FORMATS
def test_openai_chat_stream_gets_fragments_before_the_call_completes(
    server: Server, script: str
) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "note"}], tools=TOOLS,  # type: ignore[arg-type]
        stream=True, max_tokens=200, extra_body={"test_script": script, **NO_THINKING},
    )  # fmt: skip
    fragments: list[str] = []
    heads = []
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                if call.id:
                    heads.append((call.id, call.function.name))  # type: ignore[union-attr]
                if call.function and call.function.arguments:
                    fragments.append(call.function.arguments)
            finish = choice.finish_reason or finish
    assert len(heads) == 1 and heads[0][1] == "write_note"
    assert finish == "tool_calls"
    assert len(fragments) >= 5, fragments
    assert json.loads("".join(fragments)) == NOTE


@FORMATS
def test_anthropic_stream_gets_input_json_deltas(server: Server, script: str) -> None:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    tools = [{"name": "write_note", "description": "Write a note",
              "input_schema": TOOLS[0]["function"]["parameters"]}]  # fmt: skip
    deltas: list[str] = []
    with client.messages.stream(
        model="tiny", max_tokens=200, messages=[{"role": "user", "content": "note"}],
        tools=tools, extra_body={"test_script": script},  # type: ignore[arg-type]
    ) as stream:  # fmt: skip
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                deltas.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert len(deltas) >= 5, deltas
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert block.input == NOTE and json.loads("".join(deltas)) == NOTE


@FORMATS
def test_responses_stream_gets_argument_deltas(server: Server, script: str) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    deltas: list[str] = []
    done = None
    for event in client.responses.create(
        model="tiny", input="note", tools=tools, stream=True,  # type: ignore[arg-type]
        extra_body={"test_script": script, **NO_THINKING},
    ):  # fmt: skip
        if event.type == "response.function_call_arguments.delta":
            deltas.append(event.delta)
        elif event.type == "response.function_call_arguments.done":
            done = event.arguments
    assert len(deltas) >= 5, deltas
    assert done == "".join(deltas) and json.loads(done) == NOTE


def test_instructor_create_partial_sees_partial_objects(scripted_server: Server) -> None:
    """instructor forces the tool (``tool_choice`` named): the constrained JSON streams
    too, and ``create_partial`` yields the object filling up."""
    python = ROOT / ".venv-instructor" / "bin" / "python"
    assert python.exists(), "make setup creates .venv-instructor"
    script = json.dumps(NOTE)
    program = ROOT / "clients" / "instructor" / "partial.py"
    run = subprocess.run(
        [str(python), str(program), scripted_server.v1, script],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    partials = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    assert partials[-1] == NOTE
    bodies = {p.get("body") for p in partials if p.get("body")}
    assert len(bodies) >= 3, partials  # the body seen growing before the call completed
    assert any(p.get("title") == NOTE["title"] and p.get("body") != NOTE["body"] for p in partials)


def test_the_non_streamed_answer_is_the_same_call(scripted_server: Server) -> None:
    answer = httpx.post(
        scripted_server.v1 + "/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "note"}], "tools": TOOLS,
              "test_script": SCRIPTS["hermes"], **NO_THINKING},
        timeout=60,
    ).json()  # fmt: skip
    (call,) = answer["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == NOTE
