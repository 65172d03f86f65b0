"""surfaces/error_status.py: which upstream statuses a client sees as themselves."""

from __future__ import annotations

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.error_status import upstream_client_status


@pytest.mark.parametrize("kind, status, shown", [
    ("timeout", None, 504),
    ("timeout", 500, 504),
    ("upstream_error", 400, 400),
    ("upstream_error", 422, 400),
    ("upstream_error", 404, 404),
    ("upstream_error", 413, 413),
    ("upstream_error", 429, 429),
    ("upstream_error", 408, 504),
    ("upstream_error", 503, 503),
    ("upstream_error", 401, 502),  # the gateway's own credentials: never the client's 401
    ("upstream_error", 403, 502),
    ("upstream_error", 302, 502),
])
def test_statuses(kind, status, shown):
    assert upstream_client_status(GatewayError(kind, "x", status=status)) == shown


def test_529_is_kept_only_for_the_dialect_that_has_it():
    overloaded = GatewayError("upstream_error", "x", status=529)
    assert upstream_client_status(overloaded, keep_529=True) == 529  # Anthropic
    assert upstream_client_status(overloaded) == 503  # OpenAI, Responses, Gemini, Ollama
    assert upstream_client_status(GatewayError("timeout", "x", status=529)) == 504


def test_every_renderer_but_anthropics_shows_an_upstream_529_as_503():
    from homelab_frontend.surfaces.anthropic.errors import render_error as anthropic
    from homelab_frontend.surfaces.gemini.errors import render_error as gemini
    from homelab_frontend.surfaces.ollama.errors import render_error as ollama
    from homelab_frontend.surfaces.openai.errors import render_error as openai
    from homelab_frontend.surfaces.responses.errors import render_error as responses

    err = GatewayError("upstream_error", "busy", status=529)
    assert anthropic(err)[0] == 529
    assert [r(err)[0] for r in (gemini, ollama, openai, responses)] == [503] * 4
