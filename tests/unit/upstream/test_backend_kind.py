"""Where each backend kind serves the relayed endpoints, and its quirks
(upstream/backend_kind.py), held against the servers' sources: llama.cpp's
tools/server/server-context.cpp (post_rerank) and server-common.cpp (format_response_rerank),
whisper.cpp's examples/server."""

from __future__ import annotations

from homelab_frontend.config import Backend
from homelab_frontend.upstream import backend_kind


def b(kind=None, **kw) -> Backend:
    return Backend(url="http://127.0.0.1:1/v1", kind=kind, **kw)


def test_openai_paths_are_every_kinds_default():
    for kind in ("vllm", "openai", None):
        assert backend_kind.media_path(b(kind), "rerank") == "/v1/rerank"
        assert backend_kind.media_path(b(kind), "rerank_v2") == "/v2/rerank"
        assert backend_kind.media_path(b(kind), "transcriptions") == "/v1/audio/transcriptions"
        assert backend_kind.media_path(b(kind), "image_edits") == "/v1/images/edits"


def test_llamacpp_has_no_v2_or_score_route():
    assert backend_kind.media_path(b("llamacpp"), "rerank_v2") == "/v1/rerank"
    assert backend_kind.media_path(b("llamacpp"), "score") is None


def test_whispercpp_inference_path_and_health():
    w = b("whispercpp")
    assert backend_kind.media_path(w, "transcriptions") == "/inference"
    assert backend_kind.media_path(w, "translations") == "/inference"
    assert backend_kind.media_path(w, "speech") is None
    assert backend_kind.health_path(w) == "/health"
    assert backend_kind.form_extras(w, "translations") == {"translate": "true"}
    assert backend_kind.form_extras(w, "transcriptions") == {}
    # its --inference-path, told in the config
    assert backend_kind.media_path(b("whispercpp", paths={"transcriptions": "/asr"}), "transcriptions") == "/asr"
    assert backend_kind.health_path(b("vllm")) is None
    assert backend_kind.health_path(b("openai", health_path="/healthz")) == "/healthz"


def test_rerank_documents_go_as_strings_to_every_kind():
    doc = {"model": "m", "query": "q", "documents": ["a", {"text": "b"}]}
    for kind in ("llamacpp", "vllm", "openai"):
        assert backend_kind.rerank_body(b(kind), doc)["documents"] == ["a", "b"]
    plain = {"model": "m", "query": "q", "documents": ["a"]}
    assert backend_kind.rerank_body(b("vllm"), plain) is plain


def test_a_top_n_of_0_means_all_on_llamacpp_as_on_vllm():
    doc = {"model": "m", "query": "q", "documents": ["a"], "top_n": 0}
    assert "top_n" not in backend_kind.rerank_body(b("llamacpp"), doc)
    assert backend_kind.rerank_body(b("vllm"), doc)["top_n"] == 0
    assert backend_kind.rerank_body(b("llamacpp"), {**doc, "top_n": 2})["top_n"] == 2


def test_llamacpp_answer_gets_the_documents_it_dropped():
    request = {"documents": ["alpha", {"text": "beta"}], "return_documents": True}
    answer = {"results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1},
                          {"index": 7, "relevance_score": 0.0}]}
    got = backend_kind.rerank_answer(b("llamacpp"), request, answer)
    assert got["results"][0]["document"] == {"text": "beta"}
    assert got["results"][1]["document"] == {"text": "alpha"}
    assert "document" not in got["results"][2]  # an index the request never had: left as it came
    # not asked for, or another kind: as the backend gave it
    assert backend_kind.rerank_answer(b("llamacpp"), {**request, "return_documents": False}, answer) is answer
    assert backend_kind.rerank_answer(b("vllm"), request, answer) is answer
