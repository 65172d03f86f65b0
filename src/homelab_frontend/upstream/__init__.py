"""Talking to OpenAI-compatible backends: the pooled client, bounded reads, the request body, the one chunk decoder."""
