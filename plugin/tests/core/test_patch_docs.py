"""A patch is declared once: every patch module is in `PATCH_MODULES`, each declaration carries its
prose (the record is the one place for it; plugin/README.md lists each patch with a link to its
record, generated and kept in sync here), its evidence agrees with
`_target.NEEDED`, and a predicate whose vLLM code is not there says "layout not found" (never a
silent "not needed").

Seconds (no server, no model weights); runs on every target like the rest of plugin/tests.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import logging
import re
import sys
import types

import pytest

from _target import REPO

PACKAGE = REPO / "plugin" / "minicpmv_ascend_plugin"
README = REPO / "plugin" / "README.md"
# AT_REGISTER patches whose predicates read vLLM's source text (not its live classes): with vLLM's
# source tree gone, at least these must say "layout not found" (a new patch needs no entry here: the
# test holds every patch to "layout not found or the same decision as before").
SOURCE_READERS = ("content-part-400", "engine-death-exit", "image-shape-400", "json-whitespace", "request-type-400",
                  "responses-assistant-content", "shutdown-cut-requests", "shutdown-drain-503", "uvicorn-signals")


def patch_table():
    """scripts/patch_table.py, loaded from its file (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("patch_table", REPO / "scripts" / "patch_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outcome(patch, target) -> str:
    """What `register()` would make of the predicate's answer: applied / skipped / layout-not-found
    (the same exceptions `_decide` maps to it)."""
    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend_plugin.core.patch import LayoutNotFound

    try:
        reason = patch.check(target)
    except (LayoutNotFound, ImportError, AttributeError):
        return plugin.LAYOUT_NOT_FOUND
    return "applied" if reason is None else "skipped"


def test_every_patch_module_is_listed_once_with_its_prose():
    import minicpmv_ascend_plugin as plugin

    holding = sorted(".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")
                     if re.search(r"^PATCH = Patch\(", p.read_text(), re.M))
    assert sorted(plugin.PATCH_MODULES) == holding, "a module with a PATCH is not in PATCH_MODULES (or the reverse)"
    assert all(name.startswith("patches.") for name in holding), "every patch lives under patches/"
    assert len(set(plugin.PATCH_MODULES)) == len(plugin.PATCH_MODULES)
    names = [p.name for p in plugin.PATCHES]
    assert len(set(names)) == len(names)
    for patch in plugin.PATCHES:
        missing = [f for f in ("summary", "upstream", "fixes", "tests", "delete_when", "details")
                   if not getattr(patch, f).strip()]
        assert not missing, f"{patch.name} declares no {', '.join(missing)}"


def test_the_readme_lists_every_patch_with_its_record():
    """plugin/README.md's patch list is what the records make now, and names each patch once with a
    link to its record file (`make docs` rewrites it)."""
    import minicpmv_ascend_plugin as plugin

    text = README.read_text(encoding="utf-8")
    start = text.index("\n", text.index("<!-- patch-list:start")) + 1
    listed = text[start:text.index("<!-- patch-list:end -->")]
    assert listed == patch_table().patch_list(), "plugin/README.md's patch list is stale: run `make docs`"
    rows = listed.splitlines()[2:]
    assert [row.split("`")[1] for row in rows] == [p.name for p in plugin.PATCHES]
    for row, module in zip(rows, plugin.PATCH_MODULES):
        record = "minicpmv_ascend_plugin/" + module.replace(".", "/") + ".py"
        assert f"]({record})" in row and (README.parent / record).is_file(), (row, record)


def test_declared_wheel_evidence_agrees_with_needed(target):
    """A patch's `evidence` for this target's vLLM says "applied" exactly where `_target.NEEDED` does."""
    import minicpmv_ascend_plugin as plugin

    for patch in plugin.PATCHES:
        if target.vllm in patch.evidence:
            status = patch.evidence[target.vllm][0]
            assert (status == "applied") == target.needs(patch.name), (patch.name, status)


def test_predicates_reading_moved_source_say_layout_not_found(target, monkeypatch):
    """With vLLM's source tree not where the predicates read it (an empty directory), every
    predicate that reads vLLM's source text reports "layout not found", not "not needed"; the
    platform-bound ones still decide by platform first (this CPU is no Ascend and, for these CUDA
    wheels, no vLLM-CPU)."""
    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend_plugin.core import config_hook, vllm_code
    from minicpmv_ascend_plugin.core.patch import AT_REGISTER

    before = {p.name: outcome(p, None) for p in plugin.PATCHES if p.stage == AT_REGISTER}
    assert plugin.LAYOUT_NOT_FOUND not in before.values(), before
    empty = REPO / "build" / "empty-vllm-tree"
    empty.mkdir(parents=True, exist_ok=True)
    real = vllm_code.package_dir
    moved = lambda name: empty if name == "vllm" else real(name)  # noqa: E731
    monkeypatch.setattr(vllm_code, "package_dir", moved)
    monkeypatch.setattr(config_hook, "package_dir", moved)
    after = {p.name: outcome(p, None) for p in plugin.PATCHES if p.stage == AT_REGISTER}
    unfound = {n for n, o in after.items() if o == plugin.LAYOUT_NOT_FOUND}
    assert set(SOURCE_READERS) <= unfound, after
    # No predicate changes its answer silently: it finds its layout gone, or never read it.
    assert {n: o for n, o in after.items() if n not in unfound} == {n: before[n] for n in after if n not in unfound}
    if "vllm.model_executor.models.config" not in sys.modules:
        assert "gdn-state-dtype" in unfound  # reads MODELS_CONFIG_MAP's source until vLLM imports the map
    assert after["gdn-one-token-prefill"] == after["rotary-mrope"] == "skipped"


def test_predicates_reading_missing_classes_say_layout_not_found(target, monkeypatch):
    """Where the class or method a predicate calls is gone (another module layout), it is "layout
    not found": the model backports given a MiniCPM-V 4.6 module without its classes, the media
    patches given a MediaConnector / ImageMediaIO without the methods they probe."""
    from vllm.multimodal.media.connector import MediaConnector
    from vllm.multimodal.media.image import ImageMediaIO

    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend_plugin.core.patch import AT_MODEL_IMPORT

    empty_module = types.ModuleType("vllm.model_executor.models.minicpmv4_6")
    by_release = tuple(int(part) for part in target.vllm.split(".")) < (0, 25)  # image-size-order's fallback
    for patch in plugin.PATCHES:
        if patch.stage == AT_MODEL_IMPORT and not (patch.name == "image-size-order" and by_release):
            assert outcome(patch, empty_module) == plugin.LAYOUT_NOT_FOUND, patch.name
    by_name = {p.name: p for p in plugin.PATCHES}
    for cls, method, name in ((MediaConnector, "_load_data_url", "data-url-400"),
                              (MediaConnector, "_load_file_url", "file-url-400"),
                              (ImageMediaIO, "load_bytes", "image-bomb-400"),
                              (MediaConnector, "fetch_image", "image-shape-400"),
                              (MediaConnector, "_assert_url_in_allowed_media_domains", "public-media-urls")):
        with monkeypatch.context() as patched:
            patched.delattr(cls, method)
            assert outcome(by_name[name], None) == plugin.LAYOUT_NOT_FOUND, name


def test_layout_not_found_is_a_warning_naming_the_patch_not_a_refusal(monkeypatch):
    """`register()`'s decision for a predicate that raises LayoutNotFound: not applied, its own
    status, a WARNING naming the patch; vLLM goes on (no exception)."""
    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend_plugin.core import registry
    from minicpmv_ascend_plugin.core.patch import AT_REGISTER, LayoutNotFound, Patch

    applied = []

    def check(_):
        raise LayoutNotFound("vLLM has none of entrypoints/moved.py here")

    patch = Patch(name="example-moved", stage=AT_REGISTER, summary="s", upstream="u", check=check,
                  apply=applied.append)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    monkeypatch.setattr(registry, "_decisions", {})
    registry.logger.addHandler(handler)
    try:
        decision = registry._decide(patch, None)
    finally:
        registry.logger.removeHandler(handler)
    assert decision == registry.Decision(plugin.LAYOUT_NOT_FOUND, "vLLM has none of entrypoints/moved.py here")
    assert not applied
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "example-moved not applied: layout not found: vLLM has none of entrypoints/moved.py" in records[0].getMessage()
    assert "layout not found: example-moved (vLLM has none" in registry._summary(["example-moved"])


@pytest.mark.parametrize("status", ["applied", "skipped"])
def test_decide_maps_only_missing_layouts_to_layout_not_found(status, monkeypatch):
    """The other two outcomes stay what they were (no warning)."""
    from minicpmv_ascend_plugin.core import registry
    from minicpmv_ascend_plugin.core.patch import AT_REGISTER, Patch

    patch = Patch(name="example", stage=AT_REGISTER, summary="s", upstream="u",
                  check=lambda _: None if status == "applied" else "vLLM has the fix", apply=lambda _: None)
    monkeypatch.setattr(registry, "_decisions", {})
    assert registry._decide(patch, None).status == status


# --------------------------------------------------------------------------------------------
# Each fact once: what a patch module's code holds, its record's prose takes from the code
# --------------------------------------------------------------------------------------------

PROSE_FIELDS = ("summary", "upstream", "fixes", "tests", "delete_when", "details")


def prose(patch) -> str:
    """Every word plugin/README.md, the patch table and `--dry-run` show of a patch."""
    evidence = [text for decision in patch.evidence.values() for text in decision]
    return "\n".join([*(getattr(patch, field) for field in PROSE_FIELDS), *evidence])


def constants(tree: ast.Module) -> dict[str, ast.Constant]:
    """A module's facts: its module-level NAME = literal constants (strings, numbers)."""
    return {node.targets[0].id: node.value for node in tree.body
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.isupper() and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, (str, int)) and not isinstance(node.value.value, bool)}


def read_by_the_predicate(tree: ast.Module, facts: dict[str, ast.Constant]) -> set[str]:
    """The constants `check` decides with (a probe's input, a file or code it reads), also through
    the module's own functions it calls (`probe`), not those it only returns (a reason)."""
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    used: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Return) and not isinstance(node.value, ast.Call):
            return
        if isinstance(node, ast.Name) and node.id not in used:
            used.add(node.id)
            if node.id in functions:
                visit(functions[node.id])
        for child in ast.iter_child_nodes(node):
            visit(child)

    if "check" in functions:
        visit(functions["check"])
    return {name for name in facts if name in used}


def names(text: str, value: str | int) -> bool:
    """Whether the text names the value as a whole (not `minicpmv` in `minicpmv_config` or `minicpmv.py`)."""
    if isinstance(value, int):
        return re.search(rf"(?<![\d.,_]){value}(?![\d,_])(?!\.\d)", text) is not None
    return re.search(rf"(?<![\w./-]){re.escape(value)}(?![\w/-])(?!\.py\b)", text) is not None


def patch_of(module_name: str, source: str):
    """The PATCH that `source`, as the module `module_name`, declares."""
    module = types.ModuleType(module_name)  # not in sys.modules: a dataclass finds the real one
    module.__package__ = module_name.rpartition(".")[0]
    exec(compile(source, module_name, "exec"), module.__dict__)
    return module.PATCH


def mutated_patch(module_name: str, source: str, node: ast.Constant, sentinel: str | int):
    """The module's PATCH when its source holds `sentinel` where the constant's literal was."""
    lines = source.splitlines(keepends=True)
    start = sum(len(line) for line in lines[:node.lineno - 1]) + node.col_offset
    end = sum(len(line) for line in lines[:node.end_lineno - 1]) + node.end_col_offset
    return patch_of(module_name, source[:start] + repr(sentinel) + source[end:])


def fact_problems(module_name: str, source: str) -> list[str]:
    """Where the prose retypes a fact of the code instead of taking it from the constant: a
    constant whose value the prose names, or that the predicate reads, changed in the source must
    change the prose with it (the new value appears, the old one no longer does)."""
    tree = ast.parse(source)
    facts = constants(tree)
    text = prose(patch_of(module_name, source))
    must = read_by_the_predicate(tree, facts)
    problems = []
    for i, (name, node) in enumerate(facts.items()):
        value = node.value
        if name == "NAME":  # the patch's name: the record's `name`, which prose may mention freely
            continue
        long_enough = len(value) >= 6 if isinstance(value, str) else value >= 10
        if name not in must and not (long_enough and names(text, value)):
            continue
        sentinel = f"FACT-{name}" if isinstance(value, str) else 987_654_321 + i
        after = prose(mutated_patch(module_name, source, node, sentinel))
        if not names(after, sentinel):
            problems.append(f"{module_name}: {name} ({value!r}) is not taken from the constant into the prose"
                            + (" (the predicate reads it: say it there, e.g. `{" + name + "}`)" if name in must else ""))
        elif long_enough and names(after, value):
            problems.append(f"{module_name}: the prose also names {name}'s value {value!r} as text")
    return problems


def test_the_prose_takes_the_facts_of_the_code_from_its_constants():
    import minicpmv_ascend_plugin as plugin

    problems = []
    for name in plugin.PATCH_MODULES:
        path = PACKAGE.joinpath(*name.split(".")).with_suffix(".py")
        problems += fact_problems(f"{PACKAGE.name}.{name}", path.read_text())
    assert not problems, "\n".join(problems)


def test_a_fact_retyped_into_the_prose_is_found():
    """The planted drift: data-url-400's prose naming the probe it once had (`data:,hello`) where
    the code probes another URL."""
    module_name = f"{PACKAGE.name}.patches.media.data_url_400"
    source = (PACKAGE / "patches" / "media" / "data_url_400.py").read_text()
    assert fact_problems(module_name, source) == []
    assert "given `{PROBE_URL}`" in source
    drifted = source.replace("given `{PROBE_URL}`", "given `data:,hello`")
    assert fact_problems(module_name, drifted) == [
        f"{module_name}: PROBE_URL ('data:image/png;charset=utf-8,hello') is not taken from the constant into the "
        "prose (the predicate reads it: say it there, e.g. `{PROBE_URL}`)"]
