#!/usr/bin/env bash
# Structured output: choices[0].message.content is JSON following the schema (strict). With
# thinking on, the reasoning comes first (message.reasoning), then the constrained JSON.
#
#   BASE_URL=http://127.0.0.1:8000/v1 ./json_schema.sh "Is Paris the capital of France?"
# Env: BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server has one), THINKING (false: off).
# Needs curl >= 7.76.
set -euo pipefail

BASE_URL="${BASE_URL:-http://127.0.0.1:8000/v1}"
MODEL="${MODEL:-minicpm-v-4.6-thinking}"
MAX_TOKENS="${MAX_TOKENS:-1024}"
THINKING="${THINKING:-true}"
PROMPT="${1:-Is Paris the capital of France?}"

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
  "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "strict": true, "schema": {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no", "unsure"]},
                   "confidence": {"type": "integer", "minimum": 0, "maximum": 10}},
    "required": ["answer", "confidence"], "additionalProperties": false}}},
  "chat_template_kwargs": {"enable_thinking": $THINKING},
  "max_tokens": $MAX_TOKENS
}
JSON
