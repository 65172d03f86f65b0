"""Failover before the first byte, passive health and model fallbacks (request/failover.py,
policy/passive_health.py, config `fallback:`), against real stub processes behind a real gateway.

Two backends serve model "m"; with affinity off and both idle the gateway picks the first, gpu0,
so making gpu0 fail (the stub's POST /stub/fail, which leaves its health probe answering) shows
where each request went by the stubs' own request logs."""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import openai
import pytest

from gwproc import Gateway, config_for
from rawhttp import post_raw, sse_data
from stubproc import free_port, start_stub, wait_for

MSG = [{"role": "user", "content": "hi [stub content=3]"}]
SERVES = ("--model", "m", "--model", "solo", "--model", "big", "--model", "small")


@pytest.fixture(scope="module")
def gpu0():
    with start_stub("vllm", *SERVES) as s:
        yield s


@pytest.fixture(scope="module")
def gpu1():
    with start_stub("vllm", *SERVES) as s:
        yield s


def _cfg(backends: dict, models: dict, interval: float = 60) -> dict:
    return config_for({n: {"url": u, "slots": 2, "health_interval_s": interval} for n, u in backends.items()},
                      models)


@pytest.fixture(scope="module")
def gw(gpu0, gpu1):
    cfg = _cfg({"gpu0": gpu0.base, "gpu1": gpu1.base},
               {"m": {"backends": ["gpu0", "gpu1"], "affinity": False}, "solo": {"backend": "gpu0"}})
    with Gateway(cfg) as g:
        yield g


@pytest.fixture
def clean(gpu0, gpu1):
    for s in (gpu0, gpu1):
        s.fail()
        s.reset()
    yield
    for s in (gpu0, gpu1):
        s.fail()


def _chat(g: Gateway, model: str = "m", stream: bool = False, messages=MSG):
    return post_raw(g.base + "/chat/completions", {"model": model, "stream": stream, "messages": messages})


def _line(g: Gateway, rid: str) -> dict:
    return wait_for(lambda: next((r for r in g.access_log() if r["id"] == rid), None), 10)


def _failovers(g: Gateway, backend: str, cause: str) -> float:
    status, text = g.get("/metrics")
    assert status == 200
    for line in str(text).splitlines():
        if line.startswith("hlf_failovers_total{") and f'backend="{backend}"' in line and f'cause="{cause}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


CAUSES = [
    ({"status": 502}, "status_502"),
    ({"status": 503, "message": "Loading model"}, "status_503"),
    ({"status": 504}, "status_504"),
    ({"status": 429, "message": "too many requests"}, "status_429"),
    ({"status": 404, "message": "model \"m\" not found, try pulling it first"}, "model_not_loaded"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("how,cause", CAUSES, ids=[c for _, c in CAUSES])
def test_a_backend_that_says_not_now_hands_the_request_to_the_other(gw, gpu0, gpu1, clean, how, cause, stream):
    before = _failovers(gw, "gpu0", cause)
    gpu0.fail(**how)
    status, headers, body = _chat(gw, stream=stream)
    assert status == 200, body
    if stream:
        assert sse_data(body)[-1] == b"[DONE]" and b'"error"' not in body
    else:
        assert json.loads(body)["choices"][0]["message"]["content"] == "Hello from the "
    assert len(gpu0.requests()) == 1 and len(gpu1.requests()) == 1  # one try there, the answer here
    line = _line(gw, headers["request-id"])
    assert (line["outcome"], line["backend"], line["backends_tried"]) == ("ok", "gpu1", ["gpu0", "gpu1"])
    assert line["failovers"] == [{"backend": "gpu0", "cause": cause}]
    assert _failovers(gw, "gpu0", cause) == before + 1
    snap = gw.admin()
    assert snap["backends"]["gpu0"]["up"] and snap["backends"]["gpu0"]["in_use"] == 0  # no slot kept, not down
    assert snap["backends"]["gpu1"]["in_use"] == 0


@pytest.mark.parametrize("code", [400, 401, 413, 422])
def test_a_refusal_about_the_request_does_not_fail_over(gw, gpu0, gpu1, clean, code):
    gpu0.fail(status=code, message="the request has a problem")
    status, headers, body = _chat(gw)
    # passed on as before (a backend refusing the gateway's own key is a 502, a 422 a 400)
    assert status == {401: 502, 422: 400}.get(code, code) and b"the request has a problem" in body
    assert len(gpu0.requests()) == 1 and gpu1.requests() == []
    assert _line(gw, headers["request-id"])["backends_tried"] == ["gpu0"]


def test_nothing_fails_over_once_the_answer_began(gw, gpu0, gpu1, clean):
    # the stream broke after 2 tokens reached the client: the error frame, no second backend
    status, headers, body = _chat(gw, stream=True, messages=[{"role": "user", "content": "[stub content=5 fail_after=2]"}])
    assert status == 200 and b'"error"' in body and sse_data(body)[-1] != b"[DONE]"
    # an error inside a 200 answer: the backend answered; not a failover either
    status, _, body = _chat(gw, stream=True, messages=[{"role": "user", "content": "[stub content=5 error_after=0]"}])
    assert status == 200 and b'"error"' in body
    assert len(gpu0.requests()) == 2 and gpu1.requests() == []
    assert _line(gw, headers["request-id"])["backends_tried"] == ["gpu0"]


def test_with_no_other_backend_the_error_is_the_backends(gw, gpu0, clean):
    gpu0.fail(status=503, message="Loading model")
    status, headers, body = _chat(gw, model="solo")
    assert status == 503 and b"Loading model" in body
    line = _line(gw, headers["request-id"])
    assert line["backends_tried"] == ["gpu0"] and line["failovers"] is None
    anth = anthropic.Anthropic(base_url=gw.llm, api_key="x", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as e:
        anth.messages.create(model="solo", max_tokens=5, messages=MSG)
    assert e.value.status_code == 503


def test_every_backend_failing_gives_the_last_failure(gw, gpu0, gpu1, clean):
    gpu0.fail(status=503)
    gpu1.fail(status=502)
    status, headers, body = _chat(gw)
    assert status == 502 and b"'gpu1' answered 502" in body
    line = _line(gw, headers["request-id"])
    assert line["backends_tried"] == ["gpu0", "gpu1"] and line["outcome"] == "error_upstream_error"
    assert gw.admin()["backends"]["gpu0"]["in_use"] == 0 and gw.admin()["backends"]["gpu1"]["in_use"] == 0


def test_every_surface_fails_over(gw, gpu0, gpu1, clean):
    gpu0.fail(status=503)
    oai = openai.OpenAI(base_url=gw.base, api_key="x", max_retries=0)
    assert oai.chat.completions.create(model="m", messages=MSG).choices[0].message.content == "Hello from the "
    anth = anthropic.Anthropic(base_url=gw.llm, api_key="x", max_retries=0)
    assert anth.messages.create(model="m", max_tokens=20, messages=MSG).content[0].text == "Hello from the "
    with anth.messages.stream(model="m", max_tokens=20, messages=MSG) as s:
        assert s.get_final_message().content[0].text == "Hello from the "
    assert oai.responses.create(model="m", input="hi [stub content=3]", store=False).output_text == "Hello from the "
    assert oai.embeddings.create(model="m", input="hello").data
    assert len(gpu0.requests()) == 4 and len(gpu1.requests()) == 4  # the chats, each tried on gpu0 first


# -- passive health -----------------------------------------------------------------------------


def test_connection_refused_fails_over_marks_down_and_comes_back(gpu1):
    port = free_port()
    first = start_stub("vllm", *SERVES, "--port", str(port))
    cfg = _cfg({"gpu0": first.base, "gpu1": gpu1.base}, {"m": {"backends": ["gpu0", "gpu1"], "affinity": False}})
    with Gateway(cfg) as g:
        wait_for(lambda: g.admin()["backends"]["gpu0"]["up"], 10)
        first.stop()  # dies; the next probe is a minute away
        rids = [_chat(g)[1]["request-id"] for _ in range(2)]
        for rid in rids:
            line = _line(g, rid)
            assert line["outcome"] == "ok" and line["failovers"] == [{"backend": "gpu0", "cause": "unreachable"}]
        snap = g.admin()["backends"]["gpu0"]
        assert not snap["up"] and "on its requests" in snap["last_error"]  # two in a row: down at once
        status, headers, _ = _chat(g)
        assert status == 200 and _line(g, headers["request-id"])["backends_tried"] == ["gpu1"]
        # back on the same port: the re-probe (soon, with backoff) takes it back
        with start_stub("vllm", *SERVES, "--port", str(port)) as again:
            wait_for(lambda: g.admin()["backends"]["gpu0"]["up"], 30)
            status, headers, _ = _chat(g)
            assert status == 200 and _line(g, headers["request-id"])["backends_tried"] == ["gpu0"]
            assert len(again.requests()) == 1


def test_a_reset_after_connecting_counts_toward_passive_health(gpu0, gpu1, clean):
    cfg = _cfg({"gpu0": gpu0.base, "gpu1": gpu1.base}, {"m": {"backends": ["gpu0", "gpu1"], "affinity": False}})
    with Gateway(cfg) as g:
        gpu0.fail(reset=True)
        first = _chat(g)
        assert first[0] == 200
        assert _line(g, first[1]["request-id"])["failovers"] == [{"backend": "gpu0", "cause": "reset"}]
        assert g.admin()["backends"]["gpu0"]["up"]  # one is not enough
        assert _chat(g)[0] == 200
        assert not g.admin()["backends"]["gpu0"]["up"]


def test_a_backend_that_answers_its_probe_but_fails_every_request_does_not_flap(gpu0, gpu1, clean):
    """Probed every 0.5 s, resetting every request: without hysteresis it would be taken back
    every half second and fail two requests each time. With it, each mark-down doubles the wait
    before the next try, so over T seconds it sees about log2(2T) requests."""
    # only gpu0 is probed every 0.5 s: a probe's timeout is capped at its interval, and gpu1, the
    # one that answers, must not be taken out by one probe slower than 0.5 s on a busy machine
    cfg = config_for({"gpu0": {"url": gpu0.base, "slots": 2, "health_interval_s": 0.5},
                      "gpu1": {"url": gpu1.base, "slots": 2, "health_interval_s": 60}},
                     {"m": {"backends": ["gpu0", "gpu1"], "affinity": False}})
    with Gateway(cfg) as g:
        wait_for(lambda: g.admin()["backends"]["gpu0"]["up"] and g.admin()["backends"]["gpu1"]["up"], 30)
        gpu0.fail(reset=True)
        t0 = time.monotonic()
        statuses = []
        while time.monotonic() - t0 < 6:
            statuses.append(_chat(g)[0])
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
        assert set(statuses) == {200}  # every request answered (by gpu1)
        # requests that went to gpu0 (the stub counts more: a reset on a reused connection is
        # resent once on a fresh one, upstream/client.py)
        wait_for(lambda: len(g.access_log()) >= len(statuses), 10)
        hits = sum("gpu0" in r["backends_tried"] for r in g.access_log())
        # two to the first mark-down, then one per re-admission, which come 0.5, 1, 2, 4... s apart
        bound = 2 + math.log2(2 * elapsed + 1) + 1
        assert 2 <= hits <= bound, (hits, elapsed, len(statuses))
        # it works again: a probe takes it back, and a request it serves clears its record
        gpu0.fail()
        wait_for(lambda: g.admin()["backends"]["gpu0"]["up"], 60)
        served = len(gpu0.requests())
        wait_for(lambda: _chat(g)[0] == 200 and len(gpu0.requests()) > served, 30)


# -- fallback ---------------------------------------------------------------------------------


def test_fallback_serves_when_every_backend_is_down_and_echoes_the_clients_name(gpu1):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    cfg = config_for({"dead": {"url": dead, "health_interval_s": 60}, "gpu1": {"url": gpu1.base}},
                     {"big": {"backend": "dead", "fallback": "small"}, "small": {"backend": "gpu1"}},
                     aliases={"big-latest": "big"})
    with Gateway(cfg) as g:
        wait_for(lambda: not g.admin()["backends"]["dead"]["up"], 10)
        gpu1.reset()
        status, headers, body = _chat(g, model="big-latest")
        assert status == 200 and json.loads(body)["model"] == "big-latest"
        assert headers["x-hlf-served-model"] == "small"
        status, headers, body = _chat(g, model="big-latest", stream=True)
        chunks = [json.loads(d) for d in sse_data(body) if d != b"[DONE]"]
        assert chunks and {c["model"] for c in chunks} == {"big-latest"}
        assert headers["x-hlf-served-model"] == "small"
        anth = anthropic.Anthropic(base_url=g.llm, api_key="x", max_retries=0)
        raw = anth.messages.with_raw_response.create(model="big", max_tokens=20, messages=MSG)
        assert raw.headers["x-hlf-served-model"] == "small" and raw.parse().model == "big"
        assert [r["body"]["model"] for r in gpu1.requests()] == ["small"] * 3  # the fallback's upstream name
        line = _line(g, headers["request-id"])
        assert line["served_model"] == "small" and line["model"] == "big-latest"


def test_a_busy_model_waits_in_its_queue_rather_than_falling_back(gpu0, gpu1, clean):
    cfg = config_for({"gpu0": {"url": gpu0.base, "slots": 1}, "gpu1": {"url": gpu1.base}},
                     {"big": {"backend": "gpu0", "fallback": "small"}, "small": {"backend": "gpu1"}})
    with Gateway(cfg) as g, ThreadPoolExecutor(2) as pool:
        slow = pool.submit(_chat, g, "big", False, [{"role": "user", "content": "[stub content=40 delay_ms=20]"}])
        wait_for(lambda: gpu0.stats()["in_flight"] == 1, 10)
        queued = pool.submit(_chat, g, "big")
        wait_for(lambda: g.admin()["backends"]["gpu0"]["queued"] == 1, 10)
        for f in (slow, queued):
            status, headers, _ = f.result()
            assert status == 200 and headers["x-hlf-served-model"] == "big"
        assert gpu1.requests() == []


def test_a_fallback_loop_is_a_config_error(tmp_path):
    import subprocess
    import sys

    import yaml

    path = tmp_path / "loop.yaml"
    path.write_text(yaml.safe_dump(config_for({"b": "http://127.0.0.1:1/v1"}, {
        "a": {"backend": "b", "fallback": "c"}, "c": {"backend": "b", "fallback": "a"},
        "d": {"backend": "b", "fallback": "nope"}})))
    done = subprocess.run([sys.executable, "-m", "homelab_frontend", "check", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "models.a.fallback: a loop (a -> c -> a)" in done.stdout + done.stderr
    assert "models.d.fallback: no model named 'nope'" in done.stdout + done.stderr
    path.write_text(yaml.safe_dump(config_for({"b": "http://127.0.0.1:1/v1"}, {
        "a": {"backend": "b", "fallback": "c"}, "c": {"backend": "b"}})))
    done = subprocess.run([sys.executable, "-m", "homelab_frontend", "check", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "all down: c" in done.stdout


# -- a whole answer the backend breaks off ------------------------------------------------------

@pytest.fixture(scope="module")
def llama_pair():
    with start_stub("llamacpp", "--model", "m") as a, start_stub("llamacpp", "--model", "m") as b:
        cfg = config_for({n: {"url": s.base, "slots": 2, "kind": "llamacpp", "health_interval_s": 60}
                          for n, s in (("la", a), ("lb", b))},
                         {"m": {"backends": ["la", "lb"], "affinity": False}})
        with Gateway(cfg) as g:
            yield g, a, b


PLAIN = [
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi [stub content=8]"}]},
     lambda doc: doc["choices"][0]["message"]["content"]),
    ("/messages", {"max_tokens": 50, "messages": [{"role": "user", "content": "hi [stub content=8]"}]},
     lambda doc: doc["content"][0]["text"]),
]


@pytest.mark.parametrize("path,body,text", PLAIN, ids=["openai", "anthropic"])
def test_a_whole_answer_broken_off_mid_way_is_answered_whole_by_the_other_backend(llama_pair, path, body, text):
    """llama.cpp's plain answers are read as a stream (so a client leaving stops them): one that
    breaks off mid-way has sent the client nothing, so it fails over like a refusal."""
    g, la, lb = llama_pair
    la.reset()
    lb.reset()
    la.fail(abort_after=3)  # every answer of la's dies after 3 tokens, as when its server is killed
    try:
        status, headers, raw = post_raw(g.base + path, {"model": "m", **body})
        assert status == 200, raw[:300]
        # the whole answer (the stub's 8 tokens), not the three tokens la broke off after
        assert text(json.loads(raw)) == "Hello from the homelab demo backend. This answer "
        assert "aborted" in la.log_text() and len(lb.requests()) == 1
        line = _line(g, headers["request-id"])
        assert line["failovers"] == [{"backend": "la", "cause": "broke"}] and line["backends_tried"] == ["la", "lb"], line
        assert line["outcome"] == "ok" and line["tokens_out"] == 8, line
    finally:
        la.fail()
