"""What a model is, through the gateway, in front of llama.cpp's real `llama-server` (Gemma 3
270M, the shared --parallel 2 server): every dialect's models list says the server's own context
per slot (its /v1/models `meta.n_ctx`), the capabilities its /props tells, and that it is loaded;
read here from the server directly, independently of the gateway."""

from __future__ import annotations

import pytest

from llamaproc import MODEL, get

pytestmark = pytest.mark.timeout(300)


def _expected_caps(props: dict) -> set[str]:
    caps = props.get("chat_template_caps") or {}
    out = {"completion"}
    if caps.get("supports_tool_calls") is True:
        out.add("tools")
    if caps.get("supports_reasoning_effort") is True or caps.get("supports_preserve_reasoning") is True:
        out.add("thinking")
    if (props.get("modalities") or {}).get("vision") is True:
        out.add("vision")
    if (props.get("modalities") or {}).get("audio") is True:
        out.add("audio")
    return out


def test_every_models_list_says_what_the_real_server_says(llama, llama_gw):
    own = get(llama.base + "/models")
    n_ctx = own["data"][0]["meta"]["n_ctx"]
    assert isinstance(n_ctx, int) and n_ctx > 0
    caps = _expected_caps(get(llama.url + "/props"))

    status, doc = llama_gw.get("/llm/v1/models")
    assert status == 200
    entry = {m["id"]: m for m in doc["data"]}[MODEL]
    assert entry["context_length"] == entry["meta"]["n_ctx"] == n_ctx
    assert set(entry["capabilities"]) == caps
    assert entry["state"] == "loaded" and entry["status"] == {"value": "loaded"}
    assert entry["supports_reasoning"] == ("thinking" in caps)

    status, show = llama_gw.post("/api/show", {"model": MODEL})
    assert status == 200 and set(show["capabilities"]) == caps
    assert show["model_info"][f"{show['model_info']['general.architecture']}.context_length"] == n_ctx

    status, tags = llama_gw.get("/api/tags")
    tag = {m["name"]: m for m in tags["models"]}[f"{MODEL}:latest"]
    assert tag["context_length"] == n_ctx and tag["state"] == "loaded"

    status, gem = llama_gw.get("/llm/v1beta/models")
    g = {m["name"]: m for m in gem["models"]}[f"models/{MODEL}"]
    assert g["inputTokenLimit"] == n_ctx and g["thinking"] == ("thinking" in caps)
