"""Rerank and score through the gateway, over real sockets, against the stub's vLLM and
llama.cpp flavours (which follow vLLM 0.32's and llama-server's wire, stub/rerank.py): every
path clients use, the answer as the backend gave it with the client's model name, llama.cpp's
quirks handled, keys' model lists, errors in OpenAI's shape, the slot held and freed, a client
that leaves stopping the backend, and the ledger's rows."""

from __future__ import annotations

import time

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_and_vanish, post_raw
from stubproc import start_stub, wait_for

ALICE, BOB, ADMIN = "sk-alice-rr", "sk-bob-rr", "sk-admin-rr"
ENV = {"ALICE_KEY": ALICE, "BOB_KEY": BOB, "ADMIN_KEY": ADMIN}
AUTH = {"keys": [{"name": "alice", "key_env": "ALICE_KEY", "models": ["rr*"]},
                 {"name": "bob", "key_env": "BOB_KEY", "models": ["chat"]}],
        "admin_key_env": "ADMIN_KEY"}
DOCS = ["The cat sat on the mat.", "Paris is the capital of France.", {"text": "Berlin is a city in Germany."}]


@pytest.fixture(scope="module")
def stubs():
    with start_stub("vllm", "--model", "BAAI/bge-reranker-base") as vllm, \
            start_stub("llamacpp", "--model", "bge-reranker-v2-m3-Q8_0.gguf") as llama:
        yield vllm, llama


@pytest.fixture(scope="module")
def gw(stubs):
    vllm, llama = stubs
    cfg = config_for({"v": {"url": vllm.base, "kind": "vllm", "slots": 1, "queue": {"depth": 4}},
                      "l": {"url": llama.base, "kind": "llamacpp", "slots": 2}},
                     {"rr": {"backend": "v", "upstream_model": "BAAI/bge-reranker-base"},
                      "rr-llama": {"backend": "l", "upstream_model": "bge-reranker-v2-m3-Q8_0.gguf"},
                      "chat": {"backend": "l"}},
                     aliases={"rerank-*": "rr"}, auth=AUTH)
    with Gateway(cfg, env=ENV) as g:
        wait_for(lambda: all(b["up"] for b in g.admin(_auth(ADMIN))["backends"].values()), 10)
        yield g


def _auth(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


def _rerank(gw, path: str, body: dict, key: str = ALICE):
    status, headers, raw = post_raw(gw.url + path, body, _auth(key))
    import json
    return status, headers, json.loads(raw) if raw else None


@pytest.mark.parametrize("path", ["/llm/v1/rerank", "/v1/rerank", "/rerank", "/llm/rerank", "/v2/rerank",
                                  "/llm/v2/rerank"])
def test_every_rerank_path_answers_as_vllm_did_with_the_clients_model(gw, stubs, path):
    vllm, _ = stubs
    status, headers, doc = _rerank(gw, path, {"model": "rerank-small", "query": "capital of France",
                                              "documents": DOCS, "top_n": 2})
    assert status == 200, doc
    assert headers["content-type"].startswith("application/json") and headers["request-id"]
    assert doc["model"] == "rerank-small"  # the alias the client sent, not the backend's id
    assert len(doc["results"]) == 2 and doc["results"][0]["index"] == 1  # top_n, the relevant one first
    assert doc["results"][0]["relevance_score"] > doc["results"][1]["relevance_score"]
    assert doc["results"][0]["document"]["text"] == DOCS[1]
    assert doc["usage"]["total_tokens"] > 0
    sent = vllm.requests()[-1]["body"]
    assert sent["model"] == "BAAI/bge-reranker-base"  # upstream_model
    assert sent["documents"][2] == "Berlin is a city in Germany."  # vLLM takes no {text} objects


def test_llamacpp_gets_strings_and_its_dropped_documents_are_put_back(gw, stubs):
    _, llama = stubs
    status, _, doc = _rerank(gw, "/v1/rerank", {"model": "rr-llama", "query": "capital of France",
                                                "documents": DOCS, "return_documents": True})
    assert status == 200, doc
    assert doc["model"] == "rr-llama" and doc["object"] == "list"
    assert doc["results"][0] == {"index": 1, "relevance_score": doc["results"][0]["relevance_score"],
                                 "document": {"text": DOCS[1]}}
    assert doc["results"][-1]["document"] == DOCS[2]
    assert llama.requests()[-1]["body"]["documents"] == [DOCS[0], DOCS[1], DOCS[2]["text"]]
    assert doc["usage"]["prompt_tokens"] > 0
    # top_n 0: every result, as vLLM reads it (llama.cpp would cut them to none)
    status, _, doc = _rerank(gw, "/v1/rerank", {"model": "rr-llama", "query": "q", "documents": DOCS, "top_n": 0})
    assert status == 200 and len(doc["results"]) == 3


def test_score_on_vllm_and_a_400_naming_the_model_on_llamacpp(gw):
    status, _, doc = _rerank(gw, "/v1/score", {"model": "rr", "text_1": "capital of France",
                                               "text_2": ["Paris is the capital of France.", "cats"]})
    assert status == 200, doc
    assert doc["model"] == "rr" and [d["index"] for d in doc["data"]] == [0, 1]
    assert doc["data"][0]["score"] > doc["data"][1]["score"]
    status, _, doc = _rerank(gw, "/score", {"model": "rr", "queries": "capital", "documents": ["a", "b", "c"]})
    assert status == 200 and len(doc["data"]) == 3
    status, _, doc = _rerank(gw, "/v1/score", {"model": "rr", "text_1": "a"})
    assert status == 400 and doc["error"]["param"] == "text_2"
    status, _, doc = _rerank(gw, "/llm/v1/score", {"model": "rr-llama", "text_1": "a", "text_2": "b"})
    assert status == 400 and doc["error"]["param"] == "model" and "'rr-llama'" in doc["error"]["message"]


def test_bad_input_and_the_backends_own_refusal_in_openais_shape(gw):
    status, _, doc = _rerank(gw, "/v1/rerank", {"model": "nope", "query": "q", "documents": ["a"]})
    assert status == 404 and "rr" in doc["error"]["message"] and "rr-llama" in doc["error"]["message"]
    status, _, doc = _rerank(gw, "/v1/rerank", {"model": "rr", "query": "q"})
    assert status == 400 and doc["error"]["param"] == "documents"
    status, _, doc = _rerank(gw, "/v1/rerank", {"model": "rr", "documents": ["a"]})
    assert status == 400 and doc["error"]["param"] == "query"
    status, _, doc = _rerank(gw, "/v1/rerank", b"not json")
    assert status == 400 and doc["error"]["type"] == "invalid_request_error"
    # the backend refuses (a model that cannot rerank): its status and message, OpenAI's shape
    status, _, doc = _rerank(gw, "/v1/rerank", {"model": "rr", "query": "[stub status=400] q", "documents": ["a"]})
    assert status == 400 and doc["error"]["type"] == "invalid_request_error" and "'v'" in doc["error"]["message"]


def test_a_keys_model_list_applies(gw):
    status, _, doc = _rerank(gw, "/v1/rerank", {"model": "rr", "query": "q", "documents": ["a"]}, key=BOB)
    assert status == 403 and doc["error"]["param"] == "model"
    status, _, _ = _rerank(gw, "/v1/rerank", {"model": "rr", "query": "q", "documents": ["a"]}, key="sk-nobody")
    assert status == 401


def test_the_slot_is_held_to_the_end_and_a_second_call_queues(gw, stubs):
    vllm, _ = stubs
    vllm.reset()
    import threading

    results = []

    def call():
        results.append(_rerank(gw, "/v1/rerank", {"model": "rr", "query": "[stub delay_ms=200] capital",
                                                  "documents": ["a", "b", "c"]})[0])

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    admin = wait_for(lambda: (a := gw.admin(_auth(ADMIN)))["backends"]["v"]["queued"] == 1 and a, 10)
    assert admin["backends"]["v"]["in_use"] == 1
    for t in threads:
        t.join(30)
    assert results == [200, 200]
    assert vllm.stats()["max_in_flight"] == 1  # the backend never saw two at once
    wait_for(lambda: gw.admin(_auth(ADMIN))["backends"]["v"]["in_use"] == 0, 2)


def test_a_client_that_leaves_mid_rerank_stops_the_backend_and_frees_the_slot(gw, stubs):
    vllm, _ = stubs
    before = vllm.log_text().count("cancelled")
    post_and_vanish(gw.url + "/v1/rerank", {"model": "rr", "query": "[stub delay_ms=500] capital",
                                           "documents": ["a", "b", "c", "d"]},
                    headers=_auth(ALICE), when=lambda: vllm.stats()["in_flight"] == 1)
    wait_for(lambda: vllm.log_text().count("cancelled") == before + 1, 2)
    wait_for(lambda: vllm.stats()["in_flight"] == 0, 2)
    wait_for(lambda: gw.admin(_auth(ADMIN))["backends"]["v"]["in_use"] == 0, 2)
    rec = wait_for(lambda: [r for r in gw.access_log() if r["outcome"].startswith("cancelled")], 2)
    assert rec[-1]["dialect"] == "rerank" and rec[-1]["status"] == 499


def test_the_ledger_counts_documents_and_the_backends_tokens(gw):
    def rows():
        status, doc = gw.get("/admin/usage?key=alice&model=rr-llama", _auth(ADMIN))
        assert status == 200, doc
        return doc["rows"]

    before = sum(r["documents"] for r in rows())
    status, _, doc = _rerank(gw, "/v1/rerank", {"model": "rr-llama", "query": "q", "documents": ["a", "b", "c", "d"]})
    assert status == 200
    got = wait_for(lambda: (r := rows()) and sum(x["documents"] for x in r) == before + 4 and r, 5)
    assert sum(x["input_tokens"] for x in got) >= doc["usage"]["prompt_tokens"]
    status, own = gw.get("/llm/v1/usage", _auth(ALICE))
    assert status == 200 and any(r["documents"] for r in own["rows"])
