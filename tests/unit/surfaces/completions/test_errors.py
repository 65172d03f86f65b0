"""surfaces/completions/errors.py: a GatewayError as llama.cpp's error answer for `/infill`: the
OpenAI surface's status and headers for the same kind, llama.cpp's body shape."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.errors import DEFAULT_STATUS, GatewayError
from homelab_frontend.surfaces.completions.errors import render_error
from homelab_frontend.surfaces.openai.errors import render_error as openai_error


@given(st.sampled_from(sorted(DEFAULT_STATUS)), st.text(min_size=1, max_size=40))
def test_the_status_and_headers_are_the_openai_surfaces_and_the_body_llamacpps(kind, message):
    err = GatewayError(kind, message, retry_after=3 if kind in ("overloaded", "rate_limit") else None)
    status, body, headers = render_error(err)
    o_status, _, o_headers = openai_error(err)
    assert (status, headers) == (o_status, o_headers)
    doc = json.loads(body)
    assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message", "type"}
    assert doc["error"]["code"] == status and doc["error"]["message"] == message


@pytest.mark.parametrize("kind", ["overloaded", "rate_limit"])
def test_a_refusal_to_retry_keeps_its_retry_after(kind):
    _, _, headers = render_error(GatewayError(kind, "busy", retry_after=7))
    assert headers.get("Retry-After", headers.get("retry-after")) == "7"
