"""What real servers answer on GET /v1/models, trimmed: the samples the unit tests of kind
detection and of context lengths read."""

# what the real llama-server 11434.0.0 answers on GET /v1/models (trimmed)
LLAMA_MODELS = {
    "models": [{"name": "gemma-3-270m", "model": "gemma-3-270m", "capabilities": ["completion"]}],
    "object": "list",
    "data": [{"id": "gemma-3-270m", "object": "model", "created": 1, "owned_by": "llamacpp",
              "meta": {"n_ctx": 1024, "n_ctx_train": 32768}}],
}
VLLM_MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 4096}]}
OLLAMA_MODELS = {"object": "list", "data": [{"id": "qwen2.5:3b-instruct", "object": "model", "owned_by": "library"},
                                            {"id": "bob/x:7b", "object": "model", "owned_by": "bob"}]}
OPENAI_MODELS = {"object": "list", "data": [{"id": "gpt-4o", "object": "model", "owned_by": "system"}]}
