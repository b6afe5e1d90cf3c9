"""Tool calling, the agent loop: the model asks for a tool, this client runs it and sends the
result back as a `tool` message, the model answers with it.

    BASE_URL=http://127.0.0.1:8000/v1 python tools.py ["What is the weather in Paris?"]

Env: BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server has one),
     TOOL_CHOICE: auto (default: the model decides), required (it must call a tool), none;
     THINKING: false turns thinking off (with thinking on, a call comes after the thinking).

A call whose `finish_reason` is "length" was cut by max_tokens: it never reaches the client with
missing arguments, but there is no call to run either; raise MAX_TOKENS.
"""

from __future__ import annotations

import json
import os
import sys

from openai import OpenAI, OpenAIError

BASE_URL = os.environ.get("BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("MODEL", "minicpm-v-4.6-thinking")
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "1024"))
TOOL_CHOICE = os.environ.get("TOOL_CHOICE", "auto")
THINKING = os.environ.get("THINKING", "true").lower() != "false"

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in one of the cities this service covers",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Beijing", "Shanghai", "Tokyo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}]


def get_weather(city: str, unit: str = "celsius") -> dict:
    """The tool this client runs (a real one would call a weather service)."""
    return {"city": city, "temperature": 21 if unit == "celsius" else 70, "unit": unit, "sky": "clear"}


def main() -> int:
    question = sys.argv[1] if len(sys.argv) > 1 else "What is the weather in Paris?"
    client = OpenAI(base_url=BASE_URL, api_key=os.environ.get("VLLM_API_KEY") or "EMPTY")
    extra = {"chat_template_kwargs": {"enable_thinking": THINKING}}
    messages: list = [{"role": "user", "content": question}]
    try:
        first = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                               tool_choice=TOOL_CHOICE, max_tokens=MAX_TOKENS, extra_body=extra)
        message = first.choices[0].message
        print("finish_reason:", first.choices[0].finish_reason)
        if not message.tool_calls:  # the model answered directly (or was cut: see finish_reason)
            print("answer:", message.content)
            return 0
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            print(f"tool_call: {call.function.name} {json.dumps(arguments)}")
            result = get_weather(**arguments)
            print(f"tool_result: {json.dumps(result)}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
        final = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="auto",
                                               max_tokens=MAX_TOKENS, extra_body=extra)
    except OpenAIError as exc:
        print(f"request failed: {exc}", file=sys.stderr)
        return 1
    print("answer:", final.choices[0].message.content)
    print("finish_reason:", final.choices[0].finish_reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
