#!/usr/bin/env bash
# Download MiniCPM-V-4.6-Thinking from ModelScope into a model directory, then verify it.
#
#   scripts/download_weights.sh [MODEL_DIR]
#
# MODEL_DIR (argument, or env MODEL_DIR; default ./models) receives MiniCPM-V-4.6-Thinking/: mount
# MODEL_DIR at /models and set MODEL_PATH=/models/MiniCPM-V-4.6-Thinking (as compose.yaml and
# env/ascend-*.env do). Per-file progress bars are shown; an interrupted download resumes when run
# again. Needs the `modelscope` CLI (`pip install modelscope`; the vllm-ascend image has it).
#
# Environment:
#   MODEL_ID        ModelScope model id (default OpenBMB/MiniCPM-V-4.6-Thinking; the instruct
#                   model is OpenBMB/MiniCPM-V-4.6)
#   MODEL_REVISION  branch, tag or commit to download (default: the repository's default branch)
#   MODELSCOPE      the modelscope command (default: modelscope)
#   PYTHON          Python that runs scripts/verify_model_dir.py (default: python3; it needs this
#                   project's dependencies, e.g. .venv/bin/python or the image's python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
model_dir="${1:-${MODEL_DIR:-./models}}"
model_id="${MODEL_ID:-OpenBMB/MiniCPM-V-4.6-Thinking}"
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

mkdir -p "$dest"
echo "== downloading $model_id${MODEL_REVISION:+ @ $MODEL_REVISION} from ModelScope into $dest"
"$modelscope" download --model "$model_id" "${revision_args[@]}" --local_dir "$dest"

echo "== verifying $dest"
status=0
"$python" "$here/verify_model_dir.py" "$dest" || status=$?
case "$status" in
    0) ;;
    1) echo "download_weights.sh: the checkpoint in $dest is incomplete: run this script again" >&2
       exit 1 ;;
    *) echo "download_weights.sh: could not verify here (exit $status); verify with the project's" \
            "Python: PYTHON=.venv/bin/python $here/verify_model_dir.py $dest" >&2 ;;
esac

echo "== done. Serve it with MODEL_PATH=/models/${dest##*/} and $model_dir mounted at /models:"
echo "   MODEL_DIR=$model_dir docker compose up -d minicpmv"
