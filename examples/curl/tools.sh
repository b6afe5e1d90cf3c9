#!/usr/bin/env bash
# Tool calling: offer a tool; the answer's choices[0].message.tool_calls holds the call (name and
# JSON arguments) when the model makes one. Send the tool's result back as a "tool" message with
# the call's id (python/tools.py runs the whole loop).
#
#   BASE_URL=http://127.0.0.1:8000/v1 ./tools.sh "What is the weather in Paris?"
# Env: BASE_URL, MODEL, MAX_TOKENS, VLLM_API_KEY (if the server has one),
#      TOOL_CHOICE (auto, required, none; default auto), THINKING (false: off).
# Needs curl >= 7.76.
set -euo pipefail

BASE_URL="${BASE_URL:-http://127.0.0.1:8000/v1}"
MODEL="${MODEL:-minicpm-v-4.6-thinking}"
MAX_TOKENS="${MAX_TOKENS:-1024}"
TOOL_CHOICE="${TOOL_CHOICE:-auto}"
THINKING="${THINKING:-true}"
PROMPT="${1:-What is the weather in Paris?}"

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
  "tools": [{"type": "function", "function": {
    "name": "get_weather",
    "description": "Current weather in one of the cities this service covers",
    "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "enum": ["Paris", "Beijing", "Shanghai", "Tokyo"]},
                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
      "required": ["city"]}}}],
  "tool_choice": $(json_string "$TOOL_CHOICE"),
  "chat_template_kwargs": {"enable_thinking": $THINKING},
  "max_tokens": $MAX_TOKENS
}
JSON
