#!/usr/bin/env python3
"""Check a downloaded checkpoint directory before serving it.

    scripts/verify_model_dir.py MODEL_DIR [--json]

The completeness checks are the launcher's own (`minicpmv_ascend.settings.checkpoint_problems`:
config, tokenizer and processor files, every weight shard named in the index, safetensors headers
against file sizes), so this script and a starting server judge a directory the same way. On top,
it says whether config.json describes MiniCPM-V 4.6, and prints what was found.

Exit status: 0 complete, 1 incomplete or damaged (one line per problem on stderr), 2 usage error or
this project's Python dependencies missing (run it with the project's Python: `.venv/bin/python`,
or inside the image: `python3 /opt/minicpmv-ascend/scripts/verify_model_dir.py /models/...`).

For every other start-up check (settings against this checkpoint, vLLM's argument parser), run the
entrypoint's dry run: `MODEL_PATH=MODEL_DIR python entrypoint.py --dry-run`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

EXPECTED_ARCHITECTURE = "MiniCPMV4_6ForConditionalGeneration"
EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE = 0, 1, 2


def _import_settings():
    try:
        from minicpmv_ascend import settings
    except ImportError:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))
        from minicpmv_ascend import settings
    return settings


def describe(model_dir: pathlib.Path) -> dict:
    """Facts about the directory that an operator wants to see (no validation)."""
    weights = sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin"))
    facts: dict = {
        "weight_files": len(weights),
        "weight_bytes": sum(w.stat().st_size for w in weights),
    }
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return facts
    if isinstance(config, dict):
        text = config.get("text_config") or {}
        facts |= {
            "architectures": config.get("architectures"),
            "model_type": config.get("model_type"),
            "dtype": config.get("torch_dtype") or config.get("dtype") or text.get("dtype"),
            "max_position_embeddings": text.get("max_position_embeddings"),
        }
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=pathlib.Path, help="checkpoint directory (with config.json)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)

    try:
        settings = _import_settings()
    except ImportError as err:
        print(f"verify_model_dir: cannot import this project's settings ({err}); run it with the "
              "project's Python (.venv/bin/python) or inside the image", file=sys.stderr)
        return EXIT_USAGE
    model_dir: pathlib.Path = args.model_dir
    if not model_dir.is_dir():
        print(f"verify_model_dir: {model_dir} is not a directory", file=sys.stderr)
        return EXIT_USAGE

    problems = settings.checkpoint_problems(model_dir)
    facts = describe(model_dir)
    warnings = []
    architectures = facts.get("architectures") or []
    if not problems and EXPECTED_ARCHITECTURE not in architectures:
        warnings.append(f"config.json names {architectures or 'no architecture'}, not "
                        f"{EXPECTED_ARCHITECTURE}: this is not a MiniCPM-V 4.6 checkpoint")

    if args.json:
        print(json.dumps({"model_dir": str(model_dir), "complete": not problems, "problems": problems,
                          "warnings": warnings, **facts}))
    else:
        for problem in problems:
            print(f"verify_model_dir: {model_dir}: {problem}", file=sys.stderr)
        for warning in warnings:
            print(f"verify_model_dir: warning: {warning}", file=sys.stderr)
        if not problems:
            size_gib = facts["weight_bytes"] / 2**30
            print(f"{model_dir}: complete ({facts['weight_files']} weight file(s), {size_gib:.2f} GiB; "
                  f"architectures {architectures}, dtype {facts.get('dtype')})")
    return EXIT_INCOMPLETE if problems else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
