"""Rerank and score through the gateway against a real vLLM 0.32 (the CPU build's pooling runner
serving all-MiniLM-L6-v2, tests/vllmscoreproc.py), started once for the module.

What is proved:
- rerank's answer is right: for "What is the capital of France?" the document about Paris comes
  first, through /v1/rerank, /rerank, /v2/rerank and /llm/v1/rerank alike, cut to top_n, the
  client's model name echoed where vLLM names its own, and the scores and usage the same as vLLM
  gives a direct client (the gateway relays them, it does not make them up);
- Jina's `{text}` documents, which vLLM itself refuses, are answered right through the gateway;
- /v1/score pairs one query with each document in order, the Paris one scoring highest;
- a model the gateway does not know is its 404 naming the models, never a 500;
- a client that leaves a large rerank mid-way stops it at vLLM: vLLM finishes fewer of its
  per-document requests than the rerank holds (its own counter: one engine request for the query
  and one per document), runs nothing afterwards, and the gateway frees the slot; the same rerank
  left to finish runs every document (the control: the request was valid, only the leaving cut it).
"""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest

from gwproc import Gateway
from stubproc import wait_for
from vllmscoreproc import MODEL, SERVED, ScoreVllm, require_score_vllm, score_config

pytestmark = [pytest.mark.xdist_group("scorer"), pytest.mark.timeout(900)]

QUERY = "What is the capital of France?"
DOCS = ["Bananas are a yellow fruit rich in potassium.",
        "Paris is the capital and largest city of France.",
        "The Rhine flows through Germany and the Netherlands."]


@pytest.fixture(scope="module")
def scorer():
    require_score_vllm()
    with ScoreVllm() as server:
        print(f"pooling vLLM ready in {server.ready_after:.1f} s")
        yield server


@pytest.fixture(scope="module")
def gw(scorer):
    with Gateway(score_config(scorer.base)) as g:
        wait_for(lambda: all(b["up"] for b in g.admin()["backends"].values()), 60)
        yield g


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank", "/llm/v1/rerank"])
def test_rerank_puts_the_relevant_document_first_as_vllm_scores_it(gw, scorer, path):
    status, doc = gw.post(path, {"model": MODEL, "query": QUERY, "documents": DOCS, "top_n": 2})
    assert status == 200, doc
    assert [r["index"] for r in doc["results"]][0] == 1 and len(doc["results"]) == 2
    assert doc["results"][0]["relevance_score"] > doc["results"][1]["relevance_score"]
    assert doc["model"] == MODEL
    d_status, direct = scorer.post("/rerank", {"model": SERVED, "query": QUERY, "documents": DOCS, "top_n": 2})
    assert d_status == 200
    assert [(r["index"], r["relevance_score"]) for r in doc["results"]] == \
        [(r["index"], pytest.approx(r["relevance_score"], abs=1e-4)) for r in direct["results"]]
    assert doc["usage"]["total_tokens"] == direct["usage"]["total_tokens"] > 0


def test_jina_text_objects_are_reranked_though_vllm_refuses_them_itself(gw, scorer):
    objects = [{"text": d} for d in DOCS]
    status, _ = scorer.post("/rerank", {"model": SERVED, "query": QUERY, "documents": objects})
    assert status == 400  # vLLM's own pydantic model takes strings or {content: [...]}
    status, doc = gw.post("/v1/rerank", {"model": MODEL, "query": QUERY, "documents": objects,
                                         "return_documents": True})
    assert status == 200, doc
    assert doc["results"][0]["index"] == 1 and doc["results"][0]["document"]["text"] == DOCS[1]


def test_score_pairs_the_query_with_each_document_in_order(gw):
    status, doc = gw.post("/v1/score", {"model": MODEL, "text_1": QUERY, "text_2": DOCS})
    assert status == 200, doc
    assert [d["index"] for d in doc["data"]] == [0, 1, 2]
    scores = [d["score"] for d in doc["data"]]
    assert scores.index(max(scores)) == 1 and doc["model"] == MODEL


def test_an_unknown_model_is_a_404_naming_the_models(gw):
    status, doc = gw.post("/v1/rerank", {"model": "nope", "query": QUERY, "documents": DOCS})
    assert status == 404 and MODEL in json.dumps(doc)


def test_a_client_gone_mid_rerank_stops_it_at_vllm(gw, scorer):
    documents = [f"Document {i}: " + " ".join(["the city of lights on the river"] * 25) for i in range(64)]
    body = json.dumps({"model": MODEL, "query": QUERY, "documents": documents}).encode()
    done0 = scorer.scored_requests()
    host, port = gw.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(b"POST /v1/rerank HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    # gone once vLLM itself is running the documents
    wait_for(lambda: scorer.running() > 0 or scorer.scored_requests() > done0, timeout=60, interval=0.05)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()
    # idle: a rerank not aborted would still be running the rest of its documents
    wait_for(scorer.idle, timeout=60, interval=0.25)
    finished = scorer.scored_requests() - done0
    assert scorer.idle() and finished < len(documents), f"vLLM finished {finished} of {len(documents)}"
    wait_for(lambda: all(b["in_use"] == 0 for b in gw.admin()["backends"].values()), timeout=30)
    # the control: the same rerank, left to finish, runs every document (and is a valid request)
    before = scorer.scored_requests()
    req = urllib.request.Request(gw.url + "/v1/rerank", method="POST", headers={"content-type": "application/json"},
                                 data=json.dumps({"model": MODEL, "query": QUERY, "documents": documents,
                                                  "top_n": 1}).encode())
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.status == 200 and len(json.loads(r.read())["results"]) == 1
    wait_for(scorer.idle, timeout=60, interval=0.25)
    assert scorer.scored_requests() - before >= len(documents)
