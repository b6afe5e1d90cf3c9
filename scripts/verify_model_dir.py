#!/usr/bin/env python3
"""Check a downloaded checkpoint directory before serving it.

    scripts/verify_model_dir.py MODEL_DIR [--json] [--wait SECONDS]

Runs on Python 3.7 or newer (Kylin V10 and EulerOS ship 3.7), standard library only: in a checkout
of this repository (it imports the package's src/ beside it, like healthcheck/probe.py) or where the
package is installed (the images). It judges a directory with the server's own start-up check
(`minicpmv_ascend.common.model_files.checkpoint_problems`: config, tokenizer and processor files,
every weight shard named in the index, safetensors headers against file sizes). On top, it says
which declared MiniCPM-V config.json describes, warns when the files are not readable by the
container's user (UID 1000), as happens after a download under `umask 077`, and, for a complete
MiniCPM-V 4.7, checks what the release carries (`minicpmv_ascend.common.release_shape`, the
launcher's check too): the canvas M-RoPE field, `downsample_mode`, the processor classes and the
chat template's thinking switch and tool-call format, read as text (the launcher's dry run also
renders the template and asks the image's transformers).

--wait SECONDS: check again every SECONDS until the directory is complete (a missing directory
counts as "not downloaded yet"), printing what is still missing whenever that changes; the server's
init container runs this while the download Job fills the volume.

Exit status (distinct on purpose: Python itself exits 1 on any crash, so 1 never means "incomplete"):
  0  complete (warnings, if any, on stderr)
  3  incomplete or damaged (one line per problem on stderr): download again, it resumes
  4  complete, but not servable as its model (one line per problem): the launcher refuses it too
  2  usage error (bad arguments, not a directory, an interpreter older than 3.7)
  1  an unexpected error of this script (a traceback), not a verdict on the directory

For every other start-up check (settings against this checkpoint, vLLM's argument parser), run the
entrypoint's dry run: `MODEL_PATH=MODEL_DIR python entrypoint.py --dry-run`.
"""

import argparse
import json
import os
import pathlib
import stat
import sys
import time

MIN_PYTHON = (3, 7)
EXIT_OK, EXIT_CRASH, EXIT_USAGE, EXIT_INCOMPLETE, EXIT_NOT_SERVABLE = 0, 1, 2, 3, 4
# Who reads the weights in the container (the image's user; compose and Kubernetes run it so).
CONTAINER_UID = 1000
WAIT_REPEAT_S = 300  # while waiting, repeat an unchanged status this often (a sign of life in logs)

# Checked before the package is imported (it needs 3.7): an older interpreter gets a usage error
# (exit 2), never a traceback (exit 1, which would read as a crash of this script).
if __name__ == "__main__" and sys.version_info < MIN_PYTHON:
    print("verify_model_dir: needs Python {}.{} or newer, this is {} ({})".format(
        MIN_PYTHON[0], MIN_PYTHON[1], sys.version.split()[0], sys.executable), file=sys.stderr)
    sys.exit(EXIT_USAGE)

try:
    from minicpmv_ascend.common.model_files import checkpoint_problems
    from minicpmv_ascend.common.models import MODELS, model_for_config
    from minicpmv_ascend.common.release_shape import canvas_findings, shape_findings, template_text_findings
except ImportError:  # a checkout where the package is not installed: its src/
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))
    from minicpmv_ascend.common.model_files import checkpoint_problems
    from minicpmv_ascend.common.models import MODELS, model_for_config
    from minicpmv_ascend.common.release_shape import canvas_findings, shape_findings, template_text_findings

# Every declared model's architecture (common/models.py: one declaration per model).
EXPECTED_ARCHITECTURES = tuple(m.architecture for m in MODELS.values())


def describe(model_dir):
    """Facts about the directory that an operator wants to see (no validation)."""
    weights = sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin"))
    facts = {"weight_files": len(weights), "weight_bytes": sum(w.stat().st_size for w in weights)}
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return facts
    if isinstance(config, dict):
        text = config.get("text_config") or {}
        model = model_for_config(config)
        facts.update(
            architectures=config.get("architectures"),
            model_type=config.get("model_type"),
            model=model.name if model is not None else None,
            dtype=config.get("torch_dtype") or config.get("dtype") or text.get("dtype"),
            max_position_embeddings=text.get("max_position_embeddings"),
        )
    return facts


def unreadable_for_container(model_dir, uid=CONTAINER_UID):
    """Paths the container's user cannot read: not world-readable (directories: also not
    world-searchable) and not owned by that UID. Group access is left out: the container's groups
    differ from the host's. Typical cause: files written under umask 077 by root."""
    bad = []
    for root, _dirs, files in os.walk(str(model_dir)):
        for name in [""] + files:
            path = os.path.join(root, name) if name else root
            try:
                info = os.stat(path)
            except OSError:
                continue
            need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(info.st_mode) else 0)
            if info.st_uid != uid and info.st_mode & need != need:
                bad.append(path)
    return bad


def release_shape(model_dir):
    """(errors, warnings) about what a complete checkpoint of a declared model carries."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], []
    model = model_for_config(config) if isinstance(config, dict) else None
    if model is None:
        return [], []
    errors, warnings = canvas_findings(config, model)
    more_errors, more_warnings = shape_findings(model_dir, config, model)
    return errors + more_errors, warnings + more_warnings + template_text_findings(model_dir, model)


def verdict(model_dir, must_exist):
    """(problems, facts, warnings) for the directory; problems is None when it is not one."""
    if not model_dir.is_dir():
        if must_exist or model_dir.exists():
            return None, {}, []
        return ["{} does not exist yet (nothing downloaded)".format(model_dir)], {}, []
    problems = checkpoint_problems(model_dir)
    facts = describe(model_dir)
    warnings = []
    architectures = facts.get("architectures") or []
    # vLLM picks the model class by architectures[0]: a declared model's model_type with another
    # architecture is no checkpoint of it either.
    declared = [m for m in MODELS.values() if m.name == facts.get("model")]
    if not problems and not (declared and declared[0].architecture in architectures):
        warnings.append("config.json names {} (model_type {}), none of {}: this is no MiniCPM-V checkpoint "
                        "this kit serves".format(architectures or "no architecture", facts.get("model_type"),
                                                 ", ".join(EXPECTED_ARCHITECTURES)))
    unreadable = unreadable_for_container(model_dir)
    if unreadable:
        warnings.append(
            "{} path(s) are not readable by the container's user (UID {}), e.g. {} (written under "
            "umask 077?): run `chmod -R a+rX {}` (or `chown -R {}:{} {}`)".format(
                len(unreadable), CONTAINER_UID, unreadable[0], model_dir, CONTAINER_UID,
                CONTAINER_UID, model_dir))
    return problems, facts, warnings


def wait_until_complete(model_dir, interval):
    """Re-check until complete; say what is missing whenever that changes (and every few minutes)."""
    last, last_said = None, 0.0
    while True:
        problems, _, _ = verdict(model_dir, must_exist=False)
        if problems is None:
            return None
        if not problems:
            return problems
        now = time.monotonic()
        if problems != last or now - last_said >= WAIT_REPEAT_S:
            print("verify_model_dir: waiting for a complete checkpoint in {} (checking every {:g} s): "
                  "{}".format(model_dir, interval, "; ".join(problems)), file=sys.stderr, flush=True)
            last, last_said = problems, now
        time.sleep(interval)


def positive_seconds(value):
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError("{!r} is not a number of seconds".format(value)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("{!r} must be > 0".format(value))
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=pathlib.Path, help="checkpoint directory (with config.json)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--wait", type=positive_seconds, metavar="SECONDS",
                        help="check every SECONDS until the directory is complete")
    args = parser.parse_args(argv)
    model_dir = args.model_dir

    if args.wait:
        if wait_until_complete(model_dir, args.wait) is None:
            print("verify_model_dir: {} is not a directory".format(model_dir), file=sys.stderr)
            return EXIT_USAGE
    problems, facts, warnings = verdict(model_dir, must_exist=True)
    if problems is None:
        print("verify_model_dir: {} is not a directory".format(model_dir), file=sys.stderr)
        return EXIT_USAGE
    not_servable = []
    if not problems:
        not_servable, shape_warnings = release_shape(model_dir)
        warnings += shape_warnings

    if args.json:
        report = {"model_dir": str(model_dir), "complete": not problems, "problems": problems,
                  "not_servable": not_servable, "warnings": warnings}
        report.update(facts)
        print(json.dumps(report))
    else:
        for problem in problems + not_servable:
            print("verify_model_dir: {}: {}".format(model_dir, problem), file=sys.stderr)
        for warning in warnings:
            print("verify_model_dir: warning: {}".format(warning), file=sys.stderr)
        if not problems:
            print("{}: complete ({} weight file(s), {:.2f} GiB; architectures {}, dtype {}){}".format(
                model_dir, facts["weight_files"], facts["weight_bytes"] / 2**30,
                facts.get("architectures") or [], facts.get("dtype"),
                "; NOT servable as its model" if not_servable else ""))
    if problems:
        return EXIT_INCOMPLETE
    return EXIT_NOT_SERVABLE if not_servable else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
