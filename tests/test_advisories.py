"""The advisories table (src/minicpmv_ascend/tools/advisories.py) holds together: every advisory has a
verdict for every target of deploy/ascend-targets.yaml and the verdict's version claim is what the
published range says of that target's vLLM; every mitigation names a real setting, a real plugin
patch and tests that exist. Unit tier: files and imports only, no server, no torch.
"""

from __future__ import annotations

import ast
import re

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import minicpmv_ascend_plugin
from minicpmv_ascend.settings import SETTINGS_BY_NAME
from minicpmv_ascend.tools import advisories, targets
from support.server import REPO

ADVISORIES = advisories.ADVISORIES
IDS = [a.ids[0] for a in ADVISORIES]
ID_FORMS = re.compile(r"^(GHSA(-[23456789cfghjmpqrvwx]{4}){3}|CVE-\d{4}-\d{4,}|PYSEC-\d{4}-\d+)$")


def target_vllm() -> dict[str, Version]:
    """Each target's vLLM release, read from deploy/ascend-targets.yaml."""
    return {tag: Version(str(target["vllm"])) for tag, target in targets.load(None)["targets"].items()}


def in_range(version: Version, published: str) -> bool:
    """`published` is a range as advisories write it: `>= 0.7.3, < 0.31.0`, `< 0.31.0`, `>= 0`."""
    return version in SpecifierSet(published.replace(" ", ""))


def defined_functions(path: str) -> set[str]:
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def problems(entries: tuple[advisories.Advisory, ...]) -> list[str]:
    """Every way the declarations disagree with the targets, the settings, the plugin or the tests."""
    found: list[str] = []
    versions = target_vllm()
    patches = {patch.name for patch in minicpmv_ascend_plugin.PATCHES}
    for a in entries:
        name = a.ids[0]
        found += [f"{name}: id {i!r} is not a GHSA, CVE or PYSEC id" for i in a.ids if not ID_FORMS.match(i)]
        if not a.link.startswith("https://") or not all(s.startswith("https://") for s in a.sources):
            found.append(f"{name}: a link is not an https URL")
        if a.fixed is not None and in_range(Version(a.fixed), a.affected):
            found.append(f"{name}: the fixed release {a.fixed} is inside the affected range {a.affected}")
        if missing := sorted(set(versions) - set(a.verdicts)):
            found.append(f"{name}: no verdict for {', '.join(missing)}")
        if extra := sorted(set(a.verdicts) - set(versions)):
            found.append(f"{name}: verdicts for targets not in deploy/ascend-targets.yaml: {', '.join(extra)}")
        for tag, verdict in sorted(a.verdicts.items()):
            where = f"{name} on {tag}"
            if tag in versions:
                published = "affected" if in_range(versions[tag], a.affected) else "not affected"
                if verdict.status != published:
                    found.append(f"{where}: says {verdict.status}, but vLLM {versions[tag]} is "
                                 f"{'inside' if published == 'affected' else 'outside'} {a.affected}")
            if verdict.status == "not affected":
                if verdict.kind or verdict.setting or verdict.plugin or verdict.tests:
                    found.append(f"{where}: not affected, yet names a mitigation")
                continue
            if verdict.kind not in advisories.KINDS:
                found.append(f"{where}: kind {verdict.kind!r} is not one of {advisories.KINDS}")
            if not verdict.why:
                found.append(f"{where}: no reason given")
            if verdict.kind == "setting" and not verdict.setting:
                found.append(f"{where}: a `setting` verdict names no setting")
            if verdict.kind == "plugin" and not verdict.plugin:
                found.append(f"{where}: a `plugin` verdict names no patch")
            if verdict.kind in ("setting", "guard", "plugin") and not verdict.tests:
                found.append(f"{where}: a mitigation names no test that shows it")
            if verdict.setting and verdict.setting not in SETTINGS_BY_NAME:
                found.append(f"{where}: no kit setting is named {verdict.setting!r}")
            if verdict.plugin and verdict.plugin not in patches:
                found.append(f"{where}: the plugin has no patch named {verdict.plugin!r}")
            for test in verdict.tests:
                path, _, function = test.partition("::")
                if not (REPO / path).is_file():
                    found.append(f"{where}: {path} does not exist")
                elif function not in defined_functions(path):
                    found.append(f"{where}: {path} defines no {function}")
    return found


def test_every_advisory_has_a_consistent_verdict_for_every_target() -> None:
    assert problems(ADVISORIES) == []


def test_advisory_ids_are_unique() -> None:
    every = [i for a in ADVISORIES for i in a.ids]
    assert len(every) == len(set(every)), sorted(i for i in every if every.count(i) > 1)


@pytest.mark.parametrize("fault", ["a verdict removed", "a setting misnamed", "a test misnamed",
                                   "a version claim flipped", "a plugin misnamed"])
def test_planted_faults_are_found(fault: str) -> None:
    """The checks catch what they are for: one planted fault, one problem naming it."""
    import dataclasses

    first = ADVISORIES[0]  # GHSA-h3rc-6mm3-gc2m: a guard verdict on 0.23 and 0.30
    tag = advisories.T30
    verdicts = dict(first.verdicts)
    if fault == "a verdict removed":
        del verdicts[tag]
    elif fault == "a setting misnamed":
        verdicts[tag] = dataclasses.replace(verdicts[tag], setting="trust_request_mm_kwarg")
    elif fault == "a test misnamed":
        verdicts[tag] = dataclasses.replace(verdicts[tag], tests=("tests/test_client_isolation.py::test_nothing",))
    elif fault == "a version claim flipped":
        verdicts[tag] = advisories.NOT_AFFECTED
    else:
        verdicts[tag] = dataclasses.replace(verdicts[tag], kind="plugin", plugin="no-such-patch")
    found = problems((dataclasses.replace(first, verdicts=verdicts),))
    assert len(found) == 1 and found[0].startswith(first.ids[0]), found


def test_a_target_added_without_verdicts_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A target in deploy/ascend-targets.yaml that the declarations do not cover is a problem."""
    real = targets.load(None)
    added = real | {"targets": real["targets"] | {"v0.34.0": {"vllm": "0.34.0"}}}
    monkeypatch.setattr(targets, "load", lambda path=None: added)
    found = problems(ADVISORIES)
    assert len(found) == len(ADVISORIES) and all("no verdict for v0.34.0" in p for p in found), found


def test_the_table_shows_every_advisory_and_target() -> None:
    table = advisories.markdown()
    assert all(f"[{a.ids[0]}]({a.link})" in table for a in ADVISORIES)
    assert all(f"{tag} (vLLM " in table.splitlines()[0] for tag in target_vllm())
    # Short cells: the full reasons stay in advisories.py, the doc says how the kit stands.
    assert all(len(advisories.cell(v)) <= 100 for a in ADVISORIES for v in a.verdicts.values()), "a cell past 100 characters"
    assert all(0 < len(a.what) <= 80 for a in ADVISORIES), "an advisory without a short `what`"
