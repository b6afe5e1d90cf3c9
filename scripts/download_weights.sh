#!/usr/bin/env bash
# Download a MiniCPM-V model from ModelScope into a model directory, then verify it.
#
#   scripts/download_weights.sh [--model NAME] [MODEL_DIR]
#
# NAME (or env MODEL) picks the model by the name the server gives it (or its config.json
# model_type); the ModelScope repository of each is src/minicpmv_ascend/common/models.py's
# `modelscope_id` (tests/test_deploy_scripts.py keeps the list below equal to it):
#   minicpm-v-4.6-thinking  (default; minicpmv4_6)  OpenBMB/MiniCPM-V-4.6-Thinking
#   minicpm-v-4.7           (minicpmv4_7)           OpenBMB/MiniCPM-V-4.7-1B  (needs the v0.32.0rc1 target)
# MODEL_DIR (argument, or env MODEL_DIR; default ./models) receives the repository's last name, e.g.
# MiniCPM-V-4.6-Thinking/: mount MODEL_DIR at /models and set MODEL_PATH=/models/MiniCPM-V-4.6-Thinking
# (as compose.yaml and env/ascend.env do). Per-file progress bars are shown; an interrupted
# download resumes when run again. Needs the `modelscope` CLI (`pip install modelscope`; the
# vllm-ascend image has it).
#
# Environment:
#   MODEL           the model's name, as --model (default minicpm-v-4.6-thinking)
#   MODEL_ID        ModelScope model id; overrides the model's (e.g. the 4.6 instruct model,
#                   OpenBMB/MiniCPM-V-4.6)
#   MODEL_REVISION  branch, tag or commit to download (default: the repository's default branch)
#   MODELSCOPE      the modelscope command (default: modelscope)
#   MODEL_DIR_ON_HOST  the host folder mounted as MODEL_DIR, for the closing hint (compose's
#                   `weights` service sets it)
#   PYTHON          Python that runs scripts/verify_model_dir.py (default: python3; 3.7 or newer,
#                   standard library only: the Python of Kylin V10 / EulerOS hosts will do)
#
# Files are created readable by everyone (umask 022), whatever the shell's umask: the container
# reads them as UID 1000, and a hardened host's umask 077 would leave them unreadable to it. The
# weights are a public download; nothing secret is widened.
#
# Exit status: 0 downloaded and verified complete; 1 not complete yet (an interrupted or failed
# download): run it again, it resumes; 2 usage or environment error (an unknown model, no
# modelscope, MODEL_DIR not writable); 4 downloaded, but this Python could not verify it (the
# message says how to).
set -euo pipefail
umask 022

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
usage="usage: download_weights.sh [--model minicpm-v-4.6-thinking|minicpm-v-4.7] [MODEL_DIR]"
model="${MODEL:-minicpm-v-4.6-thinking}"
while [ $# -gt 0 ]; do
    case "$1" in
        --model) [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
                 model="$2"; shift 2 ;;
        --model=*) model="${1#--model=}"; shift ;;
        -h|--help) echo "$usage"; exit 0 ;;
        -*) echo "download_weights.sh: unknown option $1; $usage" >&2; exit 2 ;;
        *) break ;;
    esac
done
[ $# -le 1 ] || { echo "download_weights.sh: one MODEL_DIR at most; $usage" >&2; exit 2; }

# One line per declared model: its names, then its ModelScope repository (common/models.py).
case "$model" in
    minicpm-v-4.6-thinking|minicpmv4_6) model_repo=OpenBMB/MiniCPM-V-4.6-Thinking ;;
    minicpm-v-4.7|minicpmv4_7) model_repo=OpenBMB/MiniCPM-V-4.7-1B ;;
    *) echo "download_weights.sh: unknown model '$model': minicpm-v-4.6-thinking (default) or" \
            "minicpm-v-4.7 (or MODEL_ID=<ModelScope id> for another repository)" >&2
       exit 2 ;;
esac

model_dir="${1:-${MODEL_DIR:-./models}}"
model_id="${MODEL_ID:-$model_repo}"
modelscope="${MODELSCOPE:-modelscope}"
python="${PYTHON:-python3}"
dest="$model_dir/${model_id##*/}"

if ! command -v "$modelscope" >/dev/null 2>&1; then
    echo "download_weights.sh: '$modelscope' not found: pip install modelscope (or set MODELSCOPE)" >&2
    exit 2
fi

revision_args=()
if [ -n "${MODEL_REVISION:-}" ]; then
    revision_args=(--revision "$MODEL_REVISION")
fi

# Writable by this user? A volume that ignores Kubernetes' fsGroup (NFS and other shared-file
# drivers) stays owned by its export's user: say so here, not in a traceback of the download.
if ! mkdir -p "$dest" 2>/dev/null || ! touch "$dest/.write-test" 2>/dev/null; then
    owner="$(stat -c '%u:%g, mode %a' "$model_dir" 2>/dev/null || echo unknown)"
    echo "download_weights.sh: cannot write to $dest as uid $(id -u), gid $(id -g) ($model_dir: owner $owner)." >&2
    echo "  Make it writable by this user: on a host, chown or chmod $model_dir; for a Kubernetes volume" >&2
    echo "  that ignores fsGroup (NFS), make the export writable by UID 1000 (chown 1000:1000 on the NFS" >&2
    echo "  server, or all_squash,anonuid=1000,anongid=1000), or run the download Job as the export's owner" >&2
    echo "  (docs/deploy-ascend.md, \"Storage\")." >&2
    exit 2
fi
rm -f "$dest/.write-test"
echo "== downloading $model_id${MODEL_REVISION:+ @ $MODEL_REVISION} from ModelScope into $dest"
"$modelscope" download --model "$model_id" "${revision_args[@]}" --local_dir "$dest"

echo "== verifying $dest"
status=0
"$python" "$here/verify_model_dir.py" "$dest" || status=$?
# verify_model_dir.py: 0 complete, 3 incomplete; anything else (2: usage or a Python older than
# 3.7, 1: a crash, 127: no such Python) is no verdict on the files, so never "run again".
case "$status" in
    0) ;;
    3) echo "download_weights.sh: the checkpoint in $dest is incomplete: run this script again (it resumes)" >&2
       exit 1 ;;
    *) echo "download_weights.sh: downloaded, but '$python' could not verify it (exit $status; it needs" \
            "Python 3.7 or newer): PYTHON=/path/to/python3.7+ $here/verify_model_dir.py $dest" >&2
       exit 4 ;;
esac

# In compose's `weights` service MODEL_DIR is the container's /models: name the host's folder.
host_dir="${MODEL_DIR_ON_HOST:-$model_dir}"
echo "== done. Serve it with MODEL_PATH=/models/${dest##*/} and $host_dir mounted at /models:"
echo "   MODEL_DIR=$host_dir docker compose up -d minicpmv"
