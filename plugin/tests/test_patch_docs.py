"""A patch is declared once: every patch module is in `PATCH_MODULES`, each declaration carries the
prose plugin/README.md shows (generated from it, kept in sync here), its evidence agrees with
`_target.NEEDED`, and a predicate whose vLLM code is not there says "layout not found" (never a
silent "not needed").

Seconds (no server, no model weights); runs on every target like the rest of plugin/tests.
"""

from __future__ import annotations

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
    from minicpmv_ascend_plugin._base import LayoutNotFound

    try:
        reason = patch.check(target)
    except (LayoutNotFound, ImportError, AttributeError):
        return plugin.LAYOUT_NOT_FOUND
    return "applied" if reason is None else "skipped"


def test_every_patch_module_is_listed_once_with_its_prose():
    import minicpmv_ascend_plugin as plugin

    holding = sorted(p.stem for p in PACKAGE.glob("*.py") if re.search(r"^PATCH = Patch\(", p.read_text(), re.M))
    assert sorted(plugin.PATCH_MODULES) == holding, "a module with a PATCH is not in PATCH_MODULES (or the reverse)"
    assert len(set(plugin.PATCH_MODULES)) == len(plugin.PATCH_MODULES)
    names = [p.name for p in plugin.PATCHES]
    assert len(set(names)) == len(names)
    for patch in plugin.PATCHES:
        missing = [f for f in ("summary", "upstream", "fixes", "references", "tests", "delete_when", "details")
                   if not getattr(patch, f).strip()]
        assert not missing, f"{patch.name} declares no {', '.join(missing)}"


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
    from minicpmv_ascend_plugin import _base, config_hook
    from minicpmv_ascend_plugin._base import AT_REGISTER

    before = {p.name: outcome(p, None) for p in plugin.PATCHES if p.stage == AT_REGISTER}
    assert plugin.LAYOUT_NOT_FOUND not in before.values(), before
    empty = REPO / "build" / "empty-vllm-tree"
    empty.mkdir(parents=True, exist_ok=True)
    real = _base.package_dir
    moved = lambda name: empty if name == "vllm" else real(name)  # noqa: E731
    monkeypatch.setattr(_base, "package_dir", moved)
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
    from minicpmv_ascend_plugin._base import AT_MODEL_IMPORT

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
    from minicpmv_ascend_plugin._base import AT_REGISTER, LayoutNotFound, Patch

    applied = []

    def check(_):
        raise LayoutNotFound("vLLM has none of entrypoints/moved.py here")

    patch = Patch(name="example-moved", stage=AT_REGISTER, summary="s", upstream="u", check=check,
                  apply=applied.append)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    monkeypatch.setattr(plugin, "_decisions", {})
    plugin.logger.addHandler(handler)
    try:
        decision = plugin._decide(patch, None)
    finally:
        plugin.logger.removeHandler(handler)
    assert decision == plugin.Decision(plugin.LAYOUT_NOT_FOUND, "vLLM has none of entrypoints/moved.py here")
    assert not applied
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "example-moved not applied: layout not found: vLLM has none of entrypoints/moved.py" in records[0].getMessage()
    assert "layout not found: example-moved (vLLM has none" in plugin._summary(["example-moved"])


@pytest.mark.parametrize("status", ["applied", "skipped"])
def test_decide_maps_only_missing_layouts_to_layout_not_found(status, monkeypatch):
    """The other two outcomes stay what they were (no warning)."""
    import minicpmv_ascend_plugin as plugin
    from minicpmv_ascend_plugin._base import AT_REGISTER, Patch

    patch = Patch(name="example", stage=AT_REGISTER, summary="s", upstream="u",
                  check=lambda _: None if status == "applied" else "vLLM has the fix", apply=lambda _: None)
    monkeypatch.setattr(plugin, "_decisions", {})
    assert plugin._decide(patch, None).status == status
