"""The Anthropic Messages surface: request parsing, the SSE encoder, whole-message assembly, errors."""
