#!/usr/bin/env bash
# Streaming chat (server-sent events): one `data: {...}` line per chunk, then `data: [DONE]`.
# Thinking arrives in choices[0].delta.reasoning, the answer in choices[0].delta.content; the
# last chunk before [DONE] carries the token usage (stream_options.include_usage).
#
#   BASE_URL=http://127.0.0.1:8000/v1 MODEL=minicpm-v-4.6-thinking ./stream.sh "Your question"
# Env: BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server has one). Needs curl >= 7.76.
set -euo pipefail

BASE_URL="${BASE_URL:-http://127.0.0.1:8000/v1}"
MODEL="${MODEL:-minicpm-v-4.6-thinking}"
MAX_TOKENS="${MAX_TOKENS:-1024}"
PROMPT="${1:-Describe a sunrise in two sentences.}"

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

# --no-buffer: print each chunk as it arrives.
api_curl --silent --show-error --fail-with-body --no-buffer "$BASE_URL/chat/completions" \
  -H "Content-Type: application/json" \
  --data-binary @- <<JSON
{
  "model": "$MODEL",
  "messages": [{"role": "user", "content": $(json_string "$PROMPT")}],
  "max_tokens": $MAX_TOKENS,
  "temperature": 0,
  "stream": true,
  "stream_options": {"include_usage": true}
}
JSON
