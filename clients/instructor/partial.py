"""Run in .venv-instructor by tests/e2e/test_streamed_tool_arguments.py: instructor's
``create_partial`` against a server; prints each partial object as a JSON line."""

import json
import sys

import instructor
import openai
from pydantic import BaseModel


class Note(BaseModel):
    title: str
    body: str


def main() -> None:
    base_url, script = sys.argv[1], sys.argv[2]
    client = instructor.from_openai(
        openai.OpenAI(base_url=base_url, api_key="x", max_retries=0), mode=instructor.Mode.TOOLS
    )
    partials = client.chat.completions.create_partial(
        model="tiny",
        response_model=Note,
        messages=[{"role": "user", "content": "Write a note."}],
        max_tokens=200,
        extra_body={"test_script": script, "chat_template_kwargs": {"enable_thinking": False}},
    )
    for partial in partials:
        print(json.dumps(partial.model_dump()), flush=True)


if __name__ == "__main__":
    main()
