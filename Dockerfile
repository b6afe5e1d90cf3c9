# MiniCPM-V-4.6-Thinking on Huawei Ascend NPUs: the official vllm-ascend release image, plus
# this project (launcher, vLLM plugin, health probe), a transformers that has MiniCPM-V 4.6,
# tini as PID 1 and a non-root user.
#
# Targets come from deploy/ascend-targets.yaml (the one table; tests keep the defaults below equal
# to it). One build argument picks the vllm-ascend release, one the Atlas variant:
#   docker build -t minicpmv-ascend:v0.30.0-a2 .                                      # default
#   docker build --build-arg ASCEND_TARGET=a3 -t minicpmv-ascend:v0.30.0-a3 .        # Atlas A3 (-a3 image)
#   docker build --build-arg VLLM_ASCEND_VERSION=v0.23.0 -t minicpmv-ascend:v0.23.0-a2 .   # older drivers
#   docker build --build-arg VLLM_ASCEND_VERSION=v0.32.0rc1 -t minicpmv-ascend:v0.32.0rc1-a2 .   # pre-release: MiniCPM-V 4.7
# Atlas servers are usually aarch64 (Kunpeng): on another machine, build for theirs with
#   docker buildx build --platform linux/arm64 -t minicpmv-ascend:v0.30.0-a2 --load .
# Nothing here is specific to one architecture (vllm-ascend publishes its images for both).
#
# The base is pinned by tag. To pin it by digest as well (recommended for production: a tag can be
# re-pushed), look the digest up once and pass it with its leading "@":
#   docker buildx imagetools inspect quay.io/ascend/vllm-ascend:v0.30.0      # "Digest: sha256:..."
#   docker build --build-arg VLLM_ASCEND_A2_DIGEST=@sha256:<digest> -t minicpmv-ascend:v0.30.0-a2 .
# Both base stages are declared; BuildKit pulls only the one ASCEND_TARGET selects.
# Ubuntu-based images only (tini comes from apt). Deployment guide: docs/deploy-ascend.md.
# Offline or behind a company CA: no `# syntax` line (BuildKit would pull its frontend image from
# Docker Hub: Docker's built-in one builds this file), every download goes where the build
# arguments say (VLLM_ASCEND_IMAGE, PIP_INDEX_URL), and the site's CA comes in as the build secret
# `build_ca` (deploy/docker/with-build-ca.sh; docs/deploy-ascend.md, "Mirrors").

ARG VLLM_ASCEND_IMAGE=quay.io/ascend/vllm-ascend
ARG VLLM_ASCEND_VERSION=v0.30.0
ARG VLLM_ASCEND_A2_DIGEST=""
ARG VLLM_ASCEND_A3_DIGEST=""
# a2 = Atlas A2 / 910B (image tag <version>), a3 = Atlas A3 (image tag <version>-a3)
ARG ASCEND_TARGET=a2

FROM ${VLLM_ASCEND_IMAGE}:${VLLM_ASCEND_VERSION}${VLLM_ASCEND_A2_DIGEST} AS base-a2
FROM ${VLLM_ASCEND_IMAGE}:${VLLM_ASCEND_VERSION}-a3${VLLM_ASCEND_A3_DIGEST} AS base-a3

# DL3006: base-a2 / base-a3 are the stages above, each pinned by tag (and optionally digest).
# hadolint ignore=DL3006
FROM base-${ASCEND_TARGET}

ARG ASCEND_TARGET
ARG VLLM_ASCEND_VERSION
# Importing torch (>= 2.5) loads every `torch.backends` entry point; torch_npu registers one, and
# loading it needs the NPU driver's libascend_hal.so, which a `docker build` container does not have
# ("Failed to load the backend extension: torch_npu", vllm-ascend#1440; CANN images from 9.0.1 on
# no longer put a stub of it on LD_LIBRARY_PATH, Ascend/cann-container-image aec63618). So no build
# step may load it: torch/__init__.py skips the entry points when this is 0. An ARG, not an ENV:
# every RUN below sees it, the running container does not (vllm-ascend loads torch_npu there).
ARG TORCH_DEVICE_BACKEND_AUTOLOAD=0
# Installed only when the base image's own transformers cannot serve the MiniCPM-V models of its vLLM
# (a config class missing: MiniCPMV4_6Config, and MiniCPMV4_7Config from vLLM 0.32; outside the
# range the image's vLLM requires; or 5.21+ with vLLM <= 0.33): scripts/transformers_decision.py
# decides in the build and logs why. Empty (the default): the table's transformers_pin of
# VLLM_ASCEND_VERSION, each target its own (5.14.1 for v0.30.0 and v0.23.0, 5.19.0 for v0.32.0rc1,
# whose vLLM requires >=5.16.1,<5.20.0); a version here overrides it. vllm-ascend v0.23.0 pins
# 5.5.4, which has no MiniCPM-V 4.6; pip then reports the conflict with that pin: expected.
ARG TRANSFORMERS_VERSION=""
# The base image points pip at a mirror in China; pass e.g. https://pypi.org/simple to override.
ARG PIP_INDEX_URL=""
# The runtime user, and the GID of the host's HwHiAiUser group (the Ascend driver's owner group:
# /dev/davinci* and /usr/local/Ascend/driver are readable by it). `stat -c %g /dev/davinci_manager`
# on the host tells it; compose (group_add) and Kubernetes (supplementalGroups) can add it at run
# time too, and the launcher stops with that fix (exit 2) when the devices are not accessible.
ARG APP_UID=1000
ARG HWHIAIUSER_GID=1000

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
USER 0

# tini: PID 1 that forwards signals to the server and reaps whatever its child processes orphan.
# Not version-pinned (DL3008): an exact Ubuntu package version disappears from the archive with the
# next point release, breaking the build; the base image (tag/digest) pins the distribution.
# hadolint ignore=DL3008
RUN --mount=type=bind,source=deploy/docker/with-build-ca.sh,target=/usr/local/bin/with-build-ca \
    --mount=type=secret,id=build_ca \
    with-build-ca apt-get update \
    && with-build-ca apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

# This project (one distribution: launcher, probes, the vLLM general plugin) into the image's
# Python, next to vLLM and vllm-ascend, and the transformers the decision picks (the requirement
# file is empty when the base image's own is kept). The source is bind-mounted, not copied, so it
# adds no layer. The build fails unless the kept or installed transformers imports the config
# classes the decision recorded (every model the image's vLLM serves: common/models.py) and
# the plugin is registered with vLLM (without it vLLM 0.23 cannot start this model). The decision
# and its reasons are kept in /opt/minicpmv-ascend/build/ for scripts/ascend_check.py.
# (DL3013: /tmp/src is a local path, not a registry package.)
# hadolint ignore=DL3013
RUN --mount=type=bind,source=.,target=/tmp/src,rw --mount=type=secret,id=build_ca \
    python3 /tmp/src/scripts/transformers_decision.py decide --pin "${TRANSFORMERS_VERSION}" \
        --target "${VLLM_ASCEND_VERSION}" --variant "${ASCEND_TARGET}" \
        --record /opt/minicpmv-ascend/build/transformers-decision.json \
        --requirement-file /opt/minicpmv-ascend/build/transformers-requirement.txt \
    && /tmp/src/deploy/docker/with-build-ca.sh python3 -m pip install --no-cache-dir \
        ${PIP_INDEX_URL:+--index-url "$PIP_INDEX_URL"} \
        -r /opt/minicpmv-ascend/build/transformers-requirement.txt /tmp/src \
    && python3 /tmp/src/scripts/transformers_decision.py verify \
        --record /opt/minicpmv-ascend/build/transformers-decision.json \
    && python3 /tmp/src/scripts/transformers_decision.py import \
        --record /opt/minicpmv-ascend/build/transformers-decision.json \
    && python3 -c "from importlib.metadata import entry_points; \
assert any(e.value.startswith('minicpmv_ascend_plugin') \
for e in entry_points(group='vllm.general_plugins')), 'plugin not registered'"

# vLLM and vllm-ascend are installed from source trees owned by root (`pip install -e`, which
# writes no bytecode): the non-root server cannot write their __pycache__, so every new container
# compiled them again at start. Compile them once here (-q -j0 of `python -m compileall`).
# find_spec locates a top-level package without importing it. A file that does not compile would
# fail on import just the same: that is reported, not fatal.
RUN python3 -c "import compileall, importlib.util, sys; \
dirs = [d for name in ('vllm', 'vllm_ascend') for d in importlib.util.find_spec(name).submodule_search_locations]; \
print('byte-compiling', *dirs, flush=True); \
ok = all([compileall.compile_dir(d, quiet=1, workers=0) for d in dirs]); \
print('byte-compiled' if ok else 'warning: some files did not byte-compile (see above)')"

# The files orchestrators call by path, and the table of targets for scripts/ascend_check.py.
COPY --chmod=0755 entrypoint.py /opt/minicpmv-ascend/entrypoint.py
COPY --chmod=0755 healthcheck/probe.py /opt/minicpmv-ascend/healthcheck/probe.py
COPY --chmod=0755 deploy/docker/with-cann-env.sh /opt/minicpmv-ascend/bin/with-cann-env.sh
COPY --chmod=0755 scripts/download_weights.sh scripts/verify_model_dir.py scripts/ascend_check.py /opt/minicpmv-ascend/scripts/
COPY --chmod=0644 deploy/ascend-targets.yaml /opt/minicpmv-ascend/build/ascend-targets.yaml

RUN (getent group "${HWHIAIUSER_GID}" >/dev/null || groupadd --gid "${HWHIAIUSER_GID}" HwHiAiUser) \
    && useradd --uid "${APP_UID}" --gid "${HWHIAIUSER_GID}" --create-home --home-dir /home/minicpmv \
        --shell /bin/bash minicpmv \
    && mkdir -p /home/minicpmv/.cache /models \
    && chown -R "${APP_UID}:${HWHIAIUSER_GID}" /home/minicpmv \
    && python3 /opt/minicpmv-ascend/entrypoint.py --help >/dev/null

LABEL org.opencontainers.image.title="minicpmv-ascend" \
      org.opencontainers.image.description="MiniCPM-V-4.6-Thinking behind vLLM's OpenAI API on Ascend NPUs" \
      io.github.minicpmv-ascend.vllm-ascend="${VLLM_ASCEND_VERSION}" \
      io.github.minicpmv-ascend.target="${ASCEND_TARGET}"

# HOME: CANN writes its logs to ~/ascend/log, torch/triton/vLLM their caches to ~/.cache, and the
# embedded test checkpoint goes to ~/.cache/minicpmv-ascend; all must be writable by the user.
# TRITON_CACHE_DIR: Triton(-Ascend) keeps compiled kernels in ~/.triton/cache by default, outside
# the cache volume that compose and Kubernetes mount at ~/.cache; there they survive a re-created
# container. vLLM's compile cache keeps a TRITON_CACHE_DIR its caller sets.
ENV HOME=/home/minicpmv \
    PORT=8000 \
    PYTHONUNBUFFERED=1 \
    TRITON_CACHE_DIR=/home/minicpmv/.cache/triton
# CANN compiles kernels into ./kernel_meta: the working directory must be writable too.
WORKDIR /home/minicpmv
USER ${APP_UID}:${HWHIAIUSER_GID}
EXPOSE 8000

# The cheap probe (GET /health). The first start on a card compiles kernels: the start period is
# long. Kubernetes uses its own probes (deploy/k8s), compose a `ready` probe (compose.yaml).
HEALTHCHECK --interval=30s --timeout=15s --start-period=20m --retries=3 \
    CMD ["python3", "/opt/minicpmv-ascend/healthcheck/probe.py", "live"]

# tini -> CANN environment (then exec) -> launcher (validates, then execs vLLM). Arguments given to
# `docker run IMAGE ...` (or Kubernetes `args:`) are vLLM flags; settings come from the environment.
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/minicpmv-ascend/bin/with-cann-env.sh", "python3", "/opt/minicpmv-ascend/entrypoint.py"]
CMD []
