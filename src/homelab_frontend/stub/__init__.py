"""Stand-in upstreams (vLLM-like, Ollama-like) that speak the real wire formats.

Used by the demo and by every integration test. Per-request behaviour is scripted from a
`[stub key=value ...]` directive in the last user message; see `script.py`.
"""
