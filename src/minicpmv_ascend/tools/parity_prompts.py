"""The parity command's prompt set: built in and versioned, extendable by a JSONL file.

Every image is drawn here with PIL from a seed (no network, no shipped binaries), so the same
version of the set always sends the same pixels. Bump PROMPT_SET_VERSION whenever a built-in prompt,
image or option changes: reports name the version, and figures are only comparable within one.

A prompt's subset follows from its images: none -> "text", one -> "image", several -> "multi-image".
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import random
from typing import Any

from PIL import Image, ImageDraw

PROMPT_SET_VERSION = "1"
SUBSETS = ("text", "image", "multi-image")
# Per-request processor options the MiniCPM-V 4.6 processor understands (transformers and vLLM
# both take them flat in `mm_processor_kwargs`).
MM_KWARGS = {"downsample_mode": ("16x", "4x"), "max_slice_nums": int}
MAX_IMAGE_SIDE = 4096


class PromptError(ValueError):
    """A prompt definition is invalid; the message says where and how to fix it."""


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """A generated image (width, height, seed) or a file (path)."""

    width: int = 0
    height: int = 0
    seed: int = 0
    path: str = ""

    def load(self) -> Image.Image:
        if self.path:
            with Image.open(self.path) as image:
                return image.convert("RGB")
        return draw_image(self.width, self.height, self.seed)

    def describe(self) -> str:
        return self.path or f"{self.width}x{self.height} (seed {self.seed})"


@dataclasses.dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    images: tuple[ImageSpec, ...] = ()
    mm_processor_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def subset(self) -> str:
        return SUBSETS[min(len(self.images), 2)]


def draw_image(width: int, height: int, seed: int) -> Image.Image:
    """A deterministic picture: a colour gradient with random rectangles, ellipses and lines."""
    rng = random.Random(seed)
    top, bottom = [tuple(rng.randrange(256) for _ in range(3)) for _ in range(2)]
    column = Image.new("RGB", (1, height))
    column.putdata([
        tuple(round(a + (b - a) * y / max(height - 1, 1)) for a, b in zip(top, bottom)) for y in range(height)
    ])
    image = column.resize((width, height), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        colour = tuple(rng.randrange(256) for _ in range(3))
        x0, x1 = sorted(rng.randrange(width) for _ in range(2))
        y0, y1 = sorted(rng.randrange(height) for _ in range(2))
        shape = rng.choice(("rectangle", "ellipse", "line"))
        if shape == "line":
            draw.line((x0, y0, x1, y1), fill=colour, width=max(1, min(width, height) // 40))
        else:
            getattr(draw, shape)((x0, y0, x1, y1), fill=colour)
    return image


def _img(width: int, height: int, seed: int) -> ImageSpec:
    return ImageSpec(width=width, height=height, seed=seed)


DESCRIBE = "Describe the image in one sentence."
# Version 1. Sizes: square, non-square, tall, tiny, and 1084x820, where vLLM 0.23 counts the image
# placeholders wrongly (docs/design/ascend-stack.md, known problem 3); 4x and 16x modes; a per-request slice limit; multi-image.
BUILTIN_PROMPTS: tuple[Prompt, ...] = (
    Prompt("text-greeting", "Hello, how are you today?"),
    Prompt("text-fox", "Repeat after me: The quick brown fox jumps over the lazy dog."),
    Prompt("text-zh", "你好，今天天气怎么样？请用一句话回答。"),
    Prompt("text-code", "def add(a, b): return a + b  # What does this Python code do?"),
    Prompt("reasoning-arithmetic", "Please calculate 23 x 47 step by step."),
    Prompt("reasoning-sky", "Explain why the sky is blue. Think carefully before answering."),
    Prompt("image-square-448", DESCRIBE, (_img(448, 448, 1),)),
    Prompt("image-1084x820", DESCRIBE, (_img(1084, 820, 2),)),
    Prompt("image-tall-320x960", "What is in the picture?", (_img(320, 960, 3),)),
    Prompt("image-small-96x64", "What colour is the largest shape?", (_img(96, 64, 4),)),
    Prompt("image-4x-1084x820", DESCRIBE, (_img(1084, 820, 5),), {"downsample_mode": "4x"}),
    Prompt("image-16x-640x480", DESCRIBE, (_img(640, 480, 6),), {"downsample_mode": "16x"}),
    Prompt("image-slices2-1084x820", DESCRIBE, (_img(1084, 820, 7),), {"max_slice_nums": 2}),
    Prompt("multi-image-2", "What differs between the two pictures?", (_img(448, 448, 8), _img(1084, 820, 9))),
    Prompt("multi-image-2-nonsquare", "Which picture is brighter?", (_img(1084, 820, 13), _img(320, 960, 14))),
    Prompt(
        "multi-image-3-4x", "Compare the three pictures.",
        (_img(256, 256, 10), _img(640, 360, 11), _img(820, 1084, 12)), {"downsample_mode": "4x"},
    ),
)


def _check_mm_kwargs(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PromptError(f"{where}: `mm_processor_kwargs` must be a JSON object, e.g. {{\"downsample_mode\": \"4x\"}}")
    for key, item in value.items():
        allowed = MM_KWARGS.get(key)
        if allowed is None:
            raise PromptError(f"{where}: unknown mm_processor_kwargs key {key!r}; use one of {', '.join(MM_KWARGS)}")
        if allowed is int and not (isinstance(item, int) and not isinstance(item, bool) and item >= 1):
            raise PromptError(f"{where}: `{key}` must be an integer >= 1, got {item!r}")
        if isinstance(allowed, tuple) and item not in allowed:
            raise PromptError(f"{where}: `{key}` must be one of {', '.join(allowed)}, got {item!r}")
    return dict(value)


def _image_from_json(value: Any, base: pathlib.Path, where: str) -> ImageSpec:
    if isinstance(value, dict) and set(value) == {"path"} and isinstance(value["path"], str):
        path = (base / value["path"]).resolve()
        if not path.is_file():
            raise PromptError(f"{where}: image file {path} does not exist (paths are relative to the JSONL file)")
        return ImageSpec(path=str(path))
    if isinstance(value, dict) and {"width", "height"} <= set(value) <= {"width", "height", "seed"}:
        sizes = [value["width"], value["height"], value.get("seed", 0)]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in sizes) and all(
            1 <= v <= MAX_IMAGE_SIDE for v in sizes[:2]
        ):
            return _img(*sizes)
    raise PromptError(
        f"{where}: an image must be {{\"width\": W, \"height\": H, \"seed\": S}} (1 <= W, H <= {MAX_IMAGE_SIDE}; "
        f"drawn deterministically) or {{\"path\": \"picture.png\"}}, got {json.dumps(value)[:80]}"
    )


def load_jsonl(path: pathlib.Path) -> list[Prompt]:
    """Prompts from a JSONL file, one object a line:
    {"id": "my-chart", "text": "...", "images": [{"path": "chart.png"}], "mm_processor_kwargs": {...}}
    Blank lines and lines starting with # are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptError(f"--prompts {path}: cannot read the file ({exc})") from exc
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise PromptError(f"{where}: not valid JSON ({exc}); write one JSON object per line") from exc
        if not isinstance(data, dict):
            raise PromptError(f"{where}: each line must be a JSON object with `id` and `text`")
        unknown = set(data) - {"id", "text", "images", "mm_processor_kwargs"}
        if unknown:
            raise PromptError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; "
                              "allowed: id, text, images, mm_processor_kwargs")
        for key in ("id", "text"):
            if not isinstance(data.get(key), str) or not data[key].strip():
                raise PromptError(f"{where}: `{key}` must be a non-empty string")
        images = data.get("images", [])
        if not isinstance(images, list):
            raise PromptError(f"{where}: `images` must be a list")
        prompts.append(Prompt(
            id=data["id"],
            text=data["text"],
            images=tuple(_image_from_json(item, path.parent, where) for item in images),
            mm_processor_kwargs=_check_mm_kwargs(data.get("mm_processor_kwargs", {}), where),
        ))
    return prompts


def select(prompts: list[Prompt], subsets: set[str] | None, ids: set[str] | None) -> list[Prompt]:
    """The prompts to run; ids must be unique, and every requested id must exist."""
    seen: set[str] = set()
    for prompt in prompts:
        if prompt.id in seen:
            raise PromptError(f"prompt id {prompt.id!r} is defined twice; give each prompt its own id")
        seen.add(prompt.id)
    if ids:
        missing = sorted(ids - seen)
        if missing:
            raise PromptError(f"--prompt: unknown prompt id(s) {', '.join(missing)}; known: {', '.join(sorted(seen))}")
    chosen = [p for p in prompts if (not subsets or p.subset in subsets) and (not ids or p.id in ids)]
    if not chosen:
        raise PromptError("no prompt selected: check --subset / --prompt / --no-builtin")
    return chosen
