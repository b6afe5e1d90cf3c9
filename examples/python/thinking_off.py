"""Text chat with thinking off: the chat template closes the <think> block itself, so the model
answers directly and `message.reasoning` is empty. Pass it through `extra_body`, which the
`openai` client merges into the request as is.

    BASE_URL=http://127.0.0.1:8000/v1 python thinking_off.py "Your question"

Env: BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server was started with one).
"""

from __future__ import annotations

import os
import sys

from openai import OpenAI, OpenAIError

BASE_URL = os.environ.get("BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("MODEL", "minicpm-v-4.6-thinking")
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "256"))


def reasoning_of(message) -> str | None:
    # Not part of the OpenAI schema: the client keeps it as an extra attribute.
    return getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None)


def main() -> int:
    prompt = sys.argv[1] if len(sys.argv) > 1 else "What is 2+3? Answer with a number."
    client = OpenAI(base_url=BASE_URL, api_key=os.environ.get("VLLM_API_KEY") or "EMPTY")
    try:
        response = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
    except OpenAIError as exc:
        print(f"request failed: {exc}", file=sys.stderr)
        return 1
    message = response.choices[0].message
    print("reasoning:", reasoning_of(message))
    print("answer:", message.content)
    return 0 if message.content else 1


if __name__ == "__main__":
    sys.exit(main())
