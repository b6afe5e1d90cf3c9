#!/usr/bin/env bash
# Text chat with thinking turned off: the chat template closes the <think> block itself, so the
# model answers directly in .choices[0].message.content and `reasoning` is null.
#
#   BASE_URL=http://127.0.0.1:8000/v1 MODEL=minicpm-v-4.6-thinking ./thinking_off.sh "Your question"
# Env: BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server has one). Needs curl >= 7.76.
set -euo pipefail

BASE_URL="${BASE_URL:-http://127.0.0.1:8000/v1}"
MODEL="${MODEL:-minicpm-v-4.6-thinking}"
MAX_TOKENS="${MAX_TOKENS:-256}"
PROMPT="${1:-What is 2+3? Answer with a number.}"

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
  "messages": [{"role": "user", "content": $(json_string "$PROMPT")}],
  "chat_template_kwargs": {"enable_thinking": false},
  "max_tokens": $MAX_TOKENS,
  "temperature": 0
}
JSON
