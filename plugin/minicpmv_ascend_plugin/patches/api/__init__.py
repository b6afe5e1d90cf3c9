"""Request and response fixes of vLLM's OpenAI API: validators, parsers, reasoning, structured output."""
