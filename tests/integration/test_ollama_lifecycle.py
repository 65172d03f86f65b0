"""Ollama's API over managed backends (`run:`): what an Ollama client says of its model's
lifetime (a load request, `keep_alive`, an unload) acts on the server the gateway runs, judged by
the process and its port, and `/api/ps` lists a loaded model. Driven by the official `ollama`
Python library."""

from __future__ import annotations

import ollama

from gwproc import Gateway, config_for
from managed import backends, port_closed, stub_backend, wait_gone, wait_state


def _gateway(**run):
    backend = stub_backend("vllm", model="m", **run)
    port = int(backend["url"].rsplit(":", 1)[1].split("/")[0])
    return Gateway(config_for({"a": backend}, {"m": {"backend": "a"}}, resources={"gpu": 1})), port


def test_load_keep_alive_and_unload_act_on_the_managed_server():
    gw, port = _gateway()  # idle_ttl_s: null, so only the client's keep_alive can stop it
    with gw:
        client = ollama.Client(host=gw.url)
        assert backends(gw)["a"]["state"] == "stopped"
        # a generate without a prompt loads the model, as it does in Ollama
        loaded = client.generate(model="m", prompt="")
        assert loaded.done and loaded.done_reason == "load"
        wait_state(gw, "a", "ready")
        assert [m.model for m in client.ps().models] == ["m:latest"]
        # keep_alive -1: never unloaded for idleness
        assert client.chat(model="m", messages=[{"role": "user", "content": "hi [stub content=2]"}],
                           keep_alive=-1).done
        assert backends(gw)["a"]["idle_ttl_s"] is None
        # keep_alive "1s": the server stops a second after this request, and its port closes
        assert client.chat(model="m", messages=[{"role": "user", "content": "hi [stub content=2]"}],
                           keep_alive="1s").done
        pid = backends(gw)["a"]["pid"]
        assert backends(gw)["a"]["idle_ttl_s"] == 1.0
        wait_state(gw, "a", "stopped", timeout=20)
        wait_gone(pid)
        assert port_closed(port)
        assert client.ps().models == []
        # the next request starts it again; an unload (keep_alive 0) stops it
        assert client.generate(model="m", prompt="hi [stub content=2]").done
        pid = backends(gw)["a"]["pid"]
        unloaded = client.generate(model="m", prompt="", keep_alive=0)
        assert unloaded.done_reason == "unload"
        wait_state(gw, "a", "stopped", timeout=20)
        wait_gone(pid)


def test_embed_load_duration_is_the_servers_start_as_for_a_chat():
    gw, _ = _gateway()
    with gw:
        client = ollama.Client(host=gw.url)
        assert backends(gw)["a"]["state"] == "stopped"
        cold = client.embed(model="m", input=["one"])  # waits for the server to start
        assert 0 < cold.load_duration <= cold.total_duration
        warm = client.embed(model="m", input=["one"])
        assert warm.load_duration == 0 and warm.total_duration > 0


def test_a_keep_alive_that_is_no_duration_is_a_400_naming_the_field():
    gw, _ = _gateway()
    with gw:
        client = ollama.Client(host=gw.url)
        try:
            client.chat(model="m", messages=[{"role": "user", "content": "hi"}], keep_alive="soon")
        except ollama.ResponseError as err:
            assert err.status_code == 400 and "keep_alive" in err.error
        else:
            raise AssertionError("accepted keep_alive 'soon'")
        assert backends(gw)["a"]["state"] == "stopped"  # refused before anything started
