#!/usr/bin/env python3
"""Which transformers the Ascend image ships: the base image's own, or the table's pin.

Run by the Dockerfile in the base image's Python (the standard library and `packaging`, Python
3.11+; the base images run 3.12), before anything is installed:

    transformers_decision.py decide --pin 5.14.1 --record FILE --requirement-file FILE
                                    [--target v0.30.0 --variant a2]
    transformers_decision.py verify --record FILE        after `pip install -r <requirement file>`

`decide` keeps the base image's transformers when it
  1. has MiniCPM-V 4.6 (`MiniCPMV4_6Config`),
  2. lies in the range the installed vLLM itself requires (`importlib.metadata.requires("vllm")`),
  3. and is below 5.21 when vLLM is 0.33 or older (5.21 changed `find_best_resize` /
     `get_refine_size`, which vLLM <= 0.33 calls with the old signatures);
otherwise it installs the pin (--pin, the TRANSFORMERS_VERSION build argument, whose default is
deploy/ascend-targets.yaml's transformers_pin), provided the pin meets 2 and 3. When neither does,
it exits 1 with what is wrong and how to fix it. It logs the decision, writes the pip requirement
(`transformers==<pin>`, or nothing) to --requirement-file, and records facts and decision as JSON
in --record (scripts/ascend_check.py prints it in the running container).

Nothing here imports torch or transformers: versions come from installed metadata, and (1) is read
from transformers' source (its lazy top-level module exports what a model's configuration module
lists in `__all__`). So no step can load torch_npu, which needs the NPU driver that a `docker build`
does not have. `verify` checks that pip left the decided version in place; the Dockerfile's next
step imports `MiniCPMV4_6Config` for real (with TORCH_DEVICE_BACKEND_AUTOLOAD=0).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
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

CONFIG_CLASS = "MiniCPMV4_6Config"
CONFIG_MODULE = ("models", "minicpmv4_6", "configuration_minicpmv4_6.py")
# transformers 5.21.0 changed find_best_resize()/get_refine_size(); vLLM up to 0.33 calls the old ones.
BREAKING_TRANSFORMERS = "5.21"
LAST_VLLM_WITH_OLD_CALLS = (0, 33)

# --------------------------------------------------------------------------------------------
# Versions and specifiers: the `packaging` library (PEP 440, as pip reads them)
# --------------------------------------------------------------------------------------------


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


def problems(version: str | None, has_class: bool | None, vllm_version: str, vllm_spec: str | None) -> list[str]:
    """Why this transformers cannot serve MiniCPM-V 4.6 under this vLLM (empty list: it can).
    `has_class=None`: not known yet (a pin before it is installed; `verify` checks it then)."""
    if version is None:
        return ["no transformers is installed"]
    out = []
    v = Version(version)
    if has_class is False:
        out.append(f"it has no {CONFIG_CLASS} (MiniCPM-V 4.6 is not in this transformers)")
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


def decide(base_version: str | None, base_has_class: bool | None, vllm_version: str, vllm_spec: str | None,
           pin: str) -> Decision:
    rules = f"vLLM {vllm_version} requires transformers{vllm_spec or ' (any version)'}"
    if Version(vllm_version).release[:2] <= LAST_VLLM_WITH_OLD_CALLS:
        rules += f"; below {BREAKING_TRANSFORMERS} for vLLM <= 0.33"
    base = problems(base_version, base_has_class, vllm_version, vllm_spec)
    if not base:
        return Decision("keep", base_version, [], [],
                        f"keep the base image's transformers {base_version}: it has {CONFIG_CLASS} and meets the "
                        f"rules ({rules})")
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
                    f"--build-arg TRANSFORMERS_VERSION=<a version that has {CONFIG_CLASS} and meets these "
                    "rules> and record it as transformers_pin in deploy/ascend-targets.yaml")


# --------------------------------------------------------------------------------------------
# Facts of the installation (metadata and source only: nothing is imported)
# --------------------------------------------------------------------------------------------


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def transformers_has_config_class() -> bool | None:
    """Whether the installed transformers exports MiniCPMV4_6Config, read from its source.

    transformers' top-level module is lazy: it exports every name a model's configuration module
    lists in `__all__` (the generated models/<model>/__init__.py says so). find_spec of a top-level
    name locates the package without importing it.
    """
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = pathlib.Path(root).joinpath(*CONFIG_MODULE)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        defined = any(isinstance(n, ast.ClassDef) and n.name == CONFIG_CLASS for n in tree.body)
        exported = any(
            isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
            and isinstance(n.value, (ast.List, ast.Tuple))
            and any(isinstance(e, ast.Constant) and e.value == CONFIG_CLASS for e in n.value.elts)
            for n in tree.body)
        return defined and exported
    return False


def facts() -> dict[str, Any]:
    vllm = _dist_version("vllm")
    if vllm is None:
        raise SystemExit("transformers_decision: no distribution named `vllm` in this Python "
                         f"({sys.executable}): build FROM a vllm-ascend image (it installs vLLM)")
    installed = _dist_version("transformers")
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "vllm": vllm,
        "vllm_requires_transformers": requirement_spec(importlib.metadata.requires("vllm"), "transformers"),
        "base_transformers": installed,
        "base_has_config_class": transformers_has_config_class() if installed else None,
    }


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def cmd_decide(args: argparse.Namespace) -> int:
    found = facts()
    decision = decide(found["base_transformers"], found["base_has_config_class"], found["vllm"],
                      found["vllm_requires_transformers"], args.pin)
    record = {
        "target": args.target, "variant": args.variant,
        **found,
        "pin": args.pin,
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
    elif not transformers_has_config_class():
        wrong.append(f"transformers {installed} has no {CONFIG_CLASS}: choose a transformers_pin that has "
                     "MiniCPM-V 4.6 (deploy/ascend-targets.yaml, build argument TRANSFORMERS_VERSION)")
    if wrong:
        print(f"transformers_decision verify: {'; '.join(wrong)}", file=sys.stderr)
        return 1
    print(f"transformers verified: {installed} ({record['decision']}), has {CONFIG_CLASS}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decide", help="keep the base image's transformers or install the pin")
    d.add_argument("--pin", required=True, help="transformers version to install when the base's is unusable")
    d.add_argument("--record", type=pathlib.Path, required=True, help="JSON file for facts and decision")
    d.add_argument("--requirement-file", type=pathlib.Path, required=True,
                   help="pip requirements file to write (empty: keep the base's transformers)")
    d.add_argument("--target", default=None, help="vllm-ascend tag of the base image (recorded)")
    d.add_argument("--variant", default=None, help="a2 or a3 (recorded)")
    d.set_defaults(run=cmd_decide)
    v = sub.add_parser("verify", help="after pip install: the decided transformers is installed")
    v.add_argument("--record", type=pathlib.Path, required=True)
    v.set_defaults(run=cmd_verify)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
