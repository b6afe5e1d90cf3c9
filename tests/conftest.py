"""Fixtures and hooks only: the tiny random checkpoints (MiniCPM-V 4.6; 4.7) and the shared real
vLLM CPU servers per test session (two of 4.6, one of 4.7), and the test tiers' plugin (tests/tiers.py). How a server is started, and the shared
servers' settings, are in tests/support/server.py; every other shared helper is in tests/support/.
"""

from __future__ import annotations

import json
import pathlib

import pytest

import tiers
from support.once import once
from support.server import OTHER_SERVER_CHUNK, OTHER_SERVER_KEY, SHARED_SERVER_ENV, serve_shared, start_server


def pytest_configure(config: pytest.Config) -> None:
    # The markers `server`, `engine` and `slow`, enforced at collection and at run time.
    config.pluginmanager.register(tiers, "tiers")


# The session fixtures that make files are made once per run, not once per xdist worker (support/once.py).
@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> pathlib.Path:
    from minicpmv_ascend.checkpoint import generate

    return once(tmp_path_factory, "minicpmv46-tiny", lambda out: generate(out, "tiny", seed=0))


@pytest.fixture(scope="session")
def tiny_checkpoint_47(tmp_path_factory) -> pathlib.Path:
    """The tiny random MiniCPM-V 4.7 checkpoint (`minicpmv-make-checkpoint --model minicpmv4_7`)."""
    from minicpmv_ascend.checkpoint import generate

    return once(tmp_path_factory, "minicpmv47-tiny",
                lambda out: generate(out, "tiny", seed=0, model_type="minicpmv4_7"))


def _import_config_classes() -> None:
    """transformers' config classes (they import torch: ~7 s of a config's ~8 s), for `once`'s
    `meanwhile`: a worker waiting for another's config imports them in the meantime; the unit tier's
    tokenizer, template and vLLM-parser tests import them in every worker anyway."""
    import transformers

    from minicpmv_ascend.common.models import MODELS

    for model in MODELS.values():
        getattr(transformers, model.transformers_config)


def _config_only(model_type: str):
    """A checkpoint's files without weights (below), for `model_type`."""
    from minicpmv_ascend import checkpoint

    def make(out: pathlib.Path) -> None:
        out.mkdir()
        tokenizer = checkpoint.build_tokenizer(out)
        checkpoint.build_config(checkpoint.PRESETS["tiny"], tokenizer, model_type).save_pretrained(out)
        checkpoint.save_processor(out, tokenizer, model_type)
        checkpoint.write_generation_config(out, tokenizer)
        header = b"{}"  # a safetensors file: 8-byte header length, then the (empty) JSON header
        (out / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)

    return make


@pytest.fixture(scope="session")
def tiny_config(tmp_path_factory) -> pathlib.Path:
    """`tiny_checkpoint` without its weights: the same config.json, tokenizer, processor and
    generation config, and a weights file holding no tensors. It is all that the settings, the
    launcher's checks and the scripts read, made in seconds without torch generating weights,
    so unit tests use it (test_checkpoint.py keeps it equal to the real one's files)."""
    from minicpmv_ascend.common.models import DEFAULT_MODEL_TYPE

    return once(tmp_path_factory, "minicpmv46-tiny-config", _config_only(DEFAULT_MODEL_TYPE), _import_config_classes)


@pytest.fixture(scope="session")
def tiny_config_47(tmp_path_factory) -> pathlib.Path:
    """`tiny_checkpoint_47` without its weights (as `tiny_config` is for 4.6)."""
    return once(tmp_path_factory, "minicpmv47-tiny-config", _config_only("minicpmv4_7"), _import_config_classes)


@pytest.fixture(scope="session")
def k8s_rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """Every Kubernetes object this repository can produce (kubectl kustomize of each overlay alone,
    with its components, with the storage patch): rendered once for the deploy and security tests."""
    from support.deploy import render_everything

    rendered = once(tmp_path_factory, "k8s-rendered.json",
                    lambda out: out.write_text(json.dumps(render_everything(tmp_path_factory))))
    return json.loads(rendered.read_text())


@pytest.fixture(scope="session")
def server(tiny_checkpoint, tmp_path_factory):
    """The shared server for tests that only send requests (they must not stop or break it)."""
    yield from serve_shared(start_server(tiny_checkpoint, tmp_path_factory.mktemp("server") / "server.log",
                                   **SHARED_SERVER_ENV), "shared vLLM server")


@pytest.fixture(scope="session")
def other_server_files(tmp_path_factory) -> pathlib.Path:
    """The other server's key file (`api-key`), its allowed media directory (`media`) and log."""
    files = tmp_path_factory.mktemp("other-server")
    (files / "api-key").write_text(f"{OTHER_SERVER_KEY}\n")
    (files / "media").mkdir()
    return files


@pytest.fixture(scope="session")
def other_server(tiny_checkpoint, other_server_files):
    """The second shared server (tests/support/server.py says why it differs): tests only send it
    requests, with OTHER_SERVER_KEY."""
    srv = start_server(tiny_checkpoint, other_server_files / "server.log", "--trust-request-mm-kwargs",
                       API_KEY_FILE=str(other_server_files / "api-key"),
                       ALLOWED_LOCAL_MEDIA_PATH=str(other_server_files / "media"),
                       ENABLE_PREFIX_CACHING="true", MAX_NUM_BATCHED_TOKENS=str(OTHER_SERVER_CHUNK))
    yield from serve_shared(srv, "other shared vLLM server", api_key=OTHER_SERVER_KEY)


@pytest.fixture(scope="session")
def server_47(tiny_checkpoint_47, tmp_path_factory):
    """A shared server of the MiniCPM-V 4.7 checkpoint, all defaults (its served name is the model's:
    the launcher derives it), per-request processor options trusted (the 4x / 16x placeholders);
    started only when a test asks for it. Tests only send it requests."""
    from minicpmv_ascend.common.models import MODELS

    srv = start_server(tiny_checkpoint_47, tmp_path_factory.mktemp("server-47") / "server.log",
                       "--trust-request-mm-kwargs")
    srv.model = MODELS["minicpmv4_7"].served_model_name  # not set: the launcher's default for 4.7
    yield from serve_shared(srv, "shared MiniCPM-V 4.7 server")
