# A stand-in for quay.io/ascend/vllm-ascend:<tag>[-a3], the Ascend image's base, which no registry
# here serves: built by the container tests (tests/support/containers.py) on the Debian base they
# make, so that the project's Dockerfile builds FROM it as it builds FROM the real one.
#
# What it has of the real image: a pip-managed Python first on PATH (where the CANN images put
# theirs; not Debian's externally managed one), the target's vLLM (its Python code, installed
# without dependencies) with the target's test environment around it (requirements.txt: the
# target's lock, with the base image's own transformers where the targets table knows it), an
# importable vllm_ascend of the target's version, a torch_npu that fails to load without a driver
# as the real one does, and CANN's set_env.sh files at /usr/local/Ascend.
# What it cannot show: CANN, the driver, vllm-ascend's code and NPU kernels, Ubuntu (this is
# Debian bookworm) and the real image's Python 3.12 (this one is bookworm's 3.11).
#
# Build context (written by the tests): requirements.txt, site/ (copied into site-packages),
# Ascend/ (the CANN tree), with-build-ca.sh (deploy/docker's).

ARG PYTHON_IMAGE
# hadolint ignore=DL3006
FROM ${PYTHON_IMAGE}

ARG TORCH_INDEX_URL
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

RUN python3 -m venv /usr/local/python3
ENV PATH=/usr/local/python3/bin:${PATH}

# --no-compile: the real image installs vLLM and vllm-ascend from source (`pip install -e`), which
# leaves no bytecode; the project's Dockerfile compiles them.
RUN --mount=type=bind,source=.,target=/tmp/ctx --mount=type=secret,id=build_ca \
    /tmp/ctx/with-build-ca.sh pip install --no-cache-dir --no-compile --no-deps \
        --extra-index-url "${TORCH_INDEX_URL}" -r /tmp/ctx/requirements.txt

COPY Ascend /usr/local/Ascend
RUN --mount=type=bind,source=site,target=/tmp/site \
    cp -r /tmp/site/. "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

CMD ["/bin/bash"]
