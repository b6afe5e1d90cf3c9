#!/usr/bin/env bash
# Image chat with the image inline as a base64 data URL: no network access needed on either side.
# Uses only bash, coreutils and curl. The default picture ships next to this script.
#
#   IMAGE=photo.jpg BASE_URL=http://127.0.0.1:8000/v1 ./image_base64.sh "What is in the picture?"
# Env: IMAGE (png/jpg/jpeg/webp/gif), BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server
# has one), THINKING (true|false, default true). Needs curl >= 7.76.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BASE_URL="${BASE_URL:-http://127.0.0.1:8000/v1}"
MODEL="${MODEL:-minicpm-v-4.6-thinking}"
MAX_TOKENS="${MAX_TOKENS:-1024}"
THINKING="${THINKING:-true}"
IMAGE="${IMAGE:-$HERE/../images/red_square.png}"
PROMPT="${1:-What colour is the square?}"

case "${IMAGE,,}" in
  *.png) mime=image/png ;;
  *.jpg | *.jpeg) mime=image/jpeg ;;
  *.webp) mime=image/webp ;;
  *.gif) mime=image/gif ;;
  *) echo "IMAGE=$IMAGE: unsupported extension (png, jpg, jpeg, webp, gif)" >&2; exit 2 ;;
esac
[ -r "$IMAGE" ] || { echo "IMAGE=$IMAGE: cannot read the file" >&2; exit 2; }
case "$THINKING" in true | false) ;; *) echo "THINKING must be true or false" >&2; exit 2 ;; esac

# JSON string literal for arbitrary text (backslashes, quotes, newlines, tabs).
json_string() {
  local s="${1//\\/\\\\}"
  s="${s//\"/\\\"}"
  s="${s//$'\n'/\\n}"
  s="${s//$'\t'/\\t}"
  printf '"%s"' "$s"
}

# The API key reaches curl through a config on a file descriptor, not argv, so `ps` never shows it.
api_curl() {
  if [ -n "${VLLM_API_KEY:-}" ]; then
    curl --config <(printf 'header = "Authorization: Bearer %s"\n' "$VLLM_API_KEY") "$@"
  else
    curl "$@"
  fi
}

pretty() { if command -v jq >/dev/null 2>&1; then jq .; else cat; echo; fi; }

# The body is streamed to curl on stdin: a photo's base64 is too long for a command-line argument.
{
  printf '{"model": "%s", "max_tokens": %s, "temperature": 0,' "$MODEL" "$MAX_TOKENS"
  printf ' "chat_template_kwargs": {"enable_thinking": %s},' "$THINKING"
  printf ' "messages": [{"role": "user", "content": ['
  printf '{"type": "image_url", "image_url": {"url": "data:%s;base64,' "$mime"
  base64 <"$IMAGE" | tr -d '\n'
  printf '"}}, {"type": "text", "text": %s}]}]}' "$(json_string "$PROMPT")"
} | api_curl --silent --show-error --fail-with-body "$BASE_URL/chat/completions" \
  -H "Content-Type: application/json" --data-binary @- | pretty
