"""A client's `keep_alive` for a managed backend (`run:`) in every dialect that can carry it: the
official SDKs (`extra_body`, as clients of Ollama's `/v1` send it) and raw HTTP for Gemini's body,
each through a real gateway in front of a stub server the gateway itself runs; judged by the
server's process and port, and the gateway's `/admin/backends` figure. The operator's cap and
`honour: false`, Ollama's `keep_alive: 0` with a prompt (answered, then unloaded), and a value
that is no duration (a 400 naming the field in the caller's dialect, nothing started)."""

from __future__ import annotations

import anthropic
import ollama
import openai
import pytest

from gwproc import Gateway, config_for
from managed import backends, port_closed, stub_backend, wait_gone, wait_state


def _gateway(**run):
    backend = stub_backend("vllm", model="m", **run)
    port = int(backend["url"].rsplit(":", 1)[1].split("/")[0])
    return Gateway(config_for({"a": backend}, {"m": {"backend": "a"}}, resources={"gpu": 1})), port


def _ttl(gw) -> float | None:
    return backends(gw)["a"]["idle_ttl_s"]


def test_every_dialect_carries_keep_alive_to_the_managed_server():
    gw, port = _gateway()  # idle_ttl_s: null, so only a client's keep_alive can stop it
    with gw:
        oa = openai.OpenAI(base_url=gw.url + "/llm/v1", api_key="unused", max_retries=0)
        ant = anthropic.Anthropic(base_url=gw.url + "/llm", api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "hi [stub content=2]"}]
        assert _ttl(gw) is None
        oa.chat.completions.create(model="m", messages=msgs, max_tokens=8, extra_body={"keep_alive": "1h"})
        assert _ttl(gw) == 3600.0
        with oa.chat.completions.create(model="m", messages=msgs, max_tokens=8, stream=True,
                                        extra_body={"keep_alive": 7200}) as s:
            assert "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
        assert _ttl(gw) == 7200.0
        ant.messages.create(model="m", messages=msgs, max_tokens=8, extra_body={"keep_alive": "3h"})
        assert _ttl(gw) == 10800.0
        oa.responses.create(model="m", input="hi [stub content=2]", store=False, extra_body={"keep_alive": "4h"})
        assert _ttl(gw) == 14400.0
        status, doc = gw.post("/llm/v1beta/models/m:generateContent",
                              {"contents": [{"role": "user", "parts": [{"text": "hi [stub content=2]"}]}],
                               "keep_alive": "5h"})
        assert status == 200, doc
        assert _ttl(gw) == 18000.0
        oa.completions.create(model="m", prompt="hi [stub content=2]", max_tokens=4, extra_body={"keep_alive": "6h"})
        assert _ttl(gw) == 21600.0
        oa.embeddings.create(model="m", input=["one"], extra_body={"keep_alive": "7h"})
        assert _ttl(gw) == 25200.0
        ollama.Client(host=gw.url).embed(model="m", input=["one"], keep_alive="8h")
        assert _ttl(gw) == 28800.0
        # a request that says nothing leaves it as it is
        oa.chat.completions.create(model="m", messages=msgs, max_tokens=8)
        assert _ttl(gw) == 28800.0
        # Ollama's /v1 client asking for a second: the server stops a second after this request
        pid = backends(gw)["a"]["pid"]
        oa.chat.completions.create(model="m", messages=msgs, max_tokens=8, extra_body={"keep_alive": "1s"})
        wait_state(gw, "a", "stopped", timeout=20)
        wait_gone(pid)
        assert port_closed(port)


def test_the_operator_caps_a_clients_keep_alive():
    gw, port = _gateway(idle_ttl_s=600, client_keep_alive={"max_s": 1})
    with gw:
        oa = openai.OpenAI(base_url=gw.url + "/llm/v1", api_key="unused", max_retries=0)
        oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi [stub content=2]"}],
                                   max_tokens=8, extra_body={"keep_alive": -1})  # forever, asked
        assert _ttl(gw) == 1.0
        pid = backends(gw)["a"]["pid"]
        wait_state(gw, "a", "stopped", timeout=20)
        wait_gone(pid)
        assert port_closed(port)


def test_the_operator_can_ignore_a_clients_keep_alive():
    gw, _ = _gateway(idle_ttl_s=600, client_keep_alive={"honour": False})
    with gw:
        client = ollama.Client(host=gw.url)
        assert client.chat(model="m", messages=[{"role": "user", "content": "hi [stub content=2]"}],
                           keep_alive="1s").done
        assert _ttl(gw) == 600
        assert client.generate(model="m", prompt="", keep_alive=0).done_reason == "unload"  # answered as Ollama does
        b = wait_state(gw, "a", "ready")
        assert b["pid"] is not None and _ttl(gw) == 600  # and nothing unloaded


def test_keep_alive_zero_with_a_prompt_answers_then_unloads():
    gw, port = _gateway()
    with gw:
        client = ollama.Client(host=gw.url)
        got = client.chat(model="m", messages=[{"role": "user", "content": "hi [stub content=3]"}], keep_alive=0)
        assert got.done and got.message.content  # answered whole, not refused by its own unload
        wait_state(gw, "a", "stopped", timeout=20)
        assert port_closed(port)
        starts = [ln for ln in gw.stderr().splitlines() if "backend a: stopped -> starting" in ln]
        assert len(starts) == 1, starts  # started once: not stopped under the request and started again


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_keep_alive_that_is_no_duration_is_a_400_naming_the_field(dialect):
    gw, _ = _gateway()
    with gw:
        msgs = [{"role": "user", "content": "hi"}]
        if dialect == "openai":
            oa = openai.OpenAI(base_url=gw.url + "/llm/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.BadRequestError) as err:
                oa.chat.completions.create(model="m", messages=msgs, extra_body={"keep_alive": "soon"})
            assert err.value.body["param"] == "keep_alive" and "keep_alive" in err.value.body["message"]
        else:
            ant = anthropic.Anthropic(base_url=gw.url + "/llm", api_key="unused", max_retries=0)
            with pytest.raises(anthropic.BadRequestError) as err:
                ant.messages.create(model="m", messages=msgs, max_tokens=8, extra_body={"keep_alive": [5]})
            assert err.value.body["type"] == "error" and "keep_alive" in err.value.body["error"]["message"]
        assert backends(gw)["a"]["state"] == "stopped"  # refused before anything started
