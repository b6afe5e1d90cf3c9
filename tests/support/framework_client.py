"""LangChain's `ChatOpenAI` as an application uses it, against a running server: run with
.venv-apps' Python (requirements/apps.txt, `make apps-tools`) by tests/test_applications.py.

    .venv-apps/bin/python tests/support/framework_client.py BASE_URL MODEL

Prints one JSON object: what each use returned, already validated by the application's own
pydantic models (a value outside a tool's or a response format's schema raises here, in the
client, as it would in an application). Thinking off through `extra_body` (chat_template_kwargs);
temperature 1 over several seeds, so the random model's answers differ.
"""

from __future__ import annotations

import json
import sys
from typing import Literal

from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

OFF = {"chat_template_kwargs": {"enable_thinking": False}}
SEEDS = range(3)


class Place(BaseModel):
    """Where to look."""

    unit: Literal["m", "km"] = Field(description="unit of the distance")
    country: Literal["FR", "IT"]


class GetWeather(BaseModel):
    """Current weather of a city."""

    city: Literal["Paris", "Rome"]
    place: Place
    days: int = Field(ge=1, le=7)


class Answer(BaseModel):
    """A yes/no answer with a confidence."""

    answer: Literal["yes", "no"]
    confidence: int = Field(ge=0, le=9)


def model(base_url: str, name: str, **kwargs: object) -> ChatOpenAI:
    return ChatOpenAI(base_url=base_url, api_key="unused", model=name, timeout=300, max_retries=0,
                      extra_body=OFF, **kwargs)


def main(base_url: str, name: str) -> dict[str, object]:
    out: dict[str, object] = {}
    reply = model(base_url, name, max_tokens=12, temperature=0).invoke("Hi")
    out["invoke"] = {"type": type(reply).__name__, "content": reply.content,
                     "finish_reason": reply.response_metadata.get("finish_reason")}
    chunks = list(model(base_url, name, max_tokens=12, temperature=0).stream("Hi"))
    out["stream"] = {"chunks": len(chunks), "content": "".join(str(c.content) for c in chunks)}
    calls = []
    for choice in ("GetWeather", "any"):  # a named tool; "any" is LangChain's spelling of required
        for seed in SEEDS:
            llm = model(base_url, name, max_tokens=300, temperature=1.0, seed=seed)
            message = llm.bind_tools([GetWeather], tool_choice=choice, strict=True).invoke("Weather in Paris?")
            assert isinstance(message, AIMessage) and message.tool_calls, (choice, seed, message)
            call = message.tool_calls[0]
            calls.append({"choice": choice, "seed": seed, "name": call["name"],
                          "args": GetWeather.model_validate(call["args"]).model_dump()})
    out["bind_tools"] = calls
    answers = []
    for seed in SEEDS:
        structured = model(base_url, name, max_tokens=200, temperature=1.0, seed=seed).with_structured_output(
            Answer, method="json_schema", strict=True)
        result = structured.invoke("Is Paris in France?")
        assert isinstance(result, Answer), result
        answers.append(result.model_dump())
    out["structured"] = answers
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
