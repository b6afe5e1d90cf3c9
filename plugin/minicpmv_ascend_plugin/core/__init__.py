"""What the patches share: the registry, the patch record, vLLM code readers, wrappers and hooks."""
