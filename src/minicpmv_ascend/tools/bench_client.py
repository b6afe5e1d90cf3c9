"""vLLM's `vllm bench serve`, able to send chat requests unstreamed.

vLLM's chat benchmark client (`--backend openai-chat`) always sends `"stream": true` and reads
server-sent events; a request whose `--extra-body` sets `"stream": false` gets one JSON answer that
client cannot read (every request fails). The host-side cost of streaming (a chunk per token:
detokenize, serialize, send) is what the harness compares, so this module runs vLLM's own CLI with
one change: where a request's extra body says `"stream": false`, it is sent and read unstreamed.
Everything else stays vLLM's (datasets, concurrency, metrics, result file). An unstreamed answer
arrives whole: TTFT is its end-to-end latency, there is no ITL, and TPOT reads 0.

    python -m minicpmv_ascend.tools.bench_client bench serve --backend openai-chat ... \
        --extra-body '{"stream": false}'

Streamed requests go to vLLM's own function untouched.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

from minicpmv_ascend import vllm_cli


def _unstreamed_chat(original: Any) -> Any:
    from vllm.benchmarks.lib import endpoint_request_func as erf

    async def request(request_func_input: Any, session: Any, pbar: Any = None, mm_position: str = "last") -> Any:
        if (request_func_input.extra_body or {}).get("stream", True) is not False:
            return await original(request_func_input, session, pbar, mm_position)
        messages = request_func_input.chat_messages
        if messages is None:
            messages = erf._get_chat_messages(request_func_input, mm_position=mm_position)
        payload = {"model": request_func_input.model_name or request_func_input.model, "messages": messages,
                   "max_completion_tokens": request_func_input.output_len}
        erf._update_payload_common(payload, request_func_input)  # extra body (stream: false), ignore_eos
        headers = erf._get_headers("application/json")
        erf._update_headers_common(headers, request_func_input)
        output = erf.RequestFuncOutput(prompt_len=request_func_input.prompt_len)
        output.start_time = started = time.perf_counter()
        try:
            async with session.post(url=request_func_input.api_url, json=payload, headers=headers) as response:
                body = await response.read()
                if response.status == 200:
                    answer = json.loads(body)
                    output.latency = output.ttft = time.perf_counter() - started
                    output.generated_text = answer["choices"][0]["message"].get("content") or ""
                    usage = answer.get("usage") or {}
                    output.output_tokens = usage.get("completion_tokens") or 0
                    if usage.get("prompt_tokens") is not None:
                        output.prompt_len = usage["prompt_tokens"]
                    output.success = True
                else:
                    output.error = body.decode(errors="replace")[:500] or response.reason or ""
        except Exception:  # noqa: BLE001 - as vLLM's own client: the error is the request's result
            output.error = "".join(traceback.format_exception(*sys.exc_info()))
        if pbar:
            pbar.update(1)
        return output

    return request


def install() -> None:
    """Route vLLM's `openai-chat` benchmark requests through _unstreamed_chat."""
    from vllm.benchmarks.lib import endpoint_request_func as erf

    erf.ASYNC_REQUEST_FUNCS["openai-chat"] = _unstreamed_chat(erf.ASYNC_REQUEST_FUNCS["openai-chat"])


def main() -> None:
    vllm_cli._install_version_alias()  # before vLLM's first import, as vllm_cli.main does
    install()
    vllm_cli.main()


if __name__ == "__main__":
    main()
