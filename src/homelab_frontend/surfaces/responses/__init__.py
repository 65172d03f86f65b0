"""The OpenAI Responses surface (POST/GET/DELETE /llm/v1/responses): see handler.py."""
