"""Shared helpers of the deployment tests (tests/test_deploy_*.py); this module has no tests.

Readers of the deployment files: env files (the `KEY=VALUE` subset that docker, compose and
kustomize all read the same way), Dockerfiles (instructions, exec-form commands, COPY sources), the
linters installed by `make lint-tools`, and kustomize rendering through kubectl.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml

from support import REPO

LINT_BIN = REPO / ".venv-lint" / "bin"
# The one table of Ascend targets (deploy/ascend-targets.yaml): the Dockerfile, compose, the
# overlays and the docs are tested against it.
TARGETS_TABLE = yaml.safe_load((REPO / "deploy" / "ascend-targets.yaml").read_text(encoding="utf-8"))
K8S = REPO / "deploy" / "k8s"
ENV_DIR = REPO / "env"
# The Ascend servers' settings, one file for every target: the Kubernetes base's ConfigMap source,
# and env/ascend.env (a symlink to it) for compose and docker run. The CPU image's: env/cpu.env.
ASCEND_ENV = K8S / "base" / "serving.env"
CPU_ENV = ENV_DIR / "cpu.env"
APP_DIR = "/opt/minicpmv-ascend"  # where both images put the files orchestrators call by path
TARGETS = ("a2", "a3")
# overlay -> the image variant (a2, a3) it deploys
OVERLAYS = {"a2": "a2", "a3": "a3", "cce": "a2", "cce-a3": "a3", "autoscaling": "a2"}
# The Volcano component of each target (MindCluster clusters; CCE has its own device plugin).
VOLCANO = {"a2": "volcano", "a3": "volcano-a3"}
# Components combined per overlay ("+components"): all that go together. storage and model-hostpath
# exclude each other (one patches the claim the other deletes): "+storage" renders the first.
COMPONENTS = ("servicemonitor", "driver-hostpath", "model-hostpath", "node-arch")
STORAGE_COMPONENTS = ("storage", "node-arch")
# The base's Job templates (suspended CronJobs: `kubectl create job --from=cronjob/<name>`).
JOB_TEMPLATES = ("minicpmv-download-weights", "minicpmv-smoke")

# Environment variables that the env files, compose and the Kubernetes server pods may set although
# they are not settings of the entrypoint: well-known runtime variables, each with why it is there.
RUNTIME_ENV_ALLOWLIST: dict[str, str] = {
    "ASCEND_RT_VISIBLE_DEVICES": "CANN runtime: which NPUs the process may use (logical ids); "
                                 "the settings module also counts them for tensor_parallel_size",
    "ASCEND_VISIBLE_DEVICES": "Ascend Docker Runtime: which host NPUs to inject (documented "
                              "alternative to explicit --device lines)",
    "PYTORCH_NPU_ALLOC_CONF": "torch_npu caching allocator (expandable segments), vllm-ascend tutorials",
    "TASK_QUEUE_ENABLE": "torch_npu asynchronous dispatch queue, set by the vllm-ascend image too",
    "OMP_NUM_THREADS": "OpenMP threads per process, vllm-ascend tutorials",
    "OMP_PROC_BIND": "OpenMP thread pinning, vllm-ascend tutorials",
    "HCCL_OP_EXPANSION_MODE": "HCCL collectives on the AI Vector cores, vllm-ascend tutorials",
    "VLLM_CPU_KVCACHE_SPACE": "vLLM CPU build: GiB of KV cache (its gpu_memory_utilization)",
    "VLLM_CPU_OMP_THREADS_BIND": "vLLM CPU build: which cores its OpenMP threads use",
    "HF_HUB_OFFLINE": "huggingface_hub: never contact a hub (weights are local)",
    "VLLM_USE_MODELSCOPE": "vLLM: model ids resolve on ModelScope (the settings module reads it too)",
}


# --------------------------------------------------------------------------------------------
# Settings declared by the entrypoint
# --------------------------------------------------------------------------------------------


def declared_env_vars() -> set[str]:
    """Every env var the entrypoint reads: one per setting, plus CONFIG_FILE."""
    from minicpmv_ascend import settings

    return {s.env for s in settings.SETTINGS} | {settings.CONFIG_FILE_ENV}


def project_image(variant: str, tag: str | None = None) -> str:
    """This project's image for a variant (a2, a3) of a target (default: the table's default):
    `minicpmv-ascend:<vllm-ascend tag>-<variant>`, as compose, the overlays and the docs name it."""
    return f"minicpmv-ascend:{tag or TARGETS_TABLE['default']}-{variant}"


def allowed_env_vars() -> set[str]:
    return declared_env_vars() | set(RUNTIME_ENV_ALLOWLIST)


# --------------------------------------------------------------------------------------------
# Env files
# --------------------------------------------------------------------------------------------

ENV_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


@dataclasses.dataclass
class EnvEntry:
    key: str
    value: str
    line: int
    comment: list[str]  # the comment lines directly above (its documentation)


def read_env_file(path: pathlib.Path) -> list[EnvEntry]:
    """Parse an env file in the subset every consumer agrees on; fail on anything else.

    `docker run --env-file` keeps quotes literally while compose strips them, and compose expands
    `$VAR` where docker does not: so no quotes, no `$`, no `export`, no inline comments.
    """
    entries: list[EnvEntry] = []
    comment: list[str] = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.rstrip()
        if not line:
            comment = []
            continue
        if line.startswith("#"):
            comment.append(line)
            continue
        match = ENV_LINE.match(line)
        assert match, f"{path.name}:{number}: not a KEY=VALUE line: {raw!r}"
        key, value = match.groups()
        assert value == value.strip(), f"{path.name}:{number}: whitespace around the value of {key}"
        assert not value.startswith(("'", '"')), f"{path.name}:{number}: quoted value (docker keeps quotes)"
        assert "$" not in value, f"{path.name}:{number}: `$` in a value (compose would expand it)"
        assert " #" not in value, f"{path.name}:{number}: inline comment (docker keeps it as value)"
        entries.append(EnvEntry(key, value, number, list(comment)))
        # Consecutive assignments share the comment block above them (e.g. OMP_NUM_THREADS and
        # OMP_PROC_BIND): keep it until a blank line.
    return entries


def env_mapping(path: pathlib.Path) -> dict[str, str]:
    return {e.key: e.value for e in read_env_file(path)}


def env_files() -> list[pathlib.Path]:
    return sorted(ENV_DIR.glob("*.env"))


# What the vllm-ascend base image sets itself: its Dockerfile's ENV, the same from v0.23.0 to main
# (https://github.com/vllm-project/vllm-ascend/blob/v0.23.0/Dockerfile, and Dockerfile.a3).
VLLM_ASCEND_IMAGE_ENV = {"TASK_QUEUE_ENABLE": "1", "OMP_NUM_THREADS": "1"}


def restated_defaults(path: pathlib.Path, platform: str, model_dir: pathlib.Path) -> list[str]:
    """The lines of an env file that set nothing new, with why: an empty value (unset), a setting
    equal to its declared default (minicpmv_ascend.settings), or a runtime variable equal to what
    the server gets anyway, from the launcher (its plan's environment defaults for the platform) or
    from the image (its ENV, and the vllm-ascend base image's). `model_dir` stands in for a
    MODEL_PATH the file sets (the directory the container would mount)."""
    from minicpmv_ascend import settings

    entries = read_env_file(path)
    env = {e.key: e.value for e in entries if e.value}
    if "MODEL_PATH" in env:
        env["MODEL_PATH"] = str(model_dir)
    resolution = settings.resolve((), env)
    launcher = settings.build_plan(resolution, env, platform).env_defaults
    image = image_env(REPO / ("Dockerfile.cpu" if platform == "cpu" else "Dockerfile"))
    if platform == "ascend":
        image = {**VLLM_ASCEND_IMAGE_ENV, **image}
    by_env = {s.env: s for s in settings.SETTINGS}
    problems = []
    for e in entries:
        where = f"{path.name}:{e.line}: {e.key}={e.value}"
        setting = by_env.get(e.key)
        if not e.value:
            problems.append(f"{where}: an empty value means unset: remove the line")
        elif setting is not None and resolution[setting.name] == setting.default:
            problems.append(f"{where}: the default of `{setting.name}`: remove the line")
        elif launcher.get(e.key) == e.value:
            problems.append(f"{where}: the launcher sets it on {platform} already: remove the line")
        elif image.get(e.key) == e.value:
            problems.append(f"{where}: the image's ENV sets it already: remove the line")
    return problems


# --------------------------------------------------------------------------------------------
# Dockerfiles
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Instruction:
    name: str
    args: str
    line: int


def dockerfile_instructions(path: pathlib.Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    out: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        name, _, args = text.partition(" ")
        out.append(Instruction(name.upper(), args.strip(), start))
    return out


def exec_form(instruction: Instruction) -> list[str]:
    """The JSON array of an exec-form ENTRYPOINT / CMD / HEALTHCHECK CMD."""
    args = instruction.args
    if instruction.name == "HEALTHCHECK":
        args = args[args.index(" CMD ") + len(" CMD "):] if " CMD " in args else args
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), instruction
    return value


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last_from = max(i for i, ins in enumerate(instructions) if ins.name == "FROM")
    return instructions[last_from:]


def copy_map(instructions: list[Instruction]) -> dict[str, pathlib.Path]:
    """Image path -> repo path for every file the final stage COPYs from the build context."""
    mapping: dict[str, pathlib.Path] = {}
    for ins in instructions:
        if ins.name != "COPY":
            continue
        parts = [p for p in shlex.split(ins.args) if not p.startswith("--")]
        *sources, dest = parts
        for source in sources:
            src = REPO / source
            assert src.exists(), f"line {ins.line}: COPY source {source} does not exist in the repo"
            if dest.endswith("/"):
                mapping[dest + pathlib.PurePosixPath(source).name] = src
            else:
                mapping[dest] = src
    return mapping


def image_command(path: pathlib.Path) -> list[str]:
    """ENTRYPOINT + CMD of the final stage, as the container runtime joins them."""
    stage = final_stage(dockerfile_instructions(path))
    entrypoint = [exec_form(i) for i in stage if i.name == "ENTRYPOINT"][-1]
    cmds = [exec_form(i) for i in stage if i.name == "CMD"]
    return entrypoint + (cmds[-1] if cmds else [])


def image_env(path: pathlib.Path) -> dict[str, str]:
    """ENV of the final stage (KEY=VALUE form only; ${...} references left as written)."""
    env: dict[str, str] = {}
    for ins in final_stage(dockerfile_instructions(path)):
        if ins.name == "ENV":
            for token in shlex.split(ins.args):
                key, _, value = token.partition("=")
                env[key] = value
    return env


def stage_args(instructions: list[Instruction]) -> dict[str, str]:
    """The build arguments the final stage declares, with their defaults: what its RUN steps see as
    environment variables (Docker exports declared ARGs to RUN, not to the running container). A
    stage's `ARG NAME` without a value takes the default of the global ARG before the first FROM."""
    first_from = next(i for i, ins in enumerate(instructions) if ins.name == "FROM")
    defaults: dict[str, str] = {}
    for ins in instructions[:first_from]:
        if ins.name == "ARG":
            name, _, value = ins.args.partition("=")
            defaults[name.strip()] = value.strip().strip('"')
    declared: dict[str, str] = {}
    for ins in final_stage(instructions):
        if ins.name == "ARG":
            name, has_value, value = ins.args.partition("=")
            declared[name.strip()] = value.strip().strip('"') if has_value else defaults.get(name.strip(), "")
    return declared


def run_script(instruction: Instruction) -> str:
    """A RUN instruction's shell text, without its leading --mount=... options."""
    assert instruction.name == "RUN"
    words = instruction.args.split(" ")
    while words and words[0].startswith("--"):
        words.pop(0)
    return " ".join(words).strip()


_EXPANSION = re.compile(r"\$\{(\w+)(?::\+([^}]*))?\}|\$(\w+)")


def expand(text: str, variables: dict[str, str]) -> str:
    """The shell's ${VAR}, $VAR and ${VAR:+word} (the forms the Dockerfiles use), from `variables`."""
    def one(match: re.Match) -> str:
        name = match[1] or match[3]
        value = variables.get(name, "")
        if match[2] is not None:
            return expand(match[2], variables) if value else ""
        return value
    return _EXPANSION.sub(one, text)


SHELL_SEPARATORS = {"&&", "||", ";", "|", "(", ")"}


def shell_commands(script: str) -> list[tuple[dict[str, str], list[str]]]:
    """The simple commands of an (already expanded) shell script: (leading VAR=value assignments,
    argv). Redirections to /dev/null are dropped; anything fancier (other redirections, command
    substitution) is refused, so a test never misreads a step."""
    assert "$(" not in script and "`" not in script, f"command substitution in {script!r}"
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    commands, words = [], []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in SHELL_SEPARATORS:
            if words:
                commands.append(words)
            words = []
        elif token in (">", ">>", "2>", "&>"):
            assert tokens[i + 1] == "/dev/null", f"redirection to {tokens[i + 1]!r} in {script!r}"
            i += 1
        else:
            assert token not in ("<", "<<", ">&"), f"unsupported shell syntax {token!r} in {script!r}"
            words.append(token)
        i += 1
    if words:
        commands.append(words)
    out = []
    for argv in commands:
        assignments = {}
        while argv and re.fullmatch(r"[A-Za-z_]\w*=.*", argv[0]):
            name, _, value = argv.pop(0).partition("=")
            assignments[name] = value
        out.append((assignments, argv))
    return out


def to_host(argv: list[str], files: dict[str, pathlib.Path]) -> list[str]:
    """An image command line, runnable outside the container.

    Drops tini (outside a container nothing needs reaping), runs the image's Python as this test
    session's interpreter, and maps every image file to the repo file the image copied it from.
    """
    argv = list(argv)
    if argv[:2] == ["/usr/bin/tini", "--"]:
        argv = argv[2:]
    host = []
    for arg in argv:
        if arg in ("python", "python3"):
            host.append(sys.executable)
        elif arg.startswith(APP_DIR + "/"):
            assert arg in files, f"{arg} is used but no COPY puts it into the image"
            host.append(str(files[arg]))
        else:
            host.append(arg)
    return host


# --------------------------------------------------------------------------------------------
# Linters and kustomize (installed by `make lint-tools` into .venv-lint)
# --------------------------------------------------------------------------------------------


def lint_tool(name: str) -> str:
    path = LINT_BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found:
        return found
    pytest.fail(f"{name} is not installed: run `make lint-tools` (installs requirements/lint.txt "
                "into .venv-lint)")


def run_tool(*cmd: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout, cwd=REPO)


def render_kustomization(directory: pathlib.Path) -> list[dict]:
    """`kubectl kustomize` with its default load restrictor, as `kubectl apply -k` runs it: every
    file a kustomization names must lie in or below its directory (other kustomizations may be
    anywhere)."""
    result = run_tool(lint_tool("kubectl"), "kustomize", str(directory))
    assert result.returncode == 0, f"kustomize {directory}: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def components_of(overlay: str) -> tuple[str, ...]:
    """The components that go together on an overlay: the common ones, and its Volcano variant
    (MindCluster overlays only; autoscaling builds on a2)."""
    volcano = VOLCANO.get(OVERLAYS[overlay]) if not overlay.startswith("cce") else None
    common = tuple(c for c in COMPONENTS if not (overlay == "autoscaling" and c == "servicemonitor"))
    return common + ((volcano,) if volcano else ())


def render_with_components(overlay: str, components: tuple[str, ...], tmp: pathlib.Path) -> list[dict]:
    """An overlay plus components, the way a user's own kustomization would combine them."""
    tmp.mkdir(parents=True, exist_ok=True)
    rel = pathlib.Path(os.path.relpath(K8S, tmp))
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(rel / "overlays" / overlay)],
        "components": [str(rel / "components" / c) for c in components],
    }))
    return render_kustomization(tmp)


def render_everything(tmp_path_factory) -> dict[str, list[dict]]:
    """Each overlay alone, with every component that goes with it ("+components"), and with the
    storage patch ("+storage"): every Kubernetes object this repository can produce. The kubectl
    runs go two at a time: a worker waiting for this (support/once.py) has a core idle meanwhile."""
    renders = {}
    for overlay in OVERLAYS:
        renders[overlay] = (render_kustomization, K8S / "overlays" / overlay)
        renders[f"{overlay}+components"] = (render_with_components, overlay, components_of(overlay),
                                            tmp_path_factory.mktemp(f"{overlay}-components"))
        renders[f"{overlay}+storage"] = (render_with_components, overlay, STORAGE_COMPONENTS,
                                         tmp_path_factory.mktemp(f"{overlay}-storage"))
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(*render) for name, render in renders.items()}
        return {name: future.result() for name, future in futures.items()}


def pod_templates(docs: list[dict]) -> list[tuple[str, dict]]:
    """(kind/name, pod spec) of every pod template: Deployments and the Job templates (CronJobs)."""
    out = []
    for doc in docs:
        if doc["kind"] == "Deployment":
            out.append((f"Deployment/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]))
        elif doc["kind"] == "CronJob":
            out.append((f"CronJob/{doc['metadata']['name']}",
                        doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
    return out


def by_name(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict], kind: str) -> dict:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def server_container(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "server")


# --------------------------------------------------------------------------------------------
# The images' Dockerfiles (tests/test_deploy_images.py, tests/test_makefile.py)
# --------------------------------------------------------------------------------------------

DOCKERFILES = {"ascend": REPO / "Dockerfile", "cpu": REPO / "Dockerfile.cpu"}


def build_args(instructions) -> dict[str, str]:
    """ARG defaults (a later `ARG NAME` without a value only re-imports the name into a stage)."""
    defaults: dict[str, str] = {}
    for ins in instructions:
        if ins.name == "ARG" and "=" in ins.args:
            name, value = ins.args.split("=", 1)
            defaults.setdefault(name, value.strip('"'))
    return defaults


# --------------------------------------------------------------------------------------------
# The host scripts and a stand-in `modelscope` (tests/test_deploy_scripts.py,
# tests/test_host_python37.py)
# --------------------------------------------------------------------------------------------

DOWNLOAD = REPO / "scripts" / "download_weights.sh"
VERIFY = REPO / "scripts" / "verify_model_dir.py"

FAKE_MODELSCOPE = textwrap.dedent("""\
    #!{python}
    # Stand-in for `modelscope download --model ID [--revision R] --local_dir DIR`: records its
    # arguments, prints progress the way the real CLI does (stderr), copies a checkpoint into new
    # files (created under the caller's umask, as the real CLI's are).
    import json, os, shutil, sys
    args = sys.argv[1:]
    open(os.environ["FAKE_MODELSCOPE_LOG"], "w").write(json.dumps(args))
    dest = args[args.index("--local_dir") + 1]
    source = os.environ["FAKE_MODELSCOPE_SOURCE"]
    for name in sorted(os.listdir(source)):
        print(f"Downloading [{{name}}]: 100%|##########| 1.00/1.00", file=sys.stderr)
        shutil.copyfile(os.path.join(source, name), os.path.join(dest, name))
    if os.environ.get("FAKE_MODELSCOPE_TRUNCATE"):
        path = os.path.join(dest, "model.safetensors")
        os.truncate(path, os.path.getsize(path) // 2)
""")
