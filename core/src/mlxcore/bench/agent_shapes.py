"""The requests of a coding agent's session, at its real size, for the long-session
benchmarks.

A Claude Code session (measured on 2.1.197's requests) sends a system prompt and 24
tools of about 17.5K tokens, then on every turn one tool call and its result (a file
read, a test run: ~7K tokens), with a ``<system-reminder>`` beside the last tool result;
beside each main turn a *side request* with the same system prompt and tools and a
first user message of its own (a title, a sub-agent); when the history grows too long,
a *compaction* replaces it with a summary under the same system prompt and tools.

:func:`session_requests` yields those requests in order, as OpenAI chat messages and
tools, tool-call arguments as mappings (the in-process bench takes them as they are;
:func:`openai_messages` turns them into Chat Completions messages, :func:`anthropic_body`
into a Messages API body). The content is generated, not copied from any agent: numbered
source-like lines whose token count the caller measures with the model's own tokenizer
(``count``), so the sizes hold for every tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import attrs

TokenCount = Callable[[str], int]
"""How many tokens a text is, in the served model's tokenizer."""


@attrs.frozen
class SessionShape:
    """The sizes of one agent session (defaults: Claude Code's, see the module)."""

    system_tokens: int = 3_000
    """The system prompt alone."""
    tools: int = 24
    tool_tokens: int = 600
    """Each tool's description and schema, as rendered."""
    result_tokens: int = 7_000
    """Each tool result."""
    turns: int = 14
    """Main turns (tool call + result each) after the opening request."""
    reminders: bool = True
    """A ``<system-reminder>`` text beside every tool result (kept in the history)."""
    side_requests: bool = True
    """A side request after every main turn."""
    compaction: bool = True
    """A compacted request after the last turn."""
    label: str = "session 0"
    """Makes the system prompt of one session differ from another's."""


@attrs.frozen
class AgentRequest:
    """One request of the session.

    Attributes:
        kind: ``main``, ``side`` or ``compact``.
        turn: the main turn it belongs to (0: the opening request).
        session: the session's label.
        messages: OpenAI chat messages (system first).
        tools: OpenAI function tools.
    """

    kind: str
    turn: int
    session: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


def filler(tokens: int, count: TokenCount, seed: str) -> str:
    """Source-like text of about ``tokens`` tokens (never fewer than one line), distinct
    for each ``seed``."""
    line = "    {seed}_value_{i} = compute(record_{j}, limit={k})  # step {i} of {seed}\n"

    def lines(n: int) -> str:
        return "".join(line.format(seed=seed, i=i, j=i % 97, k=i % 13) for i in range(n))

    per_line = max(1, count(lines(16)) // 16)
    n = max(1, tokens // per_line)
    text = lines(n)
    # one correction: lines differ slightly in length as their numbers grow
    measured = count(text)
    if measured and abs(measured - tokens) > per_line:
        n = max(1, int(n * tokens / measured))
        text = lines(n)
    return text


def agent_tools(shape: SessionShape, count: TokenCount) -> list[dict[str, Any]]:
    """``shape.tools`` tools, each about ``shape.tool_tokens`` tokens."""
    out = []
    for i in range(shape.tools):
        name = f"tool_{i:02d}"
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": filler(shape.tool_tokens - 60, count, name),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "path": {"type": "string", "description": "a file path"},
                            "pattern": {"type": "string", "description": "what to look for"},
                        },
                        "required": ["path"],
                    },
                },
            }
        )
    return out


def session_requests(shape: SessionShape, count: TokenCount) -> Iterator[AgentRequest]:
    """The session's requests in the order an agent sends them (see the module)."""
    tools = agent_tools(shape, count)
    system = f"You are a coding agent ({shape.label}).\n" + filler(
        shape.system_tokens, count, shape.label.replace(" ", "_")
    )
    history: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Refactor the project; start with the first module."},
    ]
    yield AgentRequest("main", 0, shape.label, list(history), tools)
    if shape.side_requests:
        yield AgentRequest("side", 0, shape.label, side_messages(system, 0), tools)
    for turn in range(1, shape.turns + 1):
        history += turn_messages(shape, turn, count)
        yield AgentRequest("main", turn, shape.label, list(history), tools)
        if shape.side_requests:
            yield AgentRequest("side", turn, shape.label, side_messages(system, turn), tools)
    if shape.compaction:
        summary = "Summary of the conversation so far:\n" + filler(
            2_000, count, f"summary_{shape.turns}"
        )
        compacted = [
            {"role": "system", "content": system},
            {"role": "user", "content": summary + "\nContinue with the next module."},
        ]
        yield AgentRequest("compact", shape.turns + 1, shape.label, compacted, tools)


def side_messages(system: str, turn: int) -> list[dict[str, Any]]:
    """A side request: the session's system prompt, then a user message of its own."""
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Write a 5-10 word title for this task (turn {turn})."},
    ]


def turn_messages(shape: SessionShape, turn: int, count: TokenCount) -> list[dict[str, Any]]:
    """What a main turn adds to the history: the assistant's tool call, its result and,
    with reminders, a user text beside it."""
    call_id = f"call_{turn}"
    call = {
        "id": call_id,
        "type": "function",
        "function": {
            "name": f"tool_{turn % shape.tools:02d}",
            "arguments": {"path": f"src/module_{turn}.py"},
        },
    }
    out: list[dict[str, Any]] = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": call_id,
            "content": filler(shape.result_tokens, count, f"module_{turn}"),
        },
    ]
    if shape.reminders:
        out.append(
            {
                "role": "user",
                "content": f"<system-reminder>Turn {turn}: keep the todo list current."
                "</system-reminder>",
            }
        )
    return out


def openai_messages(request: AgentRequest) -> list[dict[str, Any]]:
    """``request``'s messages as Chat Completions sends them: tool-call arguments as JSON
    text (chat templates take them as mappings, as the request builder passes them)."""
    out = []
    for message in request.messages:
        calls = message.get("tool_calls")
        if calls:
            calls = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.dumps(c["function"]["arguments"]),
                    },
                }
                for c in calls
            ]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def anthropic_body(request: AgentRequest, model: str, max_tokens: int) -> dict[str, Any]:
    """``request`` as a Messages API body: the system prompt apart, tool calls as
    ``tool_use`` blocks, a tool result and the user text after it as one user message."""
    system = request.messages[0]["content"]
    messages: list[dict[str, Any]] = []
    for message in request.messages[1:]:
        role = message["role"]
        if role == "assistant":
            blocks = [
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": call["function"]["name"],
                    "input": call["function"]["arguments"],
                }
                for call in message.get("tool_calls", [])
            ]
            messages.append({"role": "assistant", "content": blocks})
            continue
        if role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": message["content"],
            }
        else:
            block = {"type": "text", "text": message["content"]}
        if messages and messages[-1]["role"] == "user":
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": "user", "content": [block]})
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in request.tools
    ]
    return {
        "model": model,
        "max_tokens": max_tokens,
        "system": system,
        "messages": messages,
        "tools": tools,
    }
