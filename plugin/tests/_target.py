"""The running target's vLLM code (0.23.0 or 0.30.0: what vllm-ascend's images ship), driven on
a CPU, with or without this plugin's patches.

`make test` runs plugin/tests once per Ascend target of deploy/ascend-targets.yaml that has a venv
of its own (`.venv-vllm023`, `.venv-vllm030`, from the target's `test_lock`; a target whose
`test_lock` is the CPU stack's, v0.32.0rc1, is proven in .venv by tests/ instead); the tests
read the running vLLM's version to know the target (`current_target()`) and what its code needs
(`NEEDED`). Where a patch is needed, a test shows the bug with vLLM's own code and the fix with the
patch; where it is not, a test shows vLLM's own code doing the right thing.

What runs is the target's real code: its `ModelConfig`, the multimodal processor it builds
(`MULTIMODAL_REGISTRY.create_processor`), `processor.apply()` / `_get_prompt_updates()`, its
encoder batching (`group_and_batch_mm_kwargs`) and the model's `embed_multimodal()` running its
vision tower. Two things differ from a server, both forced by the CPU: these vLLM wheels' compiled
ops are CUDA builds (the platform is "unspecified"), so no server and no language model can start
(`Qwen3_5` GDN layers ask the platform for a device it does not have); the vision tower is
therefore built from the target's own classes with the arguments its `__init__` uses, and random
weights (the tests compare shapes and batch-invariance, not answers).

The plugin patches class attributes. `VllmCode.restore()` puts vLLM's originals back, so each test
states which patches it wants (`apply(...)`), exactly as the plugin would apply them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import sys
import tempfile
from collections.abc import Iterable
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
TARGETS_FILE = REPO / "deploy" / "ascend-targets.yaml"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
PROCESSING_PATCHES = ("processor-version", "image-size-order", "max-slice-nums")
# The API-server patches both targets need (each shown on the target's own server loop, media
# loader, request models and chat/Responses parsers in test_server_patches.py and
# patches/api/test_target_fuzz_findings.py).
SERVER_PATCHES = ("engine-death-exit", "shutdown-cut-requests", "file-url-400", "data-url-400", "image-bomb-400",
                  "image-shape-400", "shutdown-drain-503", "request-type-400", "content-part-400", "responses-assistant-content",
                  "public-media-urls")
# What each target's own code needs on this CPU (platform "unspecified": rotary-mrope is for Ascend
# only, gdn-one-token-prefill for vLLM-CPU's conv kernel only). This is the claim the tests check
# against vLLM's behaviour, and the predicates against it.
NEEDED: dict[str, frozenset[str]] = {
    "0.23.0": frozenset({"reasoning-parser", "gdn-state-dtype", "processor-version", "image-size-order",
                         "vit-merger-flags", "max-slice-nums", *SERVER_PATCHES, "uvicorn-signals",
                         "json-whitespace", "vit-varlen-attention", "shm-busy-sleep", "allowed-token-ids-rows"}),
    # 0.30 has vLLM #44980 (native processor) and #45244 + the (rows, cols) layout, but neither the
    # per-item merger flags, nor the per-request max_slice_nums, nor a `minicpmv` reasoning parser;
    # its launcher already runs uvicorn without uvicorn's signal handlers (NoSignalServer, #50916).
    "0.30.0": frozenset({"reasoning-parser", "gdn-state-dtype", "vit-merger-flags", "max-slice-nums",
                         *SERVER_PATCHES, "json-whitespace", "vit-varlen-attention", "shm-busy-sleep",
                         "allowed-token-ids-rows"}),
}


@dataclasses.dataclass(frozen=True)
class Target:
    """One row of deploy/ascend-targets.yaml, and what its vLLM needs from the plugin."""

    tag: str
    vllm: str
    transformers_pin: str
    test_lock: str

    @property
    def own_venv(self) -> bool:
        """Whether plugin/tests run in a venv of this target's own (not the CPU stack's .venv)."""
        from minicpmv_ascend.tools.targets import own_venv

        return own_venv({"test_lock": self.test_lock})

    @property
    def name(self) -> str:
        return f"vLLM {self.vllm.rsplit('.', 1)[0]}"  # "vLLM 0.30"

    def needs(self, patch: str) -> bool:
        return patch in NEEDED[self.vllm]

    @property
    def first_with_its_transformers(self) -> bool:
        """Whether no earlier target of the table pins the same transformers: a test of transformers
        alone (no vLLM code) proves nothing new on a second target with the same pin."""
        return next(t for t in targets().values() if t.transformers_pin == self.transformers_pin) == self

    def processing_fixes(self, *leave_out: str) -> tuple[str, ...]:
        """The processing backports this target needs (what the plugin applies), minus `leave_out`."""
        return tuple(p for p in PROCESSING_PATCHES if self.needs(p) and p not in leave_out)


def targets() -> dict[str, Target]:
    import yaml

    table = yaml.safe_load(TARGETS_FILE.read_text(encoding="utf-8"))
    return {tag: Target(tag, str(row["vllm"]), str(row["transformers_pin"]), str(row["test_lock"]))
            for tag, row in table["targets"].items()}


def current_target() -> Target:
    """The target whose vLLM runs here; a venv that is no target's fails loudly."""
    import importlib.metadata

    import vllm

    running = str(vllm.__version__)
    found = [t for t in targets().values() if t.vllm == running]
    if found and not found[0].own_venv:
        raise RuntimeError(f"vLLM {running} here is the CPU stack's (.venv), which stands for {found[0].tag}: "
                           "its proofs are tests/ (tests/test_plugin.py, the server tests), not plugin/tests, "
                           "which run in each target venv of its own (`make venv-vllm030` ...)")
    if not found:
        raise RuntimeError(f"plugin/tests run against an Ascend target's vLLM ({TARGETS_FILE.name}: "
                           f"{sorted(t.vllm for t in targets().values())}; `make venv-vllm030` ...), "
                           f"not vLLM {running}")
    target = found[0]
    transformers = importlib.metadata.version("transformers")
    if transformers != target.transformers_pin or target.vllm not in NEEDED:
        raise RuntimeError(f"{target.tag}'s test venv must hold transformers {target.transformers_pin} "
                           f"(has {transformers}) and be listed in _target.NEEDED")
    return target


class VllmCode:
    """The target vLLM's MiniCPM-V 4.6 processor (and, on demand, vision tower) for one checkpoint."""

    def __init__(self, checkpoint: pathlib.Path) -> None:
        self.target = current_target()
        # The plugin must not be loaded behind the tests' back: they apply patches themselves.
        os.environ["VLLM_PLUGINS"] = ""
        import vllm.model_executor.models.minicpmv4_6 as module
        from vllm.config import ModelConfig
        from vllm.multimodal import MULTIMODAL_REGISTRY

        self.module = module
        self.classes = (module.MiniCPMV4_6ProcessingInfo, module.MiniCPMV4_6MultiModalProcessor,
                        module.MiniCPMV4_6ForConditionalGeneration)
        self._originals = {cls: dict(vars(cls)) for cls in self.classes}
        self.model_config = ModelConfig(
            model=str(checkpoint), tokenizer=str(checkpoint), dtype="bfloat16", max_model_len=16384,
            mm_processor_cache_gb=0, limit_mm_per_prompt={"image": 4, "video": 2})
        self.processor = MULTIMODAL_REGISTRY.create_processor(self.model_config)
        self.tokenizer = self.processor.info.get_tokenizer()
        self.image_pad_id = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        self.video_pad_id = self.tokenizer.convert_tokens_to_ids(VIDEO_PAD)
        self._model: Any = None

    # -- patches ------------------------------------------------------------------------------

    def restore(self) -> None:
        """vLLM's classes exactly as vLLM defines them."""
        for cls, original in self._originals.items():
            for name in [n for n in vars(cls) if n not in original]:
                delattr(cls, name)
            for name, value in original.items():
                if vars(cls).get(name) is not value:
                    setattr(cls, name, value)

    def apply(self, *names: str, **options: Any) -> None:
        """Apply the named model backports (after restoring vLLM's originals)."""
        import minicpmv_ascend_plugin as plugin
        from minicpmv_ascend_plugin.patches.model import image_size_order

        self.restore()
        by_name = {p.name: p for p in plugin.PATCHES}
        for name in names:
            if name == "image-size-order" and "plan" in options:
                image_size_order.apply_plan(self.module, options["plan"])
            else:
                by_name[name].apply(self.module)

    # -- processing ---------------------------------------------------------------------------

    def process(self, prompt: str, images: Iterable[Any] = (), videos: Iterable[Any] = (),
                **mm_kwargs: Any) -> dict[str, Any]:
        """vLLM's full multimodal processing of one request (HF image processor included)."""
        from vllm.multimodal.processing.context import TimingContext
        from vllm.multimodal.processing.inputs import ProcessorInputs

        data: dict[str, list[Any]] = {}
        if images:
            data["image"] = list(images)
        if videos:
            data["video"] = list(videos)
        items = self.processor.info.parse_mm_data(data)
        prompt_ids = self.encode([prompt])[0]  # vLLM >= 0.30 takes token ids only
        return self.processor.apply(ProcessorInputs(prompt_ids, items, hf_processor_mm_kwargs=mm_kwargs),
                                    TimingContext(enabled=False))

    def image_placeholder(self, width: int, height: int, **mm_kwargs: Any) -> str | list[int]:
        """What vLLM replaces one image's `<|image_pad|>` with (text on 0.23, token ids on 0.30):
        `_get_prompt_updates()` and its image replacement, as `apply()` calls them, without
        processing the pixels."""
        import torch

        items = self.processor.info.parse_mm_data({"image": [torch.empty(3, height, width, dtype=torch.uint8)]})
        updates = self.processor._get_prompt_updates(items, mm_kwargs, {})
        update = next(u for u in updates if u.modality == "image")
        details = update.replacement(0)
        return details.full if hasattr(details, "full") else details

    def ids(self, placeholders: list[str | list[int]]) -> list[list[int]]:
        """Token ids of `image_placeholder()` results (texts tokenized in one batch)."""
        encoded = iter(self.encode([p for p in placeholders if isinstance(p, str)]) if placeholders else [])
        return [next(encoded) if isinstance(p, str) else list(p) for p in placeholders]

    def placeholder_ids(self, width: int, height: int, **mm_kwargs: Any) -> list[int]:
        return self.ids([self.image_placeholder(width, height, **mm_kwargs)])[0]

    def encode(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    # -- vision tower ---------------------------------------------------------------------------

    def model(self) -> Any:
        """MiniCPMV4_6ForConditionalGeneration with the target's vision tower (random weights)."""
        if self._model is None:
            self._model = self._build_vision_model()
        return self._model

    def _build_vision_model(self) -> Any:
        return vision_model(self.module, self.model_config, self.model_config.hf_config)

    def embed(self, requests: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        """Encode the items of several processed requests as ONE encoder batch, the way the model
        runner does (`group_and_batch_mm_kwargs` -> `embed_multimodal`); one tensor per item."""
        import torch
        from vllm.multimodal.utils import group_and_batch_mm_kwargs

        items = [(modality, item) for modality, out in requests for item in out["mm_kwargs"][modality]]
        outputs: list[Any] = []
        with torch.no_grad():
            for _, _, batch in group_and_batch_mm_kwargs(items, device="cpu"):
                outputs.extend(self.model().embed_multimodal(**batch))
        return outputs


def vision_model(module: Any, model_config: Any, config: Any, cls: Any = None, seed: int = 0) -> Any:
    """`cls` (the module's MiniCPMV4_6ForConditionalGeneration by default) holding only the vision
    half of its `__init__` (0.23.0, 0.30.0, 0.32.0), built from the module's own classes for
    `config`, with random weights."""
    import torch
    from torch import nn
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.model_executor.models.idefics2_vision_model import Idefics2VisionTransformer

    cls = cls or module.MiniCPMV4_6ForConditionalGeneration
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(vllm_config):
        if not model_parallel_is_initialized():
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"file://{tempfile.mktemp()}")
            initialize_model_parallel(1, 1)
        model = cls.__new__(cls)
        nn.Module.__init__(model)
        model.config = config
        # The vision half of MiniCPMV4_6ForConditionalGeneration.__init__.
        model.vpm = Idefics2VisionTransformer(config.vision_config, quant_config=None,
                                              apply_encoder_attention_mask=True, prefix="vpm")
        if config.drop_vision_last_layer:
            model.vpm.encoder.layers = model.vpm.encoder.layers[:-1]
        model.vit_merger = module.MiniCPMV4_6ViTWindowAttentionMerger(config.vision_config, quant_config=None,
                                                                      prefix="vit_merger")
        model.merger = module.MiniCPMV4_6Merger(hidden_size=config.vision_config.hidden_size,
                                                llm_embed_dim=config.text_config.hidden_size)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model.eval()


def placeholder_lengths(out: dict[str, Any], modality: str) -> list[int]:
    """Embedding slots vLLM reserved in the prompt for each item (what the encoder must fill)."""
    return [int(p.is_embed.sum()) if p.is_embed is not None else p.length
            for p in out["mm_placeholders"][modality]]


def hf_processor(checkpoint: pathlib.Path, sizing_only: bool = False) -> Any:
    """transformers' own MiniCPMV4_6Processor for the checkpoint.

    `sizing_only`: its image processor does every step of transformers' `_preprocess` (grid
    choice, resize targets, slicing, target sizes) on shape-only "meta" tensors instead of pixels,
    so placeholders come ~20x faster; tests check it gives the same ids as the stock processor.
    """
    import torch
    from transformers import AutoProcessor
    from transformers.models.minicpmv4_6.image_processing_minicpmv4_6 import MiniCPMV4_6ImageProcessor

    processor = AutoProcessor.from_pretrained(checkpoint)
    if not sizing_only:
        return processor

    class SizingOnlyImageProcessor(MiniCPMV4_6ImageProcessor):
        def resize(self, image: Any, size: Any, *args: Any, **kwargs: Any) -> Any:
            return torch.empty(*image.shape[:-2], size.height, size.width, device="meta")

        def reshape_by_patch(self, image: Any, patch_size: int) -> Any:
            channels, height, width = image.shape
            return torch.empty(channels, patch_size, height * width // patch_size, device="meta")

    settings = processor.image_processor.to_dict()
    settings.pop("image_processor_type", None)
    processor.image_processor = SizingOnlyImageProcessor(**settings)
    return processor


def hf_image_ids(processor: Any, width: int, height: int, **kwargs: Any) -> list[int]:
    """Token ids transformers' processor gives the text `<|image_pad|>` with one image."""
    import torch

    image = torch.empty(3, height, width, dtype=torch.uint8)
    return processor(text=IMAGE_PAD, images=[image], **kwargs)["input_ids"][0].tolist()


def _env(env: dict[str, str] | None) -> dict[str, str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS",) and not k.startswith("MINICPMV_")}
    full_env.update(env or {})
    return full_env


# Most of each process these tests start is importing vLLM: ~10 CPU-seconds, about twenty times
# per target run. They are forked from one process (multiprocessing's fork server) that has
# imported what vLLM's API server has imported when it loads plugins, vllm.engine.arg_utils (where
# test_register's PROBE, which measures what the plugin's register() imports, starts too), and
# nothing of the plugin; each gets what a fresh `python -c` or `python script` of its own would
# have: its environment, working directory, sys.path, argv, output, exit code and signals. Not
# for a script that sets what vLLM reads when it is imported (ascend_check.py's
# VLLM_LOGGING_STREAM): that one runs in a fresh interpreter.
ZYGOTE_PRELOAD = ("vllm.engine.arg_utils",)


@functools.cache
def _zygote() -> Any:
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(ZYGOTE_PRELOAD))
    return context


@functools.cache
def _fresh_sys_path() -> tuple[str, ...]:
    """sys.path of a fresh `python -c` of this venv without PYTHONPATH ('' first)."""
    import json
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
                          capture_output=True, text=True, env=env, cwd=REPO, check=True)
    return tuple(json.loads(done.stdout))


def _become(argv: list[str], env: dict[str, str], fresh: tuple[str, ...], outputs: tuple[str, str],
            new_session: bool) -> None:
    """The forked child: become `python -c CODE ARGS` or `python SCRIPT ARGS` (argv without the
    interpreter) with `env`, stdout and stderr going to `outputs` (the same file: merged)."""
    import runpy

    if new_session:
        os.setsid()
    os.chdir(REPO)
    os.environ.clear()
    os.environ.update(env)
    script = argv[0] != "-c"
    first = os.path.dirname(os.path.abspath(argv[0])) if script else fresh[0]
    sys.path[:] = [first, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)), *fresh[1:]]
    sys.argv = argv if script else ["-c", *argv[2:]]
    for fd, path in zip((1, 2), outputs):
        file = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(file, fd)
        os.close(file)
    # multiprocessing's bootstrap then does what the interpreter would: SystemExit's code is the
    # exit code, an exception's traceback goes to stderr and exits 1, the streams are flushed.
    if script:
        runpy.run_path(argv[0], run_name="__main__")
    else:
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})


class Forked:
    """A process forked from the zygote as `python ARGV`, with the parts of subprocess.Popen's
    interface these tests use (pid, poll, wait) and its output read from files."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, merge_output: bool = False,
                 new_session: bool = False) -> None:
        self.directory = tempfile.TemporaryDirectory(prefix="forked-python-")
        names = ("output", "output") if merge_output else ("stdout", "stderr")
        self.outputs = tuple(os.path.join(self.directory.name, name) for name in names)
        for path in self.outputs:
            open(path, "w").close()
        self.args = [sys.executable, *argv]
        self.process = _zygote().Process(target=_become,
                                         args=(argv, _env(env), _fresh_sys_path(), self.outputs, new_session))
        self.process.start()
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.process.exitcode

    def output(self, index: int = 0) -> str:
        return pathlib.Path(self.outputs[index]).read_text(errors="replace")

    def follow(self) -> Iterable[str]:
        """Its output's lines as they are written, until it has exited (for a thread of its own:
        it looks at the exit status's pipe without reading it, which poll() and wait() do)."""
        from multiprocessing.connection import wait

        with open(self.outputs[0], errors="replace") as file:
            pending = ""
            while True:
                exited = bool(wait([self.process.sentinel], timeout=0.1))
                pending += file.read()
                *lines, pending = pending.split("\n")
                yield from (line + "\n" for line in lines)
                if exited:
                    break
            if pending:
                yield pending

    def communicate(self, timeout: float) -> Any:
        """wait(), killing it past `timeout`; a CompletedProcess (subprocess.run's timeout error)."""
        import subprocess

        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.join()
            raise subprocess.TimeoutExpired(self.args, timeout, self.output(0), self.output(1)) from None
        return subprocess.CompletedProcess(self.args, self.process.exitcode, self.output(0), self.output(1))


def run_python(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """Run `code` as this venv's `python -c code *args` would, forked from the zygote above (a
    process of its own, with vLLM's API server's imports done); returns a CompletedProcess."""
    return Forked(["-c", code, *args], env).communicate(timeout)


def results_each(code: str, *envs: dict[str, str] | None, timeout: float = 300) -> list[dict[str, Any]]:
    """The `RESULT {json}` line of `code` run once per environment in `envs`, the processes side by
    side; each must exit 0."""
    import json

    processes = [Forked(["-c", code], env) for env in envs]
    results = []
    for process in [p.communicate(timeout) for p in processes]:
        assert process.returncode == 0, process.stderr[-3000:]
        line = next(l for l in process.stdout.splitlines() if l.startswith("RESULT "))
        results.append(json.loads(line.removeprefix("RESULT ")))
    return results
