"""homelab-frontend: one front door for a homelab's OpenAI-compatible LLM servers."""

__version__ = "0.1.0"
