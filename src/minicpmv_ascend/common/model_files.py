"""Is a checkpoint directory complete? The judgement the server's start-up check (settings) and
scripts/verify_model_dir.py (the host's and the init container's check) share.

Config, tokenizer and processor files, every weight shard named in an index, and each safetensors
file's header against its size (a truncated download is the usual broken checkpoint). config.json
is read as JSON only: importing transformers would take seconds.

Standard library only, Python 3.7 or newer (see minicpmv_ascend.common).
"""

from __future__ import annotations

import json
import pathlib

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def safetensors_problem(path: pathlib.Path) -> str | None:
    """A truncated download is the usual broken checkpoint: compare the header with the size."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if size < 8 or header_len > size - 8:
                return f"{path.name} is truncated ({size} bytes)"
            header = json.loads(f.read(header_len))
    except (OSError, ValueError) as err:
        return f"{path.name} is not a readable safetensors file ({err})"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if size < 8 + header_len + end:
        return f"{path.name} is truncated ({size} bytes, its header promises {8 + header_len + end})"
    return None


def checkpoint_problems(model_dir: pathlib.Path) -> list[str]:
    """What is missing or broken in a checkpoint directory (empty list: complete)."""
    problems = []
    if not (model_dir / "config.json").is_file():
        problems.append("config.json is missing")
    if not (model_dir / "tokenizer_config.json").is_file() or not any(
        (model_dir / f).is_file() for f in TOKENIZER_FILES
    ):
        problems.append(f"tokenizer files are missing (tokenizer_config.json and one of {', '.join(TOKENIZER_FILES)})")
    if not any((model_dir / f).is_file() for f in PROCESSOR_FILES):
        problems.append(f"the processor config is missing ({' or '.join(PROCESSOR_FILES)})")
    indexes = sorted(model_dir.glob("*.safetensors.index.json")) + sorted(model_dir.glob("*.bin.index.json"))
    shards: set[str] = set()
    for index in indexes:
        try:
            shards |= set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as err:
            problems.append(f"{index.name} is unreadable ({err})")
    missing = sorted(s for s in shards if not (model_dir / s).is_file())
    if missing:
        problems.append(f"weight shards named in the index are missing: {', '.join(missing)}")
    weights = sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin"))
    if not weights and not indexes:
        problems.append("no weight files (*.safetensors or *.bin)")
    for weight in weights:
        problem = safetensors_problem(weight) if weight.suffix == ".safetensors" else None
        if problem:
            problems.append(problem)
    return problems
