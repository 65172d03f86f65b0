"""Code completion: OpenAI's legacy /v1/completions, llama.cpp's /infill, and the raw and suffix
generations of Ollama's /api/generate (docs/code-completion.md)."""
