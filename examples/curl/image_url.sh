#!/usr/bin/env bash
# Image chat with the image given by URL: the *server* downloads it, so IMAGE_URL must be
# reachable from the server, and the server must allow it (ALLOWED_MEDIA_DOMAINS=public: any public
# address; off by default).
#
#   IMAGE_URL=https://example.org/cat.jpg BASE_URL=http://127.0.0.1:8000/v1 ./image_url.sh "What is this?"
# Env: IMAGE_URL (required), BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server has one).
# Needs curl >= 7.76.
set -euo pipefail

BASE_URL="${BASE_URL:-http://127.0.0.1:8000/v1}"
MODEL="${MODEL:-minicpm-v-4.6-thinking}"
MAX_TOKENS="${MAX_TOKENS:-1024}"
IMAGE_URL="${IMAGE_URL:?set IMAGE_URL to an http(s) image URL the server can reach}"
PROMPT="${1:-What is in the picture?}"

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

api_curl --silent --show-error --fail-with-body "$BASE_URL/chat/completions" \
  -H "Content-Type: application/json" \
  --data-binary @- <<JSON | pretty
{
  "model": "$MODEL",
  "messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": $(json_string "$IMAGE_URL")}},
    {"type": "text", "text": $(json_string "$PROMPT")}
  ]}],
  "max_tokens": $MAX_TOKENS,
  "temperature": 0
}
JSON
