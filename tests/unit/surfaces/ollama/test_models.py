"""Model names, /api/tags, /api/ps and /api/show documents, and Ollama error rendering, with the
`ollama` library's own response types as the oracle."""

from __future__ import annotations

import json

import ollama
import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.ollama.errors import model_not_found, render_error
from homelab_frontend.surfaces.ollama.models import merge_facts, ps_entry, show_document, tag_name, tags_entry
from homelab_frontend.upstream.capabilities import Facts

NOW = "2026-12-01T21:00:00.000000000Z"


@pytest.mark.parametrize("name,tagged", [
    ("reasoning", "reasoning:latest"), ("qwen2.5:3b", "qwen2.5:3b"), ("ns/model", "ns/model:latest"),
    ("ns/model:q4", "ns/model:q4"), ("host:5000/ns/model", "host:5000/ns/model:latest"),
])
def test_tag_names(name, tagged):
    assert tag_name(name) == tagged


def test_tags_and_ps_documents_validate_as_the_librarys_types():
    tags = ollama.ListResponse(models=[tags_entry("reasoning", NOW), tags_entry("qwen2.5:3b", NOW)])
    assert [m.model for m in tags.models] == ["reasoning:latest", "qwen2.5:3b"]
    entry = tags_entry("reasoning", NOW)
    assert entry["name"] == entry["model"]  # Open WebUI matches /api/ps to /api/tags by name
    ps = ollama.ProcessResponse(models=[ps_entry("reasoning", 4096)])
    assert ps.models[0].name == "reasoning:latest" and ps.models[0].context_length == 4096
    assert ps.models[0].digest == entry["digest"]


def test_show_without_a_source_claims_only_completion():
    facts = merge_facts([], None)
    doc = show_document("chat:latest", facts, 8192, NOW)
    resp = ollama.ShowResponse(**doc)
    assert resp.capabilities == ["completion"]
    assert resp.modelinfo["general.architecture"] == "unknown"
    assert resp.modelinfo["unknown.context_length"] == 8192  # VS Code reads <arch>.context_length
    assert resp.modelinfo["general.basename"] == "chat"
    assert "template" not in doc and "parameters" not in doc  # only when known


def test_show_from_the_config_and_from_backends():
    assert merge_facts([], ["completion", "tools", "vision"]).capabilities == ("completion", "tools", "vision")
    a = Facts(("completion", "tools", "thinking"), {"general.architecture": "qwen3", "qwen3.context_length": 40960},
              {"family": "qwen3", "parameter_size": "8B"}, "{{ .Prompt }}", "stop <|im_end|>", 40960)
    b = Facts(("completion", "tools"), context_length=8192)
    merged = merge_facts([a, b], ["embedding"])  # backends that tell win over the config
    assert merged.capabilities == ("completion", "tools")  # only what all of them agree on
    doc = show_document("qwen3:8b", merged, None, NOW)
    resp = ollama.ShowResponse(**doc)
    assert resp.modelinfo["qwen3.context_length"] == 8192 and resp.modelinfo["general.basename"] == "qwen3"
    assert resp.template == "{{ .Prompt }}" and resp.details.family == "qwen3"
    # the gateway's own context figure wins: what a request may really use
    assert show_document("qwen3:8b", merged, 4096, NOW)["model_info"]["qwen3.context_length"] == 4096


@pytest.mark.parametrize("kind,status", [
    ("invalid_request", 400), ("authentication", 401), ("permission", 403), ("not_found", 404),
    ("request_too_large", 413), ("rate_limit", 429), ("overloaded", 503), ("api_error", 500),
    ("backend_down", 503), ("timeout", 504), ("upstream_unreachable", 502),
])
def test_error_statuses_and_shape(kind, status):
    got, body, headers = render_error(GatewayError(kind, "why", retry_after=2.5 if kind == "overloaded" else None))
    assert got == status and json.loads(body) == {"error": "why"}
    if kind == "overloaded":
        assert headers == {"retry-after": "3"}


def test_upstream_statuses_pass_through_as_the_others_do():
    assert render_error(GatewayError("upstream_error", "x", status=529))[0] == 503
    assert render_error(GatewayError("upstream_error", "x", status=400))[0] == 400
    assert render_error(GatewayError("upstream_error", "x", status=401))[0] == 502


def test_model_not_found_in_ollamas_words():
    status, body, _ = render_error(model_not_found("llama3:latest", ["reasoning:latest"]))
    assert status == 404
    assert json.loads(body)["error"].startswith('model "llama3:latest" not found')
    err = ollama.ResponseError(body.decode(), status)
    assert err.status_code == 404 and err.error.startswith('model "llama3:latest" not found')
