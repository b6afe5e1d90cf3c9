"""Image chat with the image given by URL: the *server* downloads it, so the URL must be reachable
from the server, and the server must allow it (ALLOWED_MEDIA_DOMAINS=public: any public
address; off by default).

    IMAGE_URL=https://example.org/cat.jpg python image_url.py ["Your question"]

Env: IMAGE_URL (required), BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server has one).
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
    image_url = os.environ.get("IMAGE_URL")
    if not image_url:
        print("set IMAGE_URL to an http(s) image URL the server can reach", file=sys.stderr)
        return 2
    question = sys.argv[1] if len(sys.argv) > 1 else "What is in the picture?"
    client = OpenAI(base_url=BASE_URL, api_key=os.environ.get("VLLM_API_KEY") or "EMPTY")
    try:
        response = client.chat.completions.create(
            model=MODEL,
            messages=[{
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image_url}},
                    {"type": "text", "text": question},
                ],
            }],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
    except OpenAIError as exc:
        print(f"request failed: {exc}", file=sys.stderr)
        return 1
    message = response.choices[0].message
    print("reasoning:", reasoning_of(message))
    print("answer:", message.content)
    print("prompt_tokens:", response.usage.prompt_tokens)
    return 0 if (message.content or reasoning_of(message)) else 1


if __name__ == "__main__":
    sys.exit(main())
