"""The stub's legacy completions (stub/completions.py): `/v1/completions` in each flavour and
llama.cpp's `/infill`, read over a loopback socket from a stub in this process.

What the stub decides, and the tests through the gateway rely on: how many tokens (`max_tokens`
or `n_predict`, else a `[stub content=N]` directive, else 16), where a stop string cuts, which
finish and stop fields say so, how the prompt is counted (one token per word, the suffix and the
FIM tokens included), each flavour's ids and extras, the refusals, and the event log's one
outcome line per request (`completed ... tokens=N` or `cancelled ... after N tokens`)."""

from __future__ import annotations

import asyncio
import re
import tempfile
import time

import aiohttp
import msgspec
import pytest

from homelab_frontend.stub.completions import DEFAULT_TOKENS
from homelab_frontend.stub.server import StubServer
from homelab_frontend.stub.state import StubConfig

FLAVOURS = ("vllm", "llamacpp", "ollama")
MODEL = "up-m"
EVIDENCE_S = 30  # a wait on the stub's own counters: generous, the machine may be busy
ID = {"vllm": r"cmpl-[0-9a-f]{32}", "ollama": r"cmpl-\d{1,3}", "llamacpp": r"chatcmpl-[0-9a-f]{32}"}


def _pieces(n: int, start: int = 1) -> str:
    return "".join(f" c{i}" for i in range(start, start + n))


def _read(status: int, ctype: str, raw: bytes):
    if ctype == "text/event-stream":
        payloads = [ln[6:] for ln in raw.split(b"\n") if ln.startswith(b"data: ")]
        return status, [p if p == b"[DONE]" else msgspec.json.decode(p) for p in payloads]
    return status, msgspec.json.decode(raw)


def post(body, path: str = "/v1/completions", *, flavour: str = "vllm", headers: dict | None = None, **config):
    """One request to a fresh stub -> (status, the JSON answer or the stream's payloads, the stub's
    stats, its event log's lines)."""

    async def main(log: str):
        cfg = StubConfig(flavour=flavour, models=(MODEL,), log=log, **config)
        async with StubServer(cfg) as stub:
            async with aiohttp.ClientSession() as http:
                data = body if isinstance(body, bytes) else msgspec.json.encode(body)
                async with http.post(stub.url + path, data=data, headers=headers) as r:
                    status, doc = _read(r.status, r.content_type, await r.read())
            return status, doc, stub.state.stats.as_dict()

    with tempfile.NamedTemporaryFile("r", suffix=".log") as f:
        status, doc, stats = asyncio.run(main(f.name))
        return status, doc, stats, f.read().splitlines()


# -- /v1/completions ------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_plain_completion_in_each_flavour_s_shape(flavour):
    t0 = int(time.time())
    status, doc, stats, log = post({"model": MODEL, "prompt": "one two three", "max_tokens": 4}, flavour=flavour)
    assert status == 200, doc
    assert re.fullmatch(ID[flavour], doc["id"])
    assert (doc["object"], doc["model"]) == ("text_completion", MODEL) and doc["created"] >= t0
    assert doc["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    choice = {"text": _pieces(4), "index": 0, "finish_reason": "length"}
    if flavour in ("vllm", "llamacpp"):
        choice["logprobs"] = None
    if flavour == "vllm":
        choice["stop_reason"] = None
    assert doc["choices"] == [choice]
    assert doc.get("system_fingerprint") == {"vllm": None, "llamacpp": "b0-unknown", "ollama": "fp_ollama"}[flavour]
    assert log == [f"request id={doc['id']} model={MODEL} stream=false seq=1",
                   f"completed id={doc['id']} tokens=4 seq=1"]
    assert (stats["completed"], stats["prompt_tokens"], stats["in_flight"]) == (1, 3, 0)


@pytest.mark.parametrize("body, n", [
    ({"prompt": "x", "max_tokens": 3}, 3),
    ({"prompt": "x [stub content=5]", "max_tokens": 2}, 2),  # the request's own count wins
    ({"prompt": "x [stub content=5]"}, 5),
    ({"prompt": "x", "max_tokens": True}, DEFAULT_TOKENS),  # JSON true is no integer
    ({"prompt": "x", "max_tokens": "7"}, DEFAULT_TOKENS),
    ({"prompt": "x"}, DEFAULT_TOKENS),
    # llama.cpp's: -1 is no limit (the directive, else 16, else the context's end), 0 is none
    ({"prompt": "x [stub content=5]", "max_tokens": -1, "flavour": "llamacpp"}, 5),
    ({"prompt": "x", "max_tokens": 0, "flavour": "llamacpp"}, 0),
])
def test_how_many_tokens_a_completion_gets(body, n):
    body = dict(body)
    status, doc, _, _ = post({"model": MODEL, **body}, flavour=body.pop("flavour", "vllm"))
    assert status == 200, doc
    assert doc["choices"][0]["text"] == _pieces(n) and doc["usage"]["completion_tokens"] == n
    assert doc["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("max_tokens, message", [
    (2**31, "max_tokens=2147483648 cannot be greater than max_model_len=64. Please request fewer output tokens."),
    (65, "max_tokens=65 cannot be greater than max_model_len=64. Please request fewer output tokens."),
    (0, "max_tokens must be at least 1, got 0."),
    (-1, "max_tokens must be at least 1, got -1."),
])
def test_vllm_refuses_max_tokens_over_the_context_or_under_one_as_its_chat_does(max_tokens, message):
    # vLLM 0.32's completions build the chat's TokenizeParams (max_tokens against max_model_len),
    # then fit max_tokens to what the prompt leaves; a stub that generated 2**31 tokens instead
    # held a gateway's slot without end (the fuzz test's raw /api/generate with that num_predict)
    status, doc, stats, log = post({"model": MODEL, "prompt": "x", "max_tokens": max_tokens}, max_model_len=64)
    assert status == 400, doc
    assert doc["error"]["message"].startswith(message) and doc["error"]["param"] == "max_tokens"
    assert stats["completed"] == 0 and log == ["rejected status=400 seq=1"]


def test_vllm_refuses_a_prompt_over_the_context():
    status, doc, _, _ = post({"model": MODEL, "prompt": "w " * 70, "max_tokens": 1}, max_model_len=64)
    assert status == 400 and "your prompt contains at least 65 input tokens" in doc["error"]["message"], doc


@pytest.mark.parametrize("flavour, max_tokens", [("vllm", 60), ("vllm", None), ("llamacpp", 2**31),
                                                  ("llamacpp", -1)])
def test_an_answer_ends_where_the_context_does(flavour, max_tokens):
    """vLLM fits max_tokens to what the prompt leaves; llama.cpp stops a slot whose context is
    full: either way the answer is the context less the prompt, finish `length`."""
    body = {"model": MODEL, "prompt": "a b c d e [stub content=100]", "max_tokens": max_tokens}
    status, doc, _, _ = post(body, flavour=flavour, max_model_len=64)
    assert status == 200, doc
    assert doc["usage"] == {"prompt_tokens": 7, "completion_tokens": 57, "total_tokens": 64}
    assert doc["choices"][0]["text"] == _pieces(57) and doc["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("stop, text, tokens", [
    ("c3", _pieces(2) + " ", 2),  # cut where the stop begins, inside its token, as real servers cut
    (["", 5, None, "c2"], _pieces(1) + " ", 1),  # only non-empty strings are stops
    ([" c1"], "", 0),
    (["3"], _pieces(2) + " c", 2),  # the token that completed the stop is not counted
])
def test_a_stop_string_cuts_the_text_before_it_and_vllm_names_it(stop, text, tokens):
    status, doc, _, log = post({"model": MODEL, "prompt": "x", "max_tokens": 6, "stop": stop})
    assert status == 200, doc
    choice = doc["choices"][0]
    fired = [s for s in (stop if isinstance(stop, list) else [stop]) if isinstance(s, str) and s][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (text, "stop", fired)
    assert doc["usage"]["completion_tokens"] == tokens
    assert log[-1].endswith(f"tokens={tokens} seq=1")


def test_a_stop_string_spanning_two_tokens_fires_too():
    # the text keeps the earlier token, sent before the stop could be seen (vLLM holds such a
    # prefix back; the stub's docstring says so)
    _, doc, _, _ = post({"model": MODEL, "prompt": "x", "max_tokens": 6, "stop": "c1 c2"})
    choice = doc["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"], doc["usage"]["completion_tokens"]) == ("stop", "c1 c2", 1)
    assert choice["text"] == " c1"


def test_a_stop_that_never_appears_leaves_the_length_finish():
    _, doc, _, _ = post({"model": MODEL, "prompt": "x", "max_tokens": 3, "stop": ["c9"]})
    assert (doc["choices"][0]["text"], doc["choices"][0]["finish_reason"]) == (_pieces(3), "length")


def test_a_one_element_prompt_list_is_its_string_and_anything_else_is_refused():
    status, doc, _, _ = post({"model": MODEL, "prompt": ["a b"], "max_tokens": 1})
    assert status == 200 and doc["usage"]["prompt_tokens"] == 2
    for prompt in (["a", "b"], 5, None, [7]):
        status, doc, stats, log = post({"model": MODEL, "prompt": prompt})
        assert (status, doc["error"]["message"]) == (400, "prompt must be a string"), prompt
        assert stats["completed"] == 0 and log == []  # refused before it began: no request line


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_body_that_is_no_object_is_a_400(flavour):
    status, doc, stats, _ = post(b"[1, 2]", flavour=flavour)
    assert status == 400 and "must be a JSON object" in doc["error"]["message"]
    assert stats["total"] == 1  # recorded as every request is
    status, doc, _, _ = post(b"{not json", flavour=flavour)
    assert status == 400 and "Invalid JSON body" in doc["error"]["message"]


def test_an_unknown_model_is_the_flavour_s_not_found():
    status, doc, _, _ = post({"model": "other", "prompt": "x"})
    assert status == 404 and doc["error"]["param"] == "model"
    status, doc, _, _ = post({"model": "other", "prompt": "x"}, flavour="ollama")
    assert status == 404 and "try pulling it first" in doc["error"]["message"]
    status, doc, _, _ = post({"model": "other", "prompt": "x", "max_tokens": 1}, flavour="llamacpp")
    assert status == 200 and doc["model"] == MODEL  # one model per server: the name is not checked


def test_vllm_refuses_a_suffix_and_stream_options_without_a_stream():
    status, doc, _, log = post({"model": MODEL, "prompt": "x", "suffix": "y"})
    assert status == 400 and doc["error"] == {"message": "suffix is not currently supported", "type": "BadRequestError",
                                              "param": "suffix", "code": 400}
    assert log == []
    status, doc, _, _ = post({"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}})
    assert status == 400 and doc["error"]["param"] == "stream_options"
    status, doc, _, _ = post({"model": MODEL, "prompt": "x", "suffix": None, "max_tokens": 1})
    assert status == 200  # a null suffix is no suffix


def test_ollama_takes_a_suffix_counts_it_and_obeys_its_directives():
    status, doc, _, _ = post({"model": MODEL, "prompt": "def f(\n", "suffix": "    return 1 [stub content=2]\n"},
                             flavour="ollama")
    assert status == 200, doc
    assert doc["choices"][0]["text"] == _pieces(2)
    assert doc["usage"]["prompt_tokens"] == 6  # def f( return 1 [stub content=2]


# -- streamed completions -------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_stream_is_one_chunk_per_token_a_finish_chunk_the_usage_chunk_and_done(flavour):
    status, payloads, stats, log = post({"model": MODEL, "prompt": "a b", "max_tokens": 3, "stream": True,
                                         "stream_options": {"include_usage": True}}, flavour=flavour)
    assert status == 200
    *chunks, last, usage, done = payloads
    assert done == b"[DONE]"
    assert [c["choices"][0]["text"] for c in chunks] == [" c1", " c2", " c3"]
    assert all(c["choices"][0]["finish_reason"] is None and "usage" not in c for c in chunks)
    assert (last["choices"][0]["text"], last["choices"][0]["finish_reason"]) == ("", "length")
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    if flavour == "llamacpp":
        assert (usage["timings"]["prompt_n"], usage["timings"]["predicted_n"]) == (2, 3)
    else:
        assert "timings" not in usage
    heads = {(p["id"], p["object"], p["created"], p["model"]) for p in (*chunks, last, usage)}
    assert len(heads) == 1 and re.fullmatch(ID[flavour], heads.pop()[0])  # one head on every chunk
    assert log[-1] == f"completed id={chunks[0]['id']} tokens=3 seq=1" and stats["completed"] == 1


def test_a_stream_without_include_usage_has_no_usage_chunk():
    _, payloads, _, _ = post({"model": MODEL, "prompt": "a", "max_tokens": 2, "stream": True})
    assert payloads[-1] == b"[DONE]"
    assert [p["choices"][0]["finish_reason"] for p in payloads[:-1]] == [None, None, "length"]


def test_vllm_s_continuous_usage_stats_put_the_running_count_on_every_chunk():
    opts = {"include_usage": True, "continuous_usage_stats": True}
    _, payloads, _, _ = post({"model": MODEL, "prompt": "a b", "max_tokens": 2, "stream": True, "stream_options": opts,
                              "stop": "c3"})
    assert [p["usage"]["completion_tokens"] for p in payloads[:-1]] == [1, 2, 2, 2]
    assert payloads[2]["choices"][0]["stop_reason"] is None  # the length ended it, not the stop
    _, payloads, _, _ = post({"model": MODEL, "prompt": "a", "max_tokens": 2, "stream": True, "stream_options": opts},
                             flavour="ollama")
    assert ["usage" in p for p in payloads[:-1]] == [False, False, False, True]  # vLLM's alone


def test_a_stream_stopped_by_a_stop_string_says_so_on_the_finish_chunk():
    _, payloads, _, _ = post({"model": MODEL, "prompt": "a", "max_tokens": 9, "stream": True, "stop": ["c3"]})
    *chunks, last, done = payloads
    assert "".join(c["choices"][0]["text"] for c in chunks) == _pieces(2) + " "
    assert (last["choices"][0]["finish_reason"], last["choices"][0]["stop_reason"]) == ("stop", "c3")


# -- llama.cpp's /infill --------------------------------------------------------------------------

INFILL = {"input_prefix": "def f(a, b):\n", "input_suffix": "    return c\n"}


def test_an_infill_answers_llama_cpp_s_own_object():
    status, doc, stats, log = post({**INFILL, "n_predict": 3, "max_tokens": 9}, "/infill", flavour="llamacpp")
    assert status == 200, doc
    # n_predict is llama.cpp's count; the words of prefix and suffix and the three FIM tokens
    assert (doc["content"], doc["tokens_predicted"], doc["tokens_evaluated"]) == (_pieces(3), 3, 3 + 2 + 3)
    assert (doc["stop"], doc["stop_type"], doc["stopping_word"], doc["model"]) == (True, "limit", "", MODEL)
    assert doc["tokens_cached"] == 8 + 3 and doc["timings"]["predicted_n"] == 3
    assert stats["prompt_tokens"] == 8 and re.fullmatch(r"completed id=chatcmpl-[0-9a-f]{32} tokens=3 seq=1", log[-1])


def test_an_infill_counts_the_extra_chunks_and_the_prompt_and_stops_at_a_word():
    body = {**INFILL, "prompt": "x y", "input_extra": [{"filename": "u.py", "text": "import os"}, "junk", {}],
            "stop": ["c2"]}
    status, doc, _, _ = post(body, "/infill", flavour="llamacpp")
    assert status == 200, doc
    assert doc["tokens_evaluated"] == 2 + 3 + 2 + 2 + 3  # the chunks' texts, prefix, prompt, suffix, FIM
    assert (doc["content"], doc["stop_type"], doc["stopping_word"], doc["tokens_predicted"]) == (" c1 ", "word", "c2", 1)


def test_a_streamed_infill_is_llama_cpp_s_objects_without_done():
    status, payloads, _, log = post({**INFILL, "n_predict": 2, "stream": True}, "/infill", flavour="llamacpp")
    assert status == 200
    *pieces, final = payloads
    assert [(p["content"], p["stop"], p["tokens_predicted"], p["tokens_evaluated"]) for p in pieces] == [
        (" c1", False, 1, 8), (" c2", False, 2, 8)]
    assert (final["content"], final["stop"], final["stop_type"], final["tokens_predicted"]) == ("", True, "limit", 2)
    assert b"[DONE]" not in payloads and log[-1].endswith("tokens=2 seq=1")


def test_an_infill_needs_prefix_and_suffix():
    for missing in ("input_prefix", "input_suffix"):
        body = {k: v for k, v in INFILL.items() if k != missing}
        status, doc, _, _ = post(body, "/infill", flavour="llamacpp")
        assert (status, doc["error"]["message"]) == (400, f'"{missing}" is required')


def test_a_model_without_fim_tokens_answers_infill_with_llama_cpp_s_501():
    status, doc, stats, log = post(INFILL, "/infill", flavour="llamacpp", fim=False)
    assert status == 501 and doc["error"]["message"].startswith("Infill is not supported by this model")
    assert log == ["rejected status=501 seq=1"] and stats["completed"] == 0


def test_infill_takes_no_key_while_completions_need_one():
    status, _, _, _ = post({**INFILL, "n_predict": 1}, "/infill", flavour="llamacpp", api_key="k")
    assert status == 200
    status, doc, _, _ = post({"prompt": "x"}, flavour="llamacpp", api_key="k")
    assert status == 401 and doc["error"]["message"] == "Invalid API Key"
    status, _, _, _ = post({"prompt": "x", "max_tokens": 1}, flavour="llamacpp", api_key="k",
                           headers={"Authorization": "Bearer k"})
    assert status == 200


def test_a_failure_set_on_the_stub_fails_completions_and_infill_alike():
    async def main():
        async with StubServer(StubConfig(flavour="llamacpp", models=(MODEL,))) as stub:
            stub.state.failing = {"status": 503, "message": "down for a test"}
            async with aiohttp.ClientSession() as http:
                for path, body in (("/v1/completions", {"prompt": "x"}), ("/infill", INFILL)):
                    async with http.post(stub.url + path, json=body) as r:
                        assert (r.status, (await r.json())["error"]["message"]) == (503, "down for a test")
            assert stub.state.stats.total == 2 and stub.state.stats.completed == 0

    asyncio.run(main())


# -- a client that leaves -------------------------------------------------------------------------


async def _until(predicate) -> None:
    deadline = time.monotonic() + EVIDENCE_S
    while not predicate():
        assert time.monotonic() < deadline, "the stub never showed it"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("path, body, flavour", [
    ("/v1/completions", {"model": MODEL, "prompt": "x [stub delay_ms=20]", "max_tokens": 4_000, "stream": True},
     "vllm"),  # within the context (4096): vLLM refuses more
    ("/v1/completions", {"model": MODEL, "prompt": "x [stub delay_ms=20]", "max_tokens": 10_000}, "ollama"),
    ("/infill", {**INFILL, "prompt": "[stub delay_ms=20]", "n_predict": 10_000, "stream": True}, "llamacpp"),
])
def test_a_client_that_leaves_mid_generation_is_logged_cancelled_once_with_what_was_sent(tmp_path, path, body,
                                                                                          flavour):
    log = tmp_path / "stub.log"

    async def main():
        async with StubServer(StubConfig(flavour=flavour, models=(MODEL,), log=str(log))) as stub:
            stats = stub.state.stats
            reader, writer = await asyncio.open_connection("127.0.0.1", int(stub.url.rsplit(":", 1)[1]))
            data = msgspec.json.encode(body)
            writer.write(f"POST {path} HTTP/1.1\r\nHost: stub\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
            await writer.drain()
            if body.get("stream"):
                got = b""
                while got.count(b"data: ") < 2:  # two tokens out: it is generating
                    got += await asyncio.wait_for(reader.read(65536), EVIDENCE_S)
            else:
                await _until(lambda: stats.in_flight == 1)
            writer.close()
            await _until(lambda: stats.cancelled == 1 and stats.in_flight == 0)
            return stats.as_dict()

    stats = asyncio.run(main())
    assert (stats["cancelled"], stats["completed"]) == (1, 0)
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and lines[0].startswith("request id=")
    m = re.fullmatch(r"cancelled id=(\S+) after (\d+) tokens seq=1", lines[1])
    assert m and lines[0].startswith(f"request id={m[1]} ") and int(m[2]) < 10_000
    if body.get("stream"):
        assert int(m[2]) >= 2
