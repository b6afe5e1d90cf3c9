"""Structured output: the answer is JSON that follows a schema (`response_format` json_schema,
strict). With thinking on the model reasons first, then writes the constrained JSON.

    BASE_URL=http://127.0.0.1:8000/v1 python json_schema.py ["Is Paris the capital of France?"]

Env: BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server has one), THINKING (false: off).
"""

from __future__ import annotations

import json
import os
import sys

from openai import OpenAI, OpenAIError

BASE_URL = os.environ.get("BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("MODEL", "minicpm-v-4.6-thinking")
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "1024"))
THINKING = os.environ.get("THINKING", "true").lower() != "false"

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no", "unsure"]},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}


def reasoning_of(message) -> str | None:
    return getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None)


def main() -> int:
    question = sys.argv[1] if len(sys.argv) > 1 else "Is Paris the capital of France?"
    client = OpenAI(base_url=BASE_URL, api_key=os.environ.get("VLLM_API_KEY") or "EMPTY")
    try:
        response = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}},
            max_tokens=MAX_TOKENS,
            extra_body={"chat_template_kwargs": {"enable_thinking": THINKING}},
        )
    except OpenAIError as exc:
        print(f"request failed: {exc}", file=sys.stderr)
        return 1
    choice = response.choices[0]
    print("reasoning:", reasoning_of(choice.message))
    print("finish_reason:", choice.finish_reason)
    if choice.finish_reason == "length":  # cut before the JSON closed: raise MAX_TOKENS
        print("answer (cut):", choice.message.content)
        return 1
    verdict = json.loads(choice.message.content)
    print("json:", json.dumps(verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
