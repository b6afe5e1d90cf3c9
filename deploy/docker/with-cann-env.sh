#!/bin/bash
# Ascend image entrypoint wrapper: set up the CANN environment, then exec the command.
#
#   with-cann-env.sh COMMAND [ARGS...]
#
# Why it exists: the official vllm-ascend image sets CANN up in two places that a container started
# by an orchestrator with this project's ENTRYPOINT never reaches:
#   - its base image's ENTRYPOINT, `bash -c 'source <toolkit>/set_env.sh && source
#     <ascendnpu-ir>/set_env.sh && source <nnal>/atb/set_env.sh --cxx_abi=1 && exec "$@"'`,
#     which our ENTRYPOINT (tini + this script + the launcher) replaces;
#   - root's ~/.bashrc (the same three `source` lines, LD_PRELOAD of jemalloc, /usr/local/lib on
#     LD_LIBRARY_PATH), which only an interactive bash of root reads; we run non-interactive and
#     non-root.
# So this script performs the same steps and then `exec`s: the shell is replaced by the command,
# nothing stays between tini (PID 1) and the launcher, which in turn execs vLLM. Sourcing the
# set_env.sh files that the installed CANN ships (rather than copying their values into ENV lines
# of the Dockerfile) keeps the image right when the base image's CANN version changes.
#
# Environment:
#   MINICPMV_ASCEND_ROOT    where CANN is installed (default /usr/local/Ascend; tests use a fake tree)
#   ATB_CXX_ABI             passed to NNAL's set_env.sh as --cxx_abi (default 1, as the base image)
#   MINICPMV_SKIP_CANN_ENV  1: exec the command unchanged (debugging a broken CANN install)

if [ "$#" -eq 0 ]; then
    echo "usage: with-cann-env.sh COMMAND [ARGS...]" >&2
    exit 2
fi

# The set_env.sh files are sourced, so they would see this script's arguments (the command line of
# vLLM) as their own: keep the command aside and clear the positional parameters first.
command=("$@")
set --

if [ "${MINICPMV_SKIP_CANN_ENV:-0}" != "1" ]; then
    root="${MINICPMV_ASCEND_ROOT:-/usr/local/Ascend}"
    toolkit_env="$root/ascend-toolkit/set_env.sh"
    atb_env="$root/nnal/atb/set_env.sh"
    for required in "$toolkit_env" "$atb_env"; do
        if [ ! -f "$required" ]; then
            echo "with-cann-env.sh: $required not found: this image must be built FROM a vllm-ascend" \
                 "image (CANN toolkit + NNAL), or set MINICPMV_SKIP_CANN_ENV=1 to start without CANN" >&2
            exit 1
        fi
    done
    # shellcheck source=/dev/null
    source "$toolkit_env" || { echo "with-cann-env.sh: sourcing $toolkit_env failed" >&2; exit 1; }
    # The bisheng/ascendnpu-ir environment (CANN >= 9) lives under the versioned toolkit directory.
    ir_env="${ASCEND_TOOLKIT_HOME:-$root/ascend-toolkit/latest}/share/info/ascendnpu-ir/bin/set_env.sh"
    if [ ! -f "$ir_env" ]; then
        ir_env=""
        for candidate in "$root"/cann-*/share/info/ascendnpu-ir/bin/set_env.sh; do
            [ -f "$candidate" ] && ir_env="$candidate"  # the glob is sorted: the last is the newest
        done
    fi
    if [ -n "$ir_env" ]; then
        # shellcheck source=/dev/null
        source "$ir_env" || { echo "with-cann-env.sh: sourcing $ir_env failed" >&2; exit 1; }
    fi
    # shellcheck source=/dev/null
    source "$atb_env" --cxx_abi="${ATB_CXX_ABI:-1}" || {
        echo "with-cann-env.sh: sourcing $atb_env failed" >&2; exit 1; }
    set --  # whatever the sourced files left in the positional parameters is not ours

    # What the vllm-ascend image adds to ~/.bashrc: jemalloc preloaded, /usr/local/lib searched.
    jemalloc="/usr/lib/$(uname -m)-linux-gnu/libjemalloc.so.2"
    if [ -f "$jemalloc" ] && [[ ":${LD_PRELOAD:-}:" != *":$jemalloc:"* ]]; then
        export LD_PRELOAD="$jemalloc${LD_PRELOAD:+:$LD_PRELOAD}"
    fi
    if [[ ":${LD_LIBRARY_PATH:-}:" != *":/usr/local/lib:"* ]]; then
        export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/lib"
    fi
fi

exec "${command[@]}"
