"""Several images in one message (both ship in ../images/), each as a base64 data URL.

The server caps images per prompt with --limit-mm-per-prompt (OpenBMB's guide uses
'{"image":5,"video":2}').

    BASE_URL=http://127.0.0.1:8000/v1 python multi_image.py [IMAGE_FILE ...]

Env: BASE_URL, MODEL, MAX_TOKENS, THINKING (true|false), VLLM_API_KEY (if the server has one).
"""

from __future__ import annotations

import base64
import mimetypes
import os
import sys
from pathlib import Path

from openai import OpenAI, OpenAIError

BASE_URL = os.environ.get("BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("MODEL", "minicpm-v-4.6-thinking")
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "1024"))
THINKING = os.environ.get("THINKING", "true").lower() != "false"
IMAGES = Path(__file__).resolve().parent.parent / "images"


def data_url(path: Path) -> str:
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def reasoning_of(message) -> str | None:
    # Not part of the OpenAI schema: the client keeps it as an extra attribute.
    return getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None)


def main() -> int:
    default = [IMAGES / "red_square.png", IMAGES / "blue_circle.png"]
    paths = [Path(p) for p in sys.argv[1:]] or default
    client = OpenAI(base_url=BASE_URL, api_key=os.environ.get("VLLM_API_KEY") or "EMPTY")
    try:
        content = [{"type": "image_url", "image_url": {"url": data_url(p)}} for p in paths]
        content.append({"type": "text", "text": "What is different between these images?"})
        response = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": content}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"chat_template_kwargs": {"enable_thinking": THINKING}},
        )
    except (OpenAIError, OSError) as exc:
        print(f"request failed: {exc}", file=sys.stderr)
        return 1
    message = response.choices[0].message
    print("images:", len(paths))
    print("reasoning:", reasoning_of(message))
    print("answer:", message.content)
    print("prompt_tokens:", response.usage.prompt_tokens)
    return 0 if (message.content or reasoning_of(message)) else 1


if __name__ == "__main__":
    sys.exit(main())
