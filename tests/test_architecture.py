"""The import rules of docs/architecture.md ("Import rules"), checked on the code's own imports (parsed with `ast`,
nothing is imported or run): a change that breaks a rule fails here, with the file, the line and
the rule. Every import counts, also those inside functions.

The checker is also run on a few made-up modules that break each rule (test_each_rule_catches...),
so a rule that silently stopped matching anything would show; and the doc states every rule in the
words a failure prints (test_the_doc_states_every_rule). Module paths the code writes in strings
(`--middleware minicpmv_ascend.server.access.AccessControl`, a registry's "module:function"), which
no import shows, are checked against the modules and their top-level names.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import sys

import pytest

from support import REPO

PACKAGE, PLUGIN = "minicpmv_ascend", "minicpmv_ascend_plugin"
# What vLLM loads into its API server: the access control, request guard and tool-call middleware, and
# the media fetcher the plugin calls. The settings emit their names, so settings import them.
SERVER = f"{PACKAGE}.server"
# What runs on an Ascend host's own Python (3.7), standard library only: these and their imports.
HOST_MODULES = {f"{PACKAGE}.probes"}
HOST_SCRIPTS = {"healthcheck/probe.py": (3, 6), "scripts/verify_model_dir.py": (3, 6)}  # parse on 3.6 too
# The plugin reaches into this package only through these documented entry points.
PLUGIN_MAY_IMPORT = {f"{SERVER}.media_urls"}
DOC = REPO / "docs" / "architecture.md"
# The rules as a failure words them; docs/architecture.md, "Import rules", states each in these words.
RULES = {
    "common": "common modules import only the standard library",
    "host": "the host's tools import only the standard library and minicpmv_ascend.common",
    "tools": "the runtime never imports the tools",
    "settings": "settings import of the runtime only the server modules they configure",
    "in_server": "the server package imports of this package only itself and common",
    "plugin": "the plugin imports this package only through minicpmv_ascend.server.media_urls",
    "public": "outside the plugin, only its public API (minicpmv_ascend_plugin.__all__)",
    "strings": "a module path written in a string names a module of this repository and a name it defines",
}
# A module path in a string: `minicpmv_ascend.server.access.AccessControl`, `minicpmv_ascend.settings.docs:markdown_table`.
MODULE_PATH = re.compile(rf"(?<![\w.])((?:{PLUGIN}|{PACKAGE})(?:\.\w+)+)(?::(\w+))?")


@dataclasses.dataclass(frozen=True)
class Import:
    module: str  # the importing module ("scripts/x.py" for a script)
    target: str  # the imported module, absolute
    names: tuple[str, ...]  # `from target import names` (empty for `import target`)
    line: int


def module_name(path: pathlib.Path) -> str:
    """minicpmv_ascend.settings.plan for src/minicpmv_ascend/settings/plan.py; scripts keep their path."""
    rel = path.relative_to(REPO)
    for root in ("src", "plugin"):
        if rel.parts[0] == root and rel.parts[1] in (PACKAGE, PLUGIN):
            parts = rel.with_suffix("").parts[1:]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return str(rel)


def sources() -> dict[str, str]:
    files = [*(REPO / "src" / PACKAGE).rglob("*.py"), *(REPO / "plugin" / PLUGIN).rglob("*.py"),
             *(REPO / "scripts").glob("*.py"), REPO / "healthcheck" / "probe.py", REPO / "entrypoint.py"]
    return {module_name(f): f.read_text(encoding="utf-8") for f in files}


def imports_of(module: str, source: str) -> list[Import]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, (), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:  # relative: from . import x, from ._base import y
                parts = module.split(".") if is_package(module) else module.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                target = ".".join([*parts, *([node.module] if node.module else [])])
            found.append(Import(module, target, tuple(a.name for a in node.names), node.lineno))
    return found


def is_package(module: str) -> bool:
    return any((REPO / root / module.replace(".", "/") / "__init__.py").is_file() for root in ("src", "plugin"))


def inside(target: str, *prefixes: str) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def allowed(imp: Import, *prefixes: str) -> bool:
    """Whether everything `imp` imports of this package lies inside `prefixes`: the module it names,
    or, for `from package import a, b`, each of a and b (one outside is enough to break a rule)."""
    if not inside(imp.target, PACKAGE) or inside(imp.target, *prefixes):
        return True
    return bool(imp.names) and all(inside(f"{imp.target}.{n}", *prefixes) for n in imp.names)


def is_stdlib(target: str) -> bool:
    return target.split(".")[0] in sys.stdlib_module_names or target == "__future__"


def plugin_public_names() -> set[str]:
    tree = ast.parse((REPO / "plugin" / PLUGIN / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value)) | {"__version__"}
    raise AssertionError("minicpmv_ascend_plugin has no __all__")


def plugin_attributes(source: str) -> list[tuple[str, int]]:
    """Attributes read off `import minicpmv_ascend_plugin [as alias]`."""
    tree = ast.parse(source)
    aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
               if a.name == PLUGIN}
    return [(n.attr, n.lineno) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases]


def violations(code: dict[str, str], plugin_public: set[str]) -> list[str]:
    """Every broken rule in `code` ({module or script path: source}), as 'where: what (rule)'."""
    found = []

    def bad(imp: Import, rule: str) -> None:
        found.append(f"{imp.module}:{imp.line} imports {imp.target}{' ' + ','.join(imp.names) if imp.names else ''}"
                     f" ({rule})")

    for module, source in code.items():
        own_plugin_code = inside(module, PLUGIN)
        for imp in imports_of(module, source):
            if inside(module, f"{PACKAGE}.common"):
                if not is_stdlib(imp.target):
                    bad(imp, RULES["common"])
            elif module in HOST_MODULES or module in HOST_SCRIPTS:
                if not (is_stdlib(imp.target) or inside(imp.target, f"{PACKAGE}.common", f"{PACKAGE}.probes")):
                    bad(imp, RULES["host"])
            if inside(module, PACKAGE) and not inside(module, f"{PACKAGE}.tools") and inside(imp.target, f"{PACKAGE}.tools"):
                bad(imp, RULES["tools"])
            if inside(module, f"{PACKAGE}.settings") and not allowed(
                    imp, f"{PACKAGE}.settings", f"{PACKAGE}.common", f"{PACKAGE}.vllm_source", SERVER):
                bad(imp, RULES["settings"])
            if inside(module, SERVER) and not allowed(imp, SERVER, f"{PACKAGE}.common"):
                bad(imp, RULES["in_server"])
            if own_plugin_code and not allowed(imp, *PLUGIN_MAY_IMPORT):
                bad(imp, RULES["plugin"])
            if not own_plugin_code and inside(imp.target, PLUGIN):
                private = imp.target != PLUGIN or any(n not in plugin_public for n in imp.names)
                if private:
                    bad(imp, RULES["public"])
        if not inside(module, PLUGIN):
            for attr, line in plugin_attributes(source):
                if attr not in plugin_public:
                    found.append(f"{module}:{line} uses {PLUGIN}.{attr} ({RULES['public']})")
    return found


def top_level_names(source: str) -> set[str]:
    """What a module defines at its top level: functions, classes, assignments, imports."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def string_path_problems(code: dict[str, str], modules: dict[str, str]) -> list[str]:
    """Module paths written in the string literals of `code` that name no module of `modules`
    ({module: source}), or a name that module does not define at its top level."""
    found = []
    for module, source in code.items():
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            for match in MODULE_PATH.finditer(node.value):
                parts, attr = match.group(1).split("."), match.group(2)
                cut = next((i for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules), 0)
                named = [*parts[cut:cut + 1], *([attr] if attr else [])]
                if not cut or (named and named[0] not in top_level_names(modules[".".join(parts[:cut])])):
                    found.append(f"{module}:{node.lineno} names {match.group(0)} ({RULES['strings']})")
    return found


def python37_problems(code: dict[str, str]) -> list[str]:
    """Modules that run on the host's Python must parse as 3.7 (3.6 for the shims that say so) and
    keep their annotations lazy."""
    found = []
    for module, source in code.items():
        version = HOST_SCRIPTS.get(module) or ((3, 7) if module in HOST_MODULES or inside(module, f"{PACKAGE}.common")
                                               else None)
        if version is None:
            continue
        try:
            ast.parse(source, feature_version=version)
        except SyntaxError as err:
            found.append(f"{module}:{err.lineno}: not Python {version[0]}.{version[1]} syntax ({err.msg})")
        if version == (3, 7) and "from __future__ import annotations" not in source and "->" in source:
            found.append(f"{module}: annotations without `from __future__ import annotations` (list[str] fails on 3.7)")
        for removed in (".removeprefix(", ".removesuffix("):  # 3.9
            if removed in source:
                found.append(f"{module}: {removed[1:-1]} is Python 3.9+")
    return found


def cycles(code: dict[str, str]) -> list[list[str]]:
    """Import circles among this package's modules (module-level imports: the ones that run on import)."""
    graph: dict[str, set[str]] = {m: set() for m in code if inside(m, PACKAGE)}
    for module in graph:
        for node in ast.parse(code[module]).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for imp in imports_of(module, ast.unparse(node)):
                    for target in [imp.target] + [f"{imp.target}.{n}" for n in imp.names]:
                        if target in graph and target != module:
                            graph[module].add(target)
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    # A package's __init__ importing its own modules is not a circle.
    return [c for c in found if not any(b.startswith(a + ".") or a.startswith(b + ".") for a, b in zip(c, c[1:]))]


# --------------------------------------------------------------------------------------------


def test_the_code_keeps_the_import_rules() -> None:
    assert violations(sources(), plugin_public_names()) == []


def test_module_paths_in_strings_exist() -> None:
    code = sources()
    assert string_path_problems(code, code) == []


def test_a_module_path_in_a_string_that_names_nothing_is_found() -> None:
    code = sources()
    for written in ("minicpmv_ascend.access.AccessControl", "minicpmv_ascend.tools.doc_tables:main",
                    "minicpmv_ascend.server.access.AccessControlWithoutKey", "minicpmv_ascend_plugin._base"):
        problems = string_path_problems({"scripts/x.py": f"HELP = 'run {written}'\n"}, code)
        assert problems == [f"scripts/x.py:1 names {written} ({RULES['strings']})"], written
    assert string_path_problems({"scripts/x.py": "HELP = 'minicpmv_ascend.server.access.AccessControl'\n"}, code) == []


def test_what_runs_on_the_hosts_python_is_python_37() -> None:
    assert python37_problems(sources()) == []


def test_the_import_graph_has_no_cycles() -> None:
    assert cycles(sources()) == []


@pytest.mark.parametrize(("module", "source", "rule"), [
    (f"{PACKAGE}.launcher", "from minicpmv_ascend.tools import bench", "tools"),
    (f"{PACKAGE}.settings.plan", "def f():\n    from minicpmv_ascend import launcher", "settings"),
    (f"{PACKAGE}.settings.plan", "from minicpmv_ascend import probes", "settings"),
    (f"{PACKAGE}.settings.plan", "from minicpmv_ascend import vllm_source, launcher", "settings"),
    (f"{SERVER}.tool_calls", "from minicpmv_ascend.settings import SETTINGS", "in_server"),
    (f"{SERVER}.tool_calls", "from minicpmv_ascend import vllm_source", "in_server"),
    (f"{SERVER}.access", "def f():\n    from minicpmv_ascend import launcher", "in_server"),
    (f"{PACKAGE}.common.http", "import yaml", "common"),
    (f"{PACKAGE}.common.http", "from minicpmv_ascend.server import media_urls", "common"),
    (f"{PACKAGE}.probes", "from minicpmv_ascend.settings import SETTINGS", "host"),
    (f"{PLUGIN}.patches.media.file_url_400", "from minicpmv_ascend import settings", "plugin"),
    (f"{PLUGIN}.patches.media.public_media_urls", "from minicpmv_ascend.server import media_urls, access", "plugin"),
    ("scripts/ascend_check.py", "from minicpmv_ascend_plugin.core.vllm_code import dist_version", "public"),
    ("scripts/ascend_check.py", "import minicpmv_ascend_plugin as p\np._decisions", "public"),
])
def test_each_rule_catches_its_violation(module, source, rule) -> None:
    found = violations({module: source}, {"register", "report"})
    assert len(found) == 1 and RULES[rule] in found[0], found


def test_the_doc_states_every_rule() -> None:
    """docs/architecture.md, "Import rules", words each rule as a failure prints it."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Import rules"):]
    section = " ".join(section.replace("**", "").split())  # bold and line breaks do not count
    assert [rule for rule in RULES.values() if rule not in section] == []


def test_the_python37_and_circle_checks_catch_their_violations() -> None:
    assert python37_problems({f"{PACKAGE}.common.x": "if (n := 1):\n    pass\n"})
    assert python37_problems({f"{PACKAGE}.probes": "def f() -> list[str]:\n    return 'a'.removeprefix('b')\n"})
    looped = {f"{PACKAGE}.a": "from minicpmv_ascend import b", f"{PACKAGE}.b": "import minicpmv_ascend.a"}
    assert cycles(looped) == [[f"{PACKAGE}.a", f"{PACKAGE}.b", f"{PACKAGE}.a"]]
