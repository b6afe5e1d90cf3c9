"""Streaming chat: print the thinking and the answer as they are generated.

Each chunk's delta carries either `reasoning` (thinking; `reasoning_content` on older vLLM) or
`content` (the answer). With stream_options.include_usage the last chunk has no choices, only the
token usage.

    BASE_URL=http://127.0.0.1:8000/v1 python stream.py ["Your question"]

Env: BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server was started with one).
"""

from __future__ import annotations

import os
import sys

from openai import OpenAI, OpenAIError

BASE_URL = os.environ.get("BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("MODEL", "minicpm-v-4.6-thinking")
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "1024"))


def main() -> int:
    prompt = sys.argv[1] if len(sys.argv) > 1 else "Describe a sunrise in two sentences."
    client = OpenAI(base_url=BASE_URL, api_key=os.environ.get("VLLM_API_KEY") or "EMPTY")
    chunks, section, usage = 0, None, None
    try:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            chunks += 1
            usage = chunk.usage or usage
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            # `reasoning` is not in the OpenAI schema: the client keeps it as an extra attribute.
            thinking = getattr(delta, "reasoning", None) or getattr(delta, "reasoning_content",
                                                                    None)
            for name, text in (("reasoning", thinking), ("answer", delta.content)):
                if text:
                    if section != name:  # a heading each time the stream switches part
                        section = name
                        print(f"\n[{name}]", flush=True)
                    print(text, end="", flush=True)
    except OpenAIError as exc:
        print(f"\nrequest failed: {exc}", file=sys.stderr)
        return 1
    print(f"\n[done] chunks: {chunks} | usage: {usage}")
    return 0 if section else 1


if __name__ == "__main__":
    sys.exit(main())
