"""What vLLM loads into its API server: the kit's in-server layer.

- `access`: the API key on every route, vLLM's admin routes off (`AccessControl`, a middleware);
- `request_guard`: the body size limit, text the engine cannot encode (`RequestGuard`, a middleware);
- `tool_calls`: a cut or incomplete tool call is not handed out (`ToolCallGuard`, a middleware);
- `media_urls`: image URLs from public addresses only (`fetch`, called by the plugin's
  public-media-urls patch).

The launcher's settings name the three middleware in vLLM's `--middleware` option; a request meets
them, and the plugin's layers around and behind them, in the order docs/architecture.md draws
("A request"). Nothing here imports the settings or the launcher (tests/test_architecture.py), and
this `__init__` imports nothing, so the plugin's import of `media_urls` loads only that module.
"""
