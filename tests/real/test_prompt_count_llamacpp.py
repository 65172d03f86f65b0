"""The context clamp counted by real llama.cpp: `/apply-template` + `/tokenize` give exactly the
prompt size llama-server itself reports, so `max_tokens` is the context less that, first time.

Needs llama-server and the Gemma 3 270M GGUF from `.ci/deps/llama-cpp.sh` (cached under
~/.cache/homelab-frontend/llama.cpp); without them this fails, it does not skip. Between the
gateway and llama-server sits the recording proxy, so the test reads what the gateway sent."""

from __future__ import annotations

import json
import urllib.request

import pytest

from gwproc import Gateway, config_for
from llamaproc import module_llama
from rawhttp import post_raw
from recording_proxy import RecordingProxy

CTX = 2048

pytestmark = pytest.mark.timeout(180)


llama = module_llama(parallel=1, ctx=CTX)


def test_llamacpp_tokenizer_sets_max_tokens_to_the_exact_room(llama):
    with RecordingProxy(llama) as proxy:
        cfg = config_for({"cpu": {"url": proxy.url + "/v1", "kind": "llamacpp", "slots": 1}},
                         {"gemma": {"backend": "cpu", "max_model_len": CTX}})
        with Gateway(cfg) as gw:
            body = {"model": "gemma", "max_tokens": 128000, "stream": True, "system": "Be brief.",
                    "messages": [{"role": "user", "content": "Name three colours."}]}
            # the answer itself is not the point: a few frames, then the client leaves
            req = urllib.request.Request(gw.base + "/messages", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                assert resp.status == 200
                resp.read(200)
        # health probes, and the leak check's look at llama.cpp's own running count
            paths = [x.path for x in proxy.exchanges if x.path not in ("/v1/models", "/metrics")]
        assert paths[:3] == ["/apply-template", "/tokenize", "/v1/chat/completions"], paths
        chat = next(x for x in proxy.exchanges if x.path == "/v1/chat/completions").body
    # what llama-server itself counts for that very body
    status, _, raw = post_raw(llama + "/v1/chat/completions", {**chat, "stream": False, "max_tokens": 1})
    assert status == 200, raw
    prompt = json.loads(raw)["usage"]["prompt_tokens"]
    assert chat["max_tokens"] == CTX - prompt
