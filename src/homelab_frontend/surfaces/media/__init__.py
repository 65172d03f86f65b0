"""Relayed model calls: rerank, speech to text, text to speech, images (handler.py's docstring)."""
