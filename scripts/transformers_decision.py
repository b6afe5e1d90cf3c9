#!/usr/bin/env python3
"""Which transformers the Ascend image ships: the base image's own, or the table's pin.

Run by the Dockerfile in the base image's Python (the standard library and `packaging`, Python
3.11+; the base images run 3.12), before anything is installed:

    transformers_decision.py decide [--pin 5.14.1] --target v0.30.0 --record FILE --requirement-file FILE
                                    [--variant a2] [--table deploy/ascend-targets.yaml]
    transformers_decision.py verify --record FILE        after `pip install -r <requirement file>`
    transformers_decision.py import --record FILE        imports the config classes for real

`decide` keeps the base image's transformers when it
  1. has the config class of every model the installed vLLM serves: each model of
     src/minicpmv_ascend/common/models.py whose `vllm_min` is at most this vLLM (`MiniCPMV4_6Config`
     from vLLM 0.23, and `MiniCPMV4_7Config` too from vLLM 0.32: an image of a vLLM that can serve
     4.7 must be able to, whatever checkpoint it gets later),
  2. lies in the range the installed vLLM itself requires (`importlib.metadata.requires("vllm")`),
  3. and is below 5.21 when vLLM is 0.33 or older (5.21 changed `find_best_resize` /
     `get_refine_size`, which vLLM <= 0.33 calls with the old signatures);
otherwise it installs the pin (--pin, the TRANSFORMERS_VERSION build argument; empty, its default:
the target's transformers_pin in deploy/ascend-targets.yaml, each target its own), provided the pin
meets 2 and 3. When neither does,
it exits 1 with what is wrong and how to fix it. It logs the decision, writes the pip requirement
(`transformers==<pin>`, or nothing) to --requirement-file, and records facts and decision as JSON
in --record (scripts/ascend_check.py prints it in the running container).

Nothing here imports torch or transformers: versions come from installed metadata, and (1) is read
from transformers' source (its lazy top-level module exports what a model's configuration module
lists in `__all__`). So no step can load torch_npu, which needs the NPU driver that a `docker build`
does not have. `verify` checks that pip left the decided version in place; the Dockerfile's next
step, `import`, imports the recorded config classes for real (with TORCH_DEVICE_BACKEND_AUTOLOAD=0).
The table is read with PyYAML and the models' declarations from this checkout's
src/minicpmv_ascend/common/models.py by path (standard library; the project is not installed yet);
vLLM requires PyYAML, so every base image has it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib.metadata
import importlib.util
import json
import pathlib
import sys
from typing import Any

# Not the standard library: every image this runs in has `packaging` (transformers and vllm-ascend
# require it; the base images ship both), and pip reads versions with the same library.
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = pathlib.Path(__file__).resolve().parents[1]
TABLE = REPO / "deploy" / "ascend-targets.yaml"
MODELS_FILE = REPO / "src" / "minicpmv_ascend" / "common" / "models.py"
# transformers 5.21.0 changed find_best_resize()/get_refine_size(); vLLM up to 0.33 calls the old ones.
BREAKING_TRANSFORMERS = "5.21"
LAST_VLLM_WITH_OLD_CALLS = (0, 33)

# --------------------------------------------------------------------------------------------
# The models (common/models.py: one declaration per model) and the config classes a vLLM needs
# --------------------------------------------------------------------------------------------


@functools.cache
def _models() -> Any:
    """src/minicpmv_ascend/common/models.py, loaded by path (the build runs before the project is
    installed; the module is standard library only), once."""
    spec = importlib.util.spec_from_file_location("minicpmv_models_for_build", MODELS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_classes(vllm_version: str) -> list[str]:
    """The transformers config classes of every declared model this vLLM's code serves."""
    models = _models()
    release = models.version_tuple(str(vllm_version).split("+")[0])
    return [m.transformers_config for m in models.MODELS.values() if models.version_tuple(m.vllm_min) <= release]


def config_module(config_class: str) -> tuple[str, ...]:
    """transformers' configuration module of a declared model: models/<model_type>/configuration_<model_type>.py."""
    model_type = next(m.model_type for m in _models().MODELS.values() if m.transformers_config == config_class)
    return ("models", model_type, f"configuration_{model_type}.py")


def model_names(classes: list[str]) -> str:
    names = {m.transformers_config: m.name for m in _models().MODELS.values()}
    return " and ".join(names.get(c, c) for c in classes)


def target_pin(target: str | None, table: pathlib.Path = TABLE) -> str:
    """The target's transformers_pin in deploy/ascend-targets.yaml."""
    import yaml  # vLLM requires PyYAML: in every base image

    targets = yaml.safe_load(table.read_text(encoding="utf-8"))["targets"]
    if target not in targets:
        raise SystemExit(f"transformers_decision: no --pin given and target {target!r} is not in {table} "
                         f"({', '.join(targets)}): pass --build-arg TRANSFORMERS_VERSION=<version>")
    return str(targets[target]["transformers_pin"])


# --------------------------------------------------------------------------------------------
# Versions and specifiers: the `packaging` library (PEP 440, as pip reads them)
# --------------------------------------------------------------------------------------------


@functools.cache  # pure; the tests ask it ~10^5 times about a few dozen strings
def spec_contains(spec: str, version: str) -> bool:
    """Whether `version` satisfies every clause of `spec` ("" allows any version). Installed
    versions are judged as they are: a pre-release is not excluded for being one."""
    return SpecifierSet(spec).contains(Version(version), prereleases=True)


def requirement_spec(requirements: list[str] | None, name: str) -> str | None:
    """The version clauses a distribution's Requires-Dist gives for `name` (None: not required).

    Requirements that apply only with an extra (`; extra == "audio"`) are ignored; other markers
    (platform, Python version) are taken to apply: vLLM's transformers requirement has none.
    """
    specs = []
    for line in requirements or []:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) != canonicalize_name(name):
            continue
        if requirement.marker is not None and "extra" in str(requirement.marker):
            continue
        specs.append(str(requirement.specifier))
    if not specs:
        return None
    return ",".join(s for s in specs if s)


# --------------------------------------------------------------------------------------------
# The decision (pure: every input is a value, so the tests can try many combinations)
# --------------------------------------------------------------------------------------------


def missing_classes(has_class: bool | list[str] | None, vllm_version: str) -> list[str] | None:
    """`has_class` as the missing config classes: True (has all) -> [], False (has none) -> all
    this vLLM needs, a list -> itself, None -> None (not known yet)."""
    if has_class is None or isinstance(has_class, list):
        return has_class
    return [] if has_class else config_classes(vllm_version)


def problems(version: str | None, has_class: bool | list[str] | None, vllm_version: str,
             vllm_spec: str | None) -> list[str]:
    """Why this transformers cannot serve the MiniCPM-V models of this vLLM (empty list: it can).
    `has_class`: whether it has every config class this vLLM needs (`config_classes`), or the list
    of those it lacks; None: not known yet (a pin before it is installed; `verify` checks it then)."""
    if version is None:
        return ["no transformers is installed"]
    out = []
    v = Version(version)
    missing = missing_classes(has_class, vllm_version)
    if missing:
        out.append(f"it has no {', '.join(missing)} ({model_names(missing)} not in this transformers)")
    if vllm_spec and not spec_contains(vllm_spec, version):
        out.append(f"it is outside the range vLLM {vllm_version} requires (transformers{vllm_spec})")
    if Version(vllm_version).release[:2] <= LAST_VLLM_WITH_OLD_CALLS and v >= Version(BREAKING_TRANSFORMERS):
        out.append(f"it is {BREAKING_TRANSFORMERS} or newer, whose find_best_resize/get_refine_size "
                   f"signatures vLLM {vllm_version} (0.33 or older) does not call correctly")
    return out


@dataclasses.dataclass
class Decision:
    action: str  # keep | install | fail
    version: str | None  # the transformers the image ends up with
    base_problems: list[str]
    pin_problems: list[str]
    message: str

    @property
    def requirement(self) -> str:
        return f"transformers=={self.version}" if self.action == "install" else ""


def decide(base_version: str | None, base_has_class: bool | list[str] | None, vllm_version: str,
           vllm_spec: str | None, pin: str) -> Decision:
    rules = f"vLLM {vllm_version} requires transformers{vllm_spec or ' (any version)'}"
    if Version(vllm_version).release[:2] <= LAST_VLLM_WITH_OLD_CALLS:
        rules += f"; below {BREAKING_TRANSFORMERS} for vLLM <= 0.33"
    base = problems(base_version, base_has_class, vllm_version, vllm_spec)
    if not base:
        return Decision("keep", base_version, [], [],
                        f"keep the base image's transformers {base_version}: it has "
                        f"{' and '.join(config_classes(vllm_version))} and meets the rules ({rules})")
    pin_has_class = base_has_class if base_version is not None and Version(pin) == Version(base_version) else None
    pinned = problems(pin, pin_has_class, vllm_version, vllm_spec)
    why_base = "; ".join(base)
    if not pinned:
        return Decision("install", pin, base, [],
                        f"install transformers {pin} (the pin): the base image's "
                        f"{base_version or 'transformers'} is unusable: {why_base} ({rules})")
    return Decision("fail", None, base, pinned,
                    f"neither the base image's transformers {base_version or '(none)'} nor the pin {pin} works "
                    f"here. Base: {why_base}. Pin: {'; '.join(pinned)}. ({rules}.) Fix: build with "
                    f"--build-arg TRANSFORMERS_VERSION=<a version that has {' and '.join(config_classes(vllm_version))} "
                    "and meets these rules> and record it as transformers_pin in deploy/ascend-targets.yaml")


# --------------------------------------------------------------------------------------------
# Facts of the installation (metadata and source only: nothing is imported)
# --------------------------------------------------------------------------------------------


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def transformers_missing_classes(classes: list[str]) -> list[str] | None:
    """Those of `classes` the installed transformers does not export (None: no transformers)."""
    found = [transformers_has_config_class(c) for c in classes]
    if any(f is None for f in found):
        return None
    return [c for c, f in zip(classes, found) if not f]


def transformers_has_config_class(config_class: str) -> bool | None:
    """Whether the installed transformers exports `config_class`, read from its source.

    transformers' top-level module is lazy: it exports every name a model's configuration module
    lists in `__all__` (the generated models/<model>/__init__.py says so). find_spec of a top-level
    name locates the package without importing it.
    """
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = pathlib.Path(root).joinpath(*config_module(config_class))
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        defined = any(isinstance(n, ast.ClassDef) and n.name == config_class for n in tree.body)
        exported = any(
            isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
            and isinstance(n.value, (ast.List, ast.Tuple))
            and any(isinstance(e, ast.Constant) and e.value == config_class for e in n.value.elts)
            for n in tree.body)
        return defined and exported
    return False


def facts() -> dict[str, Any]:
    vllm = _dist_version("vllm")
    if vllm is None:
        raise SystemExit("transformers_decision: no distribution named `vllm` in this Python "
                         f"({sys.executable}): build FROM a vllm-ascend image (it installs vLLM)")
    installed = _dist_version("transformers")
    classes = config_classes(vllm)
    missing = transformers_missing_classes(classes) if installed else None
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "vllm": vllm,
        "vllm_requires_transformers": requirement_spec(importlib.metadata.requires("vllm"), "transformers"),
        "config_classes": classes,
        "base_transformers": installed,
        "base_has_config_class": None if missing is None else not missing,
        "base_missing_classes": missing,
    }


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def cmd_decide(args: argparse.Namespace) -> int:
    found = facts()
    pin = args.pin or target_pin(args.target, args.table)
    decision = decide(found["base_transformers"], found["base_missing_classes"], found["vllm"],
                      found["vllm_requires_transformers"], pin)
    record = {
        "target": args.target, "variant": args.variant,
        **found,
        "pin": pin,
        "decision": decision.action,
        "transformers": decision.version,
        "reason": decision.message,
    }
    print(f"transformers decision: {decision.message}", flush=True)
    if decision.action == "fail":
        print(f"transformers_decision: {decision.message}", file=sys.stderr)
        return 1
    for path, text in ((args.record, json.dumps(record, indent=2) + "\n"),
                       (args.requirement_file, decision.requirement + "\n" if decision.requirement else "")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    record = json.loads(args.record.read_text(encoding="utf-8"))
    installed, wanted = _dist_version("transformers"), record["transformers"]
    wrong = []
    if installed is None or Version(installed) != Version(wanted):
        wrong.append(f"transformers {installed or '(none)'} is installed, the decision was {wanted} "
                     f"({record['decision']}): another package's requirement changed it during pip install")
    elif transformers_missing_classes(record["config_classes"]):
        missing = transformers_missing_classes(record["config_classes"])
        wrong.append(f"transformers {installed} has no {', '.join(missing)}: choose a transformers_pin that has "
                     f"{model_names(missing)} (deploy/ascend-targets.yaml, build argument TRANSFORMERS_VERSION)")
    if wrong:
        print(f"transformers_decision verify: {'; '.join(wrong)}", file=sys.stderr)
        return 1
    print(f"transformers verified: {installed} ({record['decision']}), has {', '.join(record['config_classes'])}",
          flush=True)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """The one step that imports transformers (and so torch): each recorded config class, for real."""
    import transformers

    classes = json.loads(args.record.read_text(encoding="utf-8"))["config_classes"]
    for name in classes:
        getattr(transformers, name)
    print(f"transformers {transformers.__version__} imports {', '.join(classes)}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decide", help="keep the base image's transformers or install the pin")
    d.add_argument("--pin", default="", help="transformers version to install when the base's is unusable "
                   "(empty: the target's transformers_pin in --table)")
    d.add_argument("--table", type=pathlib.Path, default=TABLE, help="the targets table (deploy/ascend-targets.yaml)")
    d.add_argument("--record", type=pathlib.Path, required=True, help="JSON file for facts and decision")
    d.add_argument("--requirement-file", type=pathlib.Path, required=True,
                   help="pip requirements file to write (empty: keep the base's transformers)")
    d.add_argument("--target", default=None, help="vllm-ascend tag of the base image (recorded)")
    d.add_argument("--variant", default=None, help="a2 or a3 (recorded)")
    d.set_defaults(run=cmd_decide)
    v = sub.add_parser("verify", help="after pip install: the decided transformers is installed")
    v.add_argument("--record", type=pathlib.Path, required=True)
    v.set_defaults(run=cmd_verify)
    i = sub.add_parser("import", help="import the recorded config classes from transformers, for real")
    i.add_argument("--record", type=pathlib.Path, required=True)
    i.set_defaults(run=cmd_import)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
