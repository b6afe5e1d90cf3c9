"""The docs hold together: every relative link and #anchor of every tracked Markdown file resolves;
the command blocks an operator copies first (README.md, README.zh-CN.md and "The first hour" of
docs/deploy-ascend.md and its Chinese page) pass shellcheck, name files, make targets, overlays,
flags and compose variables that exist, and mark each line that needs Docker or an NPU, which the
operator checklist then covers; the Chinese pages carry the English pages' commands exactly (their
comments may be translated: the README, and the first hour, mirrors and Kubernetes of the deployment
guide); every repository path a page or an env file's or script's comment names exists; no file
speaks of how the kit was made; the English pages stay within a size a reader takes in. The unit
tier: no server, no engine; shellcheck from .venv-lint (`make lint-tools`).
"""

from __future__ import annotations

import functools
import re
import shlex
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from support.containers import ASCEND_FIRST_HOUR, CHOICES, CPU_WALK, README_CURL
from support.server import REPO

TRACKED = sorted(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.split())
MARKDOWN = [name for name in TRACKED if name.endswith(".md")]
DEPLOY = "docs/deploy-ascend.md"
FIRST_HOUR = "## The first hour"
# The pages whose command blocks are checked, and the section of each (None: the whole file).
COMMAND_PAGES = {"README.md": None, "README.zh-CN.md": None, DEPLOY: FIRST_HOUR,
                 "docs/deploy-ascend.zh-CN.md": None}
# The Chinese pages and the English text whose commands they carry: the English page's sections
# (None: the whole file), in the order the Chinese page gives them.
TRANSLATIONS = {"README.zh-CN.md": ("README.md", (None,)),
                "docs/deploy-ascend.zh-CN.md": (DEPLOY, (FIRST_HOUR, "### Mirrors", "## Kubernetes"))}
# The marker of a command line that needs the NPU host or a Docker engine: a comment starting with it.
MARKER = re.compile(r"\s+#\s*\[(npu|docker)\](.*)$")
CHECKLIST = "## Operator checklist"

FENCE = re.compile(r"^(```|~~~)(\w*)[^\n]*\n(.*?)^\1\s*$", re.S | re.M)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def read(name: str) -> str:
    return (REPO / name).read_text(encoding="utf-8")


def without_code(text: str) -> str:
    """The Markdown outside fenced blocks and inline code (links there are not links)."""
    text = FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup and link targets dropped, lower case, every
    character that is not a letter, mark, number, connector, hyphen or space removed (CJK stays),
    spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = "".join(c for c in text if c in "- " or unicodedata.category(c)[0] in "LMN" or c == "_")
    return kept.replace(" ", "-")


@functools.cache
def anchors(name: str) -> frozenset[str]:
    """Every anchor of a Markdown file: heading slugs (repeats get -1, -2, ... as on GitHub) and
    explicit <a name/id> anchors."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", read(name))):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", read(name)))
    return frozenset(found)


def test_slug_follows_githubs_rules() -> None:
    assert slug("Mirrors (镜像加速)") == "mirrors-镜像加速"
    assert slug("The CPU environment (`make venv`)") == "the-cpu-environment-make-venv"
    assert slug("Eight cards on one server (一台 8 卡服务器)") == "eight-cards-on-one-server-一台-8-卡服务器"
    assert slug("第一个小时：从裸机到冒烟测试") == "第一个小时从裸机到冒烟测试"
    assert slug("Operator checklist: what only a machine with Docker and an NPU can confirm") == (
        "operator-checklist-what-only-a-machine-with-docker-and-an-npu-can-confirm")


def links(name: str) -> list[str]:
    return [m.group(1) for m in LINK.finditer(without_code(read(name)))]


@pytest.mark.parametrize("name", MARKDOWN)
def test_every_relative_link_and_anchor_resolves(name: str) -> None:
    broken = []
    for target in links(name):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not this repository's
            continue
        path, _, anchor = target.partition("#")
        file = (REPO / name).parent / path if path else REPO / name
        if not file.resolve().exists():
            broken.append(f"{target}: no file {file.relative_to(REPO) if file.is_relative_to(REPO) else file}")
            continue
        if anchor and file.suffix == ".md":
            rel = str(file.resolve().relative_to(REPO.resolve()))
            if anchor not in anchors(rel):
                broken.append(f"{target}: no heading with anchor #{anchor} in {rel}")
    assert not broken, f"{name}: " + "; ".join(broken)


def section(text: str, heading: str | None) -> str:
    """From the heading line that starts with `heading` to the next heading of its level or a higher
    one (so "### Mirrors" ends at the next "## " too); `#` lines inside fenced blocks are comments."""
    if heading is None:
        return text
    fences = [m.span() for m in FENCE.finditer(text)]
    heads = [m for m in HEADING.finditer(text) if not any(a <= m.start() < b for a, b in fences)]
    start = next((m for m in heads if m.group(0).startswith(heading)), None)
    assert start, f"no heading {heading!r}"
    level = len(heading.split()[0])
    end = next((m.start() for m in heads if m.start() > start.start() and len(m.group(1)) <= level), len(text))
    return text[start.start():end]


def command_blocks(name: str, heading: str | None) -> list[str]:
    return [m.group(3) for m in FENCE.finditer(section(read(name), heading))
            if m.group(2) in ("bash", "sh", "shell")]


def command_lines(block: str) -> list[tuple[str, str]]:
    """(command, marker) per line: full-line comments dropped, a trailing comment cut (the blocks
    put no `#` inside their commands)."""
    out = []
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        marker = MARKER.search(line)
        command = re.sub(r"\s+#.*$", "", line).rstrip()
        out.append((command, marker.group(1) if marker else ""))
    return out


def test_the_command_pages_have_command_blocks() -> None:
    for name, heading in COMMAND_PAGES.items():
        assert command_blocks(name, heading), f"{name} {heading or ''}: no bash block"
    first = re.search(r"^## .*$", read(DEPLOY), re.M).group(0)
    assert first == FIRST_HOUR, f"docs/deploy-ascend.md opens with {first!r}, not the first hour"


@pytest.mark.parametrize("zh", sorted(TRANSLATIONS))
def test_the_chinese_page_has_the_english_commands(zh: str) -> None:
    english, headings = TRANSLATIONS[zh]
    want = [command_lines(b) for heading in headings for b in command_blocks(english, heading)]
    have = [command_lines(b) for b in command_blocks(zh, None)]
    assert len(have) == len(want), f"{zh} has {len(have)} command blocks, {english}'s {headings} {len(want)}"
    for i, (zh_block, en_block) in enumerate(zip(have, want)):
        assert zh_block == en_block, f"{zh}, block {i + 1}: its commands differ from {english}'s (comments aside)"


def lint_tool(name: str) -> str:
    for folder in (REPO / ".venv-lint" / "bin", Path(sys.executable).parent):
        if (folder / name).exists():
            return str(folder / name)
    found = shutil.which(name)
    assert found, f"{name} not found: run `make lint-tools` (requirements/lint.txt pins it)"
    return found


@pytest.mark.parametrize("name", sorted(COMMAND_PAGES))
def test_command_blocks_pass_shellcheck(name: str, tmp_path: Path) -> None:
    for i, block in enumerate(command_blocks(name, COMMAND_PAGES[name])):
        script = tmp_path / f"block{i}.sh"
        script.write_text("#!/bin/bash\n" + block)
        result = subprocess.run([lint_tool("shellcheck"), "--severity=style", str(script)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{name}, block {i + 1}:\n{block}\n{result.stdout}{result.stderr}"


def needs_a_marker(command: str) -> bool:
    """Docker, npu-smi, the device nodes or the driver's files: not on a plain machine."""
    return bool(re.match(r"(\w+=\S+\s+)*(sudo\s+)?(docker|npu-smi)\b", command)
                or "/dev/davinci" in command or "/usr/local/Ascend" in command)


@pytest.mark.parametrize("name", sorted(COMMAND_PAGES))
def test_lines_that_need_docker_or_an_npu_are_marked_and_in_the_checklist(name: str) -> None:
    """Marked lines need an operator's machine, so the checklist covers each; the CPU walk's lines
    need Docker only, and the container phase runs them here (tests/test_containers.py)."""
    checklist = " ".join(section(read(DEPLOY), CHECKLIST).split())
    for block in command_blocks(name, COMMAND_PAGES[name]):
        for command, marker in command_lines(block):
            if needs_a_marker(command):
                assert marker, f"{name}: `{command}` needs Docker or an NPU: mark it # [docker] or # [npu]"
            if marker and command not in CPU_WALK.values():
                assert " ".join(command.split()) in checklist, (
                    f"{name}: `{command}` is marked [{marker}]: the operator checklist must cover it")


def documented_commands(name: str, heading: str | None = None) -> set[str]:
    """The commands a page gives: its bash blocks' lines, its inline code, and for compose.yaml the
    command lines of its header (`#   command   # comment`)."""
    text = read(name)
    if name == "compose.yaml":
        header = text[:text.index("\nname:")]
        return {re.sub(r"\s+#.*$", "", line[4:]).strip() for line in header.splitlines() if line.startswith("#   ")}
    text = section(text, heading)
    blocks = {command for block in command_blocks(name, heading) for command, _ in command_lines(block)}
    return blocks | set(re.findall(r"`([^`\n]+)`", FENCE.sub("", text)))


# Where each documented walk is given: the container phase runs the CPU walk, the compose tests run
# the Ascend first hour and the choices through `docker compose config` (tests/support/containers.py).
WALK_PAGES = {
    "CPU walk": (CPU_WALK, ["README.md", "README.zh-CN.md", DEPLOY, "compose.yaml"]),
    "Ascend first hour": (ASCEND_FIRST_HOUR, ["README.md", "README.zh-CN.md", DEPLOY, "docs/deploy-ascend.zh-CN.md",
                                              "compose.yaml"]),
    "choices": (CHOICES, ["README.md", "README.zh-CN.md", DEPLOY, "docs/deploy-ascend.zh-CN.md", "compose.yaml"]),
}


@pytest.mark.parametrize("walk", sorted(WALK_PAGES))
def test_the_documented_walks_are_the_commands_the_tests_run(walk: str) -> None:
    commands, pages = WALK_PAGES[walk]
    for name in pages:
        heading = FIRST_HOUR if name == DEPLOY and walk != "CPU walk" else None
        missing = [c for c in commands.values() if c not in documented_commands(name, heading)]
        assert not missing, f"{name} lacks these lines of the {walk} (tests/support/containers.py): {missing}"
    for name in ("README.md", "README.zh-CN.md"):
        assert README_CURL in read(name), f"{name}: the curl the container phase runs"


def compose_variables() -> set[str]:
    return set(re.findall(r"\$\{(\w+)", read("compose.yaml")))


@functools.cache
def help_text(script: str, mode: str) -> str:
    args = [sys.executable, script, *([mode] if mode else []), "--help"]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60).stdout


# Paths in the commands that are not this repository's: the host's, the image's, what they create.
OUTSIDE = ("/dev/", "/usr/", "/opt/", "./models", "http://", "https://", ".env", "/data/", ".venv/")
# Words that look like paths but are no files: an image of a registry, whose first part is a host
# name (`quay.nju.edu.cn/ascend/vllm-ascend`), and in kubectl and helm commands a cluster object
# (`job/minicpmv-smoke`, `deploy/minicpmv`) or a chart of a Helm repository.
IMAGE = re.compile(r"[\w-]+(?:\.[\w-]+)+/\S+")
CLUSTER_NAME = re.compile(r"(?:cronjob|deploy|deployment|job|pod|svc|service|hpa)/[\w.-]+"
                          r"|prometheus-community/[\w.-]+")


@pytest.mark.parametrize("name", sorted(COMMAND_PAGES))
def test_what_the_commands_name_exists(name: str) -> None:
    makefile = read("Makefile")
    missing = []
    for block in command_blocks(name, COMMAND_PAGES[name]):
        for command, _ in command_lines(block):
            try:
                words = shlex.split(command)
            except ValueError:  # a multi-line curl body: its first line is not a whole command
                words = command.split()
            for word in words:
                word = word.split("=", 1)[-1] if re.match(r"[A-Z_]+=", word) else word
                if IMAGE.fullmatch(word) or words[:1] in (["kubectl"], ["helm"]) and CLUSTER_NAME.fullmatch(word):
                    continue
                if "/" in word and not word.startswith(OUTSIDE) and not word.startswith(("{", "-", "'")) \
                        and re.fullmatch(r"[\w./-]+", word) and not (REPO / word).exists():
                    missing.append(f"file {word}")
            for var in re.findall(r"(?:^|\s)([A-Z][A-Z0-9_]+)=\S+\s+docker compose", command):
                if var not in compose_variables():
                    missing.append(f"compose variable {var}")
            make = re.match(r"(?:\w+=\S+\s+)*make\s+([\w-]+)", command)
            if make and not re.search(rf"^{make.group(1)}:", makefile, re.M):
                missing.append(f"make target {make.group(1)}")
            tool = re.search(r"((?:healthcheck|scripts)/\w+\.py)(?:\s+(live|ready|smoke))?", command)
            if tool:
                for flag in re.findall(r"\s(--[a-z][\w-]*)", command):
                    if flag not in help_text(tool.group(1), tool.group(2) or ""):
                        missing.append(f"flag {flag} of {tool.group(1)}")
    # The front doors' prose names commands too (the targets, the fleet, Kubernetes): their
    # repository paths and compose variables.
    if name.startswith("README"):
        for span in re.findall(r"`([^`\n]+)`", FENCE.sub("", read(name))):
            for word in re.findall(r"(?<![\w./])(?:deploy|scripts|env|healthcheck|examples|requirements)/[\w./-]*\w", span):
                if not (REPO / word).exists():
                    missing.append(f"file {word}")
        for var in re.findall(r"`([A-Z][A-Z0-9_]+)=[\w.-]+ docker compose", read(name)):
            if var not in compose_variables():
                missing.append(f"compose variable {var}")
    assert not missing, f"{name}: " + ", ".join(sorted(set(missing)))


def test_each_generated_table_of_the_front_door_lives_in_one_page() -> None:
    """The settings and API feature tables each live in exactly one page (the registry's)."""
    import doc_tables

    for table in ("settings-table", "features-table"):
        files = doc_tables.by_name(table).files
        assert len(files) == 1, f"{table} is in {files}: one page, the others link to it"
        holders = [n for n in MARKDOWN if f"<!-- {table}:start" in read(n)]
        assert holders == list(files), holders


def test_the_front_doors_are_short_and_link_each_other() -> None:
    readme, zh = read("README.md"), read("README.zh-CN.md")
    assert len(readme.splitlines()) <= 150 and len(readme.encode()) <= 12 * 1024
    assert "README.zh-CN.md" in readme.splitlines()[0] and "README.md" in zh.splitlines()[0]
    first_block = readme.index("```bash")
    assert readme[:first_block].count("\n") < 60 and readme.index("## On Ascend") < readme.index("## On a CPU")


# How a fact was found is history (git keeps it); a reader has neither the issue tracker nor the
# machines the runs were made on. Upstream references keep their `#`: "vLLM issue #51562".
MAKING = {
    "an issue number of this project": re.compile(r"\b[Ii]ssues? \d+\b"),
    "a work session": re.compile(r"\b(?:this|(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|"
                                 r"eleventh|twelfth|[a-z]*teenth|[a-z]*tieth)) session\b|\bsession of 20\d\d\b", re.I),
    "a path of the machine a run was made on": re.compile(r"/work/|/root/|<scratch>|<checkout>"),
}
# Text files: everything tracked but locks, images and this check's own patterns.
WORDS_SKIP = re.compile(r"\.(lock|png|jpg|ico)$|^tests/test_docs\.py$")


def making_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, line) for each line that speaks of how the kit was made."""
    return [(number, what, line.strip()) for number, line in enumerate(text.splitlines(), 1)
            for what, pattern in MAKING.items() if pattern.search(line)]


def test_the_making_check_sees_a_planted_line() -> None:
    planted = "Measured (issue 19, the twelfth session): `d=/work/ci3; git clone -q /work/main $d`."
    assert [what for _, what, _ in making_lines(planted)] == list(MAKING)
    upstream = "Since vLLM #51565 (the fix of vLLM issue #51562); every member of that process session."
    assert making_lines(upstream) == []


def test_no_file_speaks_of_how_it_was_made() -> None:
    """Docs, comments, docstrings, requirements headers and test names state what is true now."""
    found = []
    for name in TRACKED:
        path = REPO / name
        if WORDS_SKIP.search(name) or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{name}:{number}: {what}: {line[:100]}" for number, what, line in making_lines(text)]
    assert not found, "\n".join(found)


# The repository's own top-level folders: a word that starts with one of them names a file of the kit.
OWN_FOLDERS = sorted({name.split("/", 1)[0] for name in TRACKED if "/" in name})
OWN_PATH = re.compile(rf"(?<![\w./~-])(?:{'|'.join(map(re.escape, OWN_FOLDERS))})/[\w./-]*\w")
# Files whose comments name the kit's files to an operator: the env files and the scripts.
COMMENTED = re.compile(r"(^|/)[\w.-]+\.env$|^(scripts|healthcheck|deploy/docker)/.+\.(py|sh)$")


def missing_paths(spans: list[str]) -> list[str]:
    """The repository paths named in these spans that do not exist (globs and placeholders aside)."""
    missing = []
    for span in spans:
        if re.search(r"[*<>{}]|\.\.\.", span) or span.startswith("kubectl"):  # globs, placeholders, cluster names
            continue
        missing += [word for word in OWN_PATH.findall(span) if not (REPO / word).exists()]
    return missing


def test_the_path_check_sees_a_planted_path() -> None:
    assert missing_paths(["see `docs/no-such-page.md`", "env/ascend.env", "deploy/k8s/*/kustomization.yaml",
                          "https://example.com/docs/x", "/usr/local/Ascend/driver"]) == ["docs/no-such-page.md"]


def test_every_repository_path_a_page_or_comment_names_exists() -> None:
    """Backticked paths in every Markdown file, and the paths in the env files' and scripts'
    comments, name files the repository has (a moved file leaves no stale pointer)."""
    found = []
    for name in MARKDOWN:
        found += [f"{name}: {word}" for word in missing_paths(re.findall(r"`([^`\n]+)`", read(name)))]
    for name in filter(COMMENTED.search, TRACKED):
        comments = [line.split("#", 1)[1] for line in read(name).splitlines() if "#" in line]
        found += [f"{name}: {word}" for word in missing_paths(comments)]
    assert not found, "\n".join(sorted(set(found)))


# What a reader can take in: the English pages (the Chinese ones are not counted, at 3 bytes a
# character), no single page too long to read, and the maintainer's page short.
ENGLISH_MARKDOWN_BYTES = 250 * 1024
PAGE_BYTES = 40 * 1024
DEVELOPMENT_BYTES = 12 * 1024


def test_the_docs_stay_within_their_budget() -> None:
    sizes = {name: len(read(name).encode()) for name in MARKDOWN if "zh-CN" not in name}
    assert sum(sizes.values()) <= ENGLISH_MARKDOWN_BYTES, f"English Markdown {sum(sizes.values())} bytes"
    assert not {n: s for n, s in sizes.items() if s > PAGE_BYTES}, "pages over 40 KB"
    assert sizes["docs/development.md"] <= DEVELOPMENT_BYTES
