# syntax=docker/dockerfile:1
#
# MiniCPM-V-4.6-Thinking on Huawei Ascend NPUs: the official vllm-ascend release image, plus
# this project (launcher, vLLM plugin, health probe), a transformers that has MiniCPM-V 4.6,
# tini as PID 1 and a non-root user.
#
#   docker build -t minicpmv-ascend:a2 .                                # Atlas A2 (910B), default
#   docker build -t minicpmv-ascend:a3 --build-arg ASCEND_TARGET=a3 .   # Atlas A3 (tag suffix -a3)
#
# The base is pinned by tag. To pin it by digest as well (recommended for production: a tag can be
# re-pushed), look the digest up once and pass it with its leading "@":
#   docker buildx imagetools inspect quay.io/ascend/vllm-ascend:v0.23.0      # "Digest: sha256:..."
#   docker build --build-arg VLLM_ASCEND_A2_DIGEST=@sha256:<digest> -t minicpmv-ascend:a2 .
# Both base stages are declared; BuildKit pulls only the one ASCEND_TARGET selects.
# Ubuntu-based images only (tini comes from apt). Deployment guide: docs/deploy-ascend.md.

ARG VLLM_ASCEND_IMAGE=quay.io/ascend/vllm-ascend
ARG VLLM_ASCEND_VERSION=v0.23.0
ARG VLLM_ASCEND_A2_DIGEST=""
ARG VLLM_ASCEND_A3_DIGEST=""
# a2 = Atlas A2 / 910B (image tag v0.23.0), a3 = Atlas A3 (image tag v0.23.0-a3)
ARG ASCEND_TARGET=a2

FROM ${VLLM_ASCEND_IMAGE}:${VLLM_ASCEND_VERSION}${VLLM_ASCEND_A2_DIGEST} AS base-a2
FROM ${VLLM_ASCEND_IMAGE}:${VLLM_ASCEND_VERSION}-a3${VLLM_ASCEND_A3_DIGEST} AS base-a3

# DL3006: base-a2 / base-a3 are the stages above, each pinned by tag (and optionally digest).
# hadolint ignore=DL3006
FROM base-${ASCEND_TARGET}

ARG ASCEND_TARGET
ARG VLLM_ASCEND_VERSION
# vllm-ascend v0.23.0 pins transformers 5.5.4, which has no MiniCPM-V 4.6 (the model module does
# not import). 5.14.1 has `minicpmv4_6` and matches what vLLM 0.23 calls (5.7.0 to 5.20.2 behave the
# same; 5.21.0 changed signatures 0.23 relies on); vllm-ascend 0.25.1rc1 pins it too. pip reports
# the conflict with vllm-ascend's pin while installing: expected, not an error.
ARG TRANSFORMERS_VERSION=5.14.1
# The base image points pip at a mirror in China; pass e.g. https://pypi.org/simple to override.
ARG PIP_INDEX_URL=""
# The runtime user, and the GID of the host's HwHiAiUser group (the Ascend driver's owner group:
# /dev/davinci* and /usr/local/Ascend/driver are readable by it). `getent group HwHiAiUser` on the
# host tells it; compose (group_add) and Kubernetes (supplementalGroups) can add it at run time too.
ARG APP_UID=1000
ARG HWHIAIUSER_GID=1000

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
USER 0

# tini: PID 1 that forwards signals to the server and reaps whatever its child processes orphan.
# Not version-pinned (DL3008): an exact Ubuntu package version disappears from the archive with the
# next point release, breaking the build; the base image (tag/digest) pins the distribution.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

# This project (one distribution: launcher, probes, the vLLM general plugin) into the image's
# Python, next to vLLM and vllm-ascend, with the pinned transformers. The source is bind-mounted,
# not copied, so it adds no layer. The build fails unless transformers has MiniCPM-V 4.6 and the
# plugin is registered with vLLM (without it vLLM 0.23 cannot start this model).
# (DL3013: /tmp/src is a local path, not a registry package.)
# hadolint ignore=DL3013
RUN --mount=type=bind,source=.,target=/tmp/src,rw \
    python3 -m pip install --no-cache-dir ${PIP_INDEX_URL:+--index-url "$PIP_INDEX_URL"} \
        "transformers==${TRANSFORMERS_VERSION}" /tmp/src \
    && python3 -c "import transformers, sys; \
from transformers import MiniCPMV4_6Config; \
sys.exit(transformers.__version__ != '${TRANSFORMERS_VERSION}')" \
    && python3 -c "from importlib.metadata import entry_points; \
assert any(e.value.startswith('minicpmv_ascend_plugin') \
for e in entry_points(group='vllm.general_plugins')), 'plugin not registered'"

# The files orchestrators call by path.
COPY --chmod=0755 entrypoint.py /opt/minicpmv-ascend/entrypoint.py
COPY --chmod=0755 healthcheck/probe.py /opt/minicpmv-ascend/healthcheck/probe.py
COPY --chmod=0755 deploy/docker/with-cann-env.sh /opt/minicpmv-ascend/bin/with-cann-env.sh
COPY --chmod=0755 scripts/download_weights.sh scripts/verify_model_dir.py scripts/ascend_check.py /opt/minicpmv-ascend/scripts/

RUN (getent group "${HWHIAIUSER_GID}" >/dev/null || groupadd --gid "${HWHIAIUSER_GID}" HwHiAiUser) \
    && useradd --uid "${APP_UID}" --gid "${HWHIAIUSER_GID}" --create-home --home-dir /home/minicpmv \
        --shell /bin/bash minicpmv \
    && mkdir -p /home/minicpmv/.cache /models \
    && chown -R "${APP_UID}:${HWHIAIUSER_GID}" /home/minicpmv \
    && python3 /opt/minicpmv-ascend/entrypoint.py --help >/dev/null

LABEL org.opencontainers.image.title="minicpmv-ascend" \
      org.opencontainers.image.description="MiniCPM-V-4.6-Thinking behind vLLM's OpenAI API on Ascend NPUs" \
      org.opencontainers.image.base.name="quay.io/ascend/vllm-ascend:${VLLM_ASCEND_VERSION}" \
      io.github.minicpmv-ascend.target="${ASCEND_TARGET}"

# HOME: CANN writes its logs to ~/ascend/log, torch/triton/vLLM their caches to ~/.cache, and the
# embedded test checkpoint goes to ~/.cache/minicpmv-ascend; all must be writable by the user.
ENV HOME=/home/minicpmv \
    PORT=8000 \
    PYTHONUNBUFFERED=1
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
