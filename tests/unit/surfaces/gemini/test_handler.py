"""surfaces/gemini/handler.py: which client is Google's, on the paths the Gemini and OpenAI
dialects share (`GET /llm/v1/models`); the rest of the handler is glue over the skeleton, run by
tests/integration/test_gemini.py."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from homelab_frontend.surfaces.gemini.handler import is_google_client


@pytest.mark.parametrize("path, headers, google", [
    ("/llm/v1/models", {"x-goog-api-key": "k"}, True),
    ("/llm/v1/models", {"x-goog-api-client": "google-genai-sdk/1.0 gl-python/3.11"}, True),
    ("/llm/v1/models?key=k", {}, True),
    ("/llm/v1/models", {"authorization": "Bearer k"}, False),  # the OpenAI SDK
    ("/llm/v1/models", {"x-api-key": "k"}, False),
    ("/llm/v1/models?limit=5", {}, False),
])
def test_googles_clients_are_told_apart_by_their_key_or_client_header(path, headers, google):
    assert is_google_client(make_mocked_request("GET", path, headers=headers)) is google
