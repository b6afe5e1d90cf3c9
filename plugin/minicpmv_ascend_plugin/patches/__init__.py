"""The patches, one module each, grouped by what they fix (core/registry.py lists them in order)."""
