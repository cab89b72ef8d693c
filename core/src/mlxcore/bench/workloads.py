"""The prompts of the bench: long-writing requests and a long, unique shared prefix.

There is no "ignore EOS" in the API, so decode measurements ask for long, open-ended
writing that a chat model keeps going with; the reports always carry the token counts
actually generated. The prefix-cache measurement needs a system prompt of a chosen length
that nothing served before shares: it starts with a random seed word, and its sentences are
drawn at random from a small vocabulary, so every cold prefix is new text.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

Message = dict[str, str]

#: One topic per concurrent stream (the concurrency levels above 16 reuse them).
TOPICS = (
    "a lighthouse keeper who finds a map inside a bottle",
    "the first city built on the Moon",
    "a chef who can taste memories",
    "two rival clockmakers in eighteenth-century Geneva",
    "a river that flows uphill once a year",
    "a library whose books rewrite themselves at night",
    "an expedition to the deepest cave on Earth",
    "a robot gardener on a generation ship",
    "a village where it has snowed for a hundred years",
    "a musician who hears colours",
    "the last train across a frozen continent",
    "a detective who solves crimes through dreams",
    "a desert caravan guided by the stars",
    "an island that appears only at low tide",
    "a painter whose portraits come to life",
    "a school for young cartographers of imaginary lands",
)

_ADJECTIVES = (
    "amber", "brisk", "copper", "distant", "eager", "faint", "gentle", "hollow", "idle",
    "jagged", "keen", "lunar", "mellow", "narrow", "opal", "patient", "quiet", "rustic",
    "silver", "tidal", "urban", "vivid", "woolen", "young", "zealous",
)  # fmt: skip
_NOUNS = (
    "archive", "bridge", "canal", "depot", "engine", "furnace", "garden", "harbour",
    "inlet", "junction", "kiln", "ledger", "market", "notary", "orchard", "pier",
    "quarry", "reservoir", "signal", "tannery", "umbrella", "valve", "warehouse", "yard",
)  # fmt: skip
_VERBS = (
    "records", "inspects", "repairs", "measures", "catalogues", "guards", "supplies",
    "reports on", "maintains", "audits", "schedules", "documents",
)  # fmt: skip


def writing_messages(index: int) -> list[Message]:
    """A chat asking for long, open-ended writing; ``index`` picks the topic."""
    topic = TOPICS[index % len(TOPICS)]
    return [
        {
            "role": "user",
            "content": (
                f"Write a very long, detailed story about {topic}. Describe every character, "
                "place and event at length, with plenty of dialogue. Use at least 2,000 words "
                "and do not stop early."
            ),
        }
    ]


def python_file(functions: int, name: str = "compute") -> str:
    """A plain Python module of ``functions`` small functions (~33 tokens each)."""
    return "".join(
        f"def {name}_{i}(values):\n    total = 0\n    for v in values:\n"
        f"        total += v * {i + 1}\n    return total\n\n"
        for i in range(functions)
    )


#: Functions in the edit workload's file: about 2,000 tokens with SmolLM2's tokenizer.
EDIT_FILE_FUNCTIONS = 60
_EDIT_NAMES = ("compute", "scale", "weigh", "tally")


def edit_messages(index: int) -> list[Message]:
    """A chat holding a ~2,000-token Python file and asking for it back with one change.

    The workload speculation from the context (prompt lookup) is for: most of the answer
    is a copy of the prompt. ``index`` picks the functions' names, so concurrent requests
    do not share a prompt.
    """
    name = _EDIT_NAMES[index % len(_EDIT_NAMES)]
    return [
        {
            "role": "user",
            "content": "Here is a Python file:\n\n```python\n"
            + python_file(EDIT_FILE_FUNCTIONS, name)
            + f"```\n\nReturn the whole file unchanged except that {name}_3 should multiply "
            "by 100. Output only the code.",
        }
    ]


def token_counter(model_path: Any) -> Callable[[str], int]:
    """Counts a text's tokens with the tokenizer of the model folder ``model_path``."""
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(model_path)

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count_tokens


def seed_word(rng: random.Random) -> str:
    """A random made-up word (e.g. ``"kovadrel"``) that makes a prefix unique."""
    syllables = ("ka", "lo", "mi", "dre", "vo", "zan", "qui", "tor", "bel", "sha", "nu", "rix")
    return "".join(rng.choice(syllables) for _ in range(4))


def _sentence(rng: random.Random, word: str, number: int) -> str:
    adj, noun, verb = rng.choice(_ADJECTIVES), rng.choice(_NOUNS), rng.choice(_VERBS)
    other = rng.choice(_NOUNS)
    return (
        f"Note {number} of the {word} register: the {adj} {noun} {verb} the {other} "
        f"every {rng.randint(2, 97)} days, under code {rng.randint(1000, 9999)}."
    )


def long_prefix(
    count_tokens: Callable[[str], int], target_tokens: int, rng: random.Random
) -> tuple[str, str]:
    """A system prompt of about ``target_tokens`` tokens that begins with a fresh seed word.

    Args:
        count_tokens: counts the tokens of a text with the model's tokenizer.
        target_tokens: the length wanted.
        rng: the random source (one prefix per call; a new seed word each time).

    Returns:
        ``(text, seed_word)``.
    """
    word = seed_word(rng)
    head = (
        f"Session {word}. You are the archivist of the {word} register. The register below is "
        "your only source; answer questions about it briefly.\n\n"
    )
    sentences: list[str] = []
    total = count_tokens(head)
    while total < target_tokens:
        sentence = _sentence(rng, word, len(sentences) + 1)
        sentences.append(sentence)
        total += count_tokens(" " + sentence)
    return head + " ".join(sentences), word


def prefix_messages(prefix: str, question: str) -> list[Message]:
    """The long system prompt followed by one user question."""
    return [{"role": "system", "content": prefix}, {"role": "user", "content": question}]


#: The final user messages of the cold request and of the follow-up.
COLD_QUESTION = "Summarize the register above in one sentence."
FOLLOWUP_QUESTION = "Which note of the register above mentions a harbour? Answer with its number."


def chat_body(
    model: str, messages: list[Message], max_tokens: int, *, stream: bool = True
) -> dict[str, Any]:
    """A greedy, streamed chat-completion request body with usage in the last chunk."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body
