"""Text chat with thinking on (MiniCPM-V-4.6-Thinking's default), with the `openai` client.

With `--reasoning-parser minicpmv` on the server, the thinking comes back separately from the
answer: `message.reasoning` (vLLM >= 0.30; `reasoning_content` on older vLLM) and
`message.content`. Give a thinking model room: a small max_tokens ends inside the thinking, with
no answer yet (finish_reason "length").

    pip install openai
    BASE_URL=http://127.0.0.1:8000/v1 MODEL=minicpm-v-4.6-thinking python text.py "Your question"

Env: BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server was started with one).
"""

from __future__ import annotations

import os
import sys

from openai import OpenAI, OpenAIError

BASE_URL = os.environ.get("BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("MODEL", "minicpm-v-4.6-thinking")
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "1024"))


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
        )
    except OpenAIError as exc:
        print(f"request failed: {exc}", file=sys.stderr)
        return 1
    choice = response.choices[0]
    print("reasoning:", reasoning_of(choice.message))
    print("answer:", choice.message.content)
    print("finish_reason:", choice.finish_reason, "| usage:", response.usage)
    return 0 if (choice.message.content or reasoning_of(choice.message)) else 1


if __name__ == "__main__":
    sys.exit(main())
