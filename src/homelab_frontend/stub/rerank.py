"""Rerank and score, as vLLM 0.32 and llama.cpp's llama-server answer them.

The scores are deterministic and mean something: a document's relevance is the share of the
query's words it contains (case and punctuation aside), so a test can put the relevant document
anywhere and expect it first, as from a real reranker.

vLLM (entrypoints/pooling/scoring: api_router.py, protocol.py, serving.py):
- `POST /rerank`, `/v1/rerank` (the same handler, a deprecation warning in its log) and
  `/v2/rerank`: `{model, query, documents, top_n}`; `documents` a string or a list of strings
  or `{"content": [parts]}` objects (a `{"text": ...}` object is not one: pydantic's 400);
  `top_n` 0 (the default) means all, below 0 a 400. A refused body is `{"error": {"message":
  "N validation errors: …", "type": "Bad Request", "param": "body.documents", "code": 400}}`. `return_documents` is not a field of vLLM's
  (extra fields are allowed and ignored): every result carries `document: {"text", "multi_modal"}`.
  The answer: `{"id": "score-" + 16 hex digits, "model", "usage": {"prompt_tokens", "total_tokens"},
  "results": [{"index", "document", "relevance_score"}]}`, sorted by score, cut to top_n.
- `POST /score`, `/v1/score`: `queries`+`documents`, `queries`+`items`, `data_1`+`data_2` or
  `text_1`+`text_2`, each a string or a list: 1:1, 1:N or N:N, else a 400. The answer:
  `{"id": "score-…", "object": "list", "created", "model", "data": [{"index", "object": "score",
  "score"}], "usage": {"prompt_tokens", "total_tokens", "completion_tokens": 0, …}}` in input order.
- errors `{"error": {"message", "type", "param", "code"}}`; an unknown model its 404.
- usage: the tokens of every (query, document) pair plus 3 special tokens each (a BERT-style
  cross-encoder's [CLS] … [SEP] … [SEP]).

llama.cpp (tools/server: server-context.cpp `post_rerank`, server-common.cpp
`format_response_rerank`):
- `POST /rerank`, `/reranking`, `/v1/rerank`, `/v1/reranking`; without `--reranking` a 501
  `not_supported_error` ("This server does not support reranking. Start it with `--reranking`").
- `query` must be a string (400 "\"query\" must be a string" / "\"query\" must be provided");
  `documents` (or TEI's `texts`) a non-empty array of strings, else 400 "\"documents\" must be a
  non-empty string array" (an array of objects reads as empty: llama.cpp's json_value falls back
  to its default on a type mismatch).
- `top_n` defaults to the number of documents; results sorted by score and cut to it.
- Jina shape (the default): `{"model": the request's model or the server's, "object": "list",
  "usage": {"prompt_tokens", "total_tokens"}, "results": [{"index", "relevance_score"}]}`: no
  document text at all, `return_documents` is not read. TEI shape (a request with `texts`): a
  bare list of `{"index", "score"}`, with `"text"` when `return_text` is true.
- errors `{"error": {"code", "message", "type"}}`.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import msgspec
from aiohttp import web

from .chat import FLAVOUR
from .flavour import Rejection
from .media import Job, check_key, json_body, parse_media_directives, rejection_response, run_job, sleep_ms
from .script import count_text_tokens

_WORD = re.compile(r"[a-z0-9]+")
PAIR_SPECIAL_TOKENS = 3  # [CLS] query [SEP] document [SEP]


def relevance(query: str, document: str) -> float:
    """The share of the query's distinct words found in the document, nudged by the document's
    own length so that ties order stably (shorter first), in (0, 1)."""
    q = set(_WORD.findall(query.lower()))
    d = set(_WORD.findall(document.lower()))
    if not q:
        return 0.0001
    share = len(q & d) / len(q)
    return round(0.0001 + 0.9998 * share / (1 + 0.001 * len(d)), 6)


def pair_tokens(query: str, document: str) -> int:
    return count_text_tokens(query) + count_text_tokens(document) + PAIR_SPECIAL_TOKENS


def _text(item: Any) -> str | None:
    """A scoring input's text: a string, or a vLLM multimodal `{"content": [parts]}`'s text parts."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("content"), list):
        return " ".join(p.get("text", "") for p in item["content"] if isinstance(p, dict) and isinstance(p.get("text"), str))
    return None


async def _body(request: web.Request) -> Any:
    try:
        return msgspec.json.decode(await request.read())
    except msgspec.DecodeError:
        return None


def _vllm_error(request: web.Request, status: int, message: str, param: str | None = None) -> web.Response:
    return rejection_response(request.app[FLAVOUR].error(status, message, param=param))


def _vllm_validation(request: web.Request, field: str, message: str) -> web.Response:
    """vLLM's answer to a body its pydantic model refuses (as 0.32 sends it: the errors listed,
    `type` "Bad Request", `param` the field's location)."""
    loc = f"body.{field}"
    return json_body({"error": {"message": f"1 validation error:\n  {{'type': 'value_error', 'loc': '{loc}', "
                                           f"'msg': '{message}'}}", "type": "Bad Request", "param": loc,
                                "code": 400}}, 400)


async def _score_documents(job: Job, query: str, documents: list[str], delay_ms: int | None) -> list[float]:
    """Score each document, one unit of work each (cancellable between them)."""
    directives = parse_media_directives(query)
    scores = []
    for document in documents:
        await job.work(directives)
        scores.append(relevance(query, document))
    return scores


async def _open(job: Job, body: Any, text: Any) -> web.Response | None:
    """Record, honour status=/headers_ms=, check the key: None to go on."""
    job.describe(body)
    directives = parse_media_directives(text)
    await sleep_ms(directives.headers_ms)
    flavour = job.request.app[FLAVOUR]
    refused = check_key(job, flavour.unauthorized)
    if refused is not None:
        return refused
    if directives.status is not None:
        job.reject(directives.status)
        return rejection_response(flavour.error(directives.status, f"stub error {directives.status}"))
    return None


# -- vLLM --

def _vllm_model(job: Job, body: dict) -> str | web.Response:
    flavour, served = job.request.app[FLAVOUR], job.state.config.models
    model = flavour.resolve_model(body.get("model"), served)
    if isinstance(model, Rejection):
        job.reject(model.status)
        return rejection_response(model)
    return model


async def vllm_rerank(request: web.Request) -> web.StreamResponse:
    return await run_job(request, _vllm_rerank, unit="documents")


async def _vllm_rerank(job: Job) -> web.StreamResponse:
    request = job.request
    body = await _body(request)
    query = body.get("query") if isinstance(body, dict) else None
    opened = await _open(job, body, query)
    if opened is not None:
        return opened
    if not isinstance(body, dict):
        job.reject(400)
        return _vllm_error(request, 400, "The request body must be a JSON object")
    model = _vllm_model(job, body)
    if isinstance(model, web.Response):
        return model
    raw_docs = body.get("documents")
    docs = raw_docs if isinstance(raw_docs, list) else [raw_docs]
    texts = [_text(d) for d in docs]
    query_text = _text(query)
    top_n = body.get("top_n", 0)
    problem = None
    if query_text is None:
        problem = ("query", "Field required" if query is None else "Input should be a valid string")
    elif raw_docs is None or any(t is None for t in texts):
        problem = ("documents", "Field required" if raw_docs is None else
                   "Input should be a valid string or an object with 'content'")
    elif not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
        problem = ("top_n", "Input should be greater than or equal to 0")
    if problem is not None:
        job.reject(400)
        return _vllm_validation(request, problem[0], problem[1])
    assert query_text is not None  # a problem otherwise, answered above
    documents = [t for t in texts if t is not None]  # all of them: a problem otherwise
    scores = await _score_documents(job, query_text, documents, None)
    ranked = sorted(enumerate(zip(docs, scores)), key=lambda pair: pair[1][1], reverse=True)
    results = [{"index": i, "document": {"text": d if isinstance(d, str) else None,
                                         "multi_modal": None if isinstance(d, str) else d.get("content", [])},
                "relevance_score": s}
               for i, (d, s) in ranked]
    if 0 < top_n < len(results):
        results = results[:top_n]
    tokens = sum(pair_tokens(query_text, t) for t in documents)
    job.state.stats.prompt_tokens += tokens
    return json_body({"id": f"score-{uuid.uuid4().hex[:16]}", "model": model,
                      "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results})


_SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))


async def vllm_score(request: web.Request) -> web.StreamResponse:
    return await run_job(request, _vllm_score, unit="pairs")


async def _vllm_score(job: Job) -> web.StreamResponse:
    request = job.request
    body = await _body(request)
    pair = next((p for p in _SCORE_PAIRS if isinstance(body, dict) and p[0] in body and p[1] in body), None)
    first = body.get(pair[0]) if pair else None
    opened = await _open(job, body, first if isinstance(first, str) else (first[0] if isinstance(first, list) and first else None))
    if opened is not None:
        return opened
    if not isinstance(body, dict):
        job.reject(400)
        return _vllm_error(request, 400, "The request body must be a JSON object")
    model = _vllm_model(job, body)
    if isinstance(model, web.Response):
        return model
    if pair is None:
        job.reject(400)
        return _vllm_error(request, 400, "Field required: one of queries/documents, queries/items, data_1/data_2, "
                                         "text_1/text_2")
    left = [_text(x) for x in (body[pair[0]] if isinstance(body[pair[0]], list) else [body[pair[0]]])]
    right = [_text(x) for x in (body[pair[1]] if isinstance(body[pair[1]], list) else [body[pair[1]]])]
    if any(t is None for t in left + right):
        job.reject(400)
        return _vllm_error(request, 400, "Input should be a valid string or an object with 'content'", pair[0])
    queries = [t for t in left if t is not None]  # all of them: tested above
    documents = [t for t in right if t is not None]
    if len(queries) == 1:
        queries = queries * len(documents)
    if len(queries) != len(documents) or not documents:
        job.reject(400)
        return _vllm_error(request, 400, "Input lengths must be either 1:1, 1:N or N:N")
    directives = parse_media_directives(queries[0])
    data, tokens = [], 0
    for i, (q, d) in enumerate(zip(queries, documents)):
        await job.work(directives)
        data.append({"index": i, "object": "score", "score": relevance(q, d)})
        tokens += pair_tokens(q, d)
    job.state.stats.prompt_tokens += tokens
    return json_body({"id": f"score-{uuid.uuid4().hex[:16]}", "object": "list", "created": int(time.time()), "model": model,
                      "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                                              "prompt_tokens_details": None,
                                              "completion_tokens_details": None}})


# -- llama.cpp --

async def llama_rerank(request: web.Request) -> web.StreamResponse:
    return await run_job(request, _llama_rerank, unit="documents")


async def _llama_rerank(job: Job) -> web.StreamResponse:
    request = job.request
    flavour = request.app[FLAVOUR]
    body = await _body(request)
    query = body.get("query") if isinstance(body, dict) else None
    opened = await _open(job, body, query)
    if opened is not None:
        return opened
    if not job.state.config.reranking:
        job.reject(501)
        return rejection_response(flavour.error(501, "This server does not support reranking. Start it with `--reranking`"))
    if not isinstance(body, dict):
        job.reject(500)
        return rejection_response(flavour.error(500, "[json.exception.parse_error.101] parse error"))
    if "query" not in body:
        job.reject(400)
        return rejection_response(flavour.error(400, '"query" must be provided'))
    if not isinstance(query, str):
        job.reject(400)
        return rejection_response(flavour.error(400, '"query" must be a string'))
    tei = "texts" in body
    raw = body.get("documents", body.get("texts"))
    documents = raw if isinstance(raw, list) and all(isinstance(d, str) for d in raw) else []
    if not documents:
        job.reject(400)
        return rejection_response(flavour.error(400, '"documents" must be a non-empty string array'))
    top_n = body.get("top_n", len(documents))
    top_n = top_n if isinstance(top_n, int) and not isinstance(top_n, bool) else len(documents)
    scores = await _score_documents(job, query, documents, None)
    label = "score" if tei else "relevance_score"
    elements = []
    for i, s in enumerate(scores):
        elem: dict[str, Any] = {"index": i, label: s}
        if tei and body.get("return_text") is True:
            elem["text"] = documents[i]
        elements.append(elem)
    elements.sort(key=lambda e: e[label], reverse=True)
    elements = elements[: max(min(top_n, len(elements)), 0)]
    tokens = sum(pair_tokens(query, d) for d in documents)
    job.state.stats.prompt_tokens += tokens
    if tei:
        return json_body(elements)
    model = body.get("model") if "model" in body else job.state.config.models[0]
    return json_body({"model": model, "object": "list", "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                      "results": elements})
