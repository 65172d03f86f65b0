"""Open WebUI's own requests for speech, images and reranking, replayed through the gateway as
its backend makes them (read in open-webui's backend/open_webui/routers/audio.py,
routers/images.py and retrieval/models/external.py): the same client libraries (`requests`
for transcription, pickers and the external reranker; aiohttp for speech and images), the same
bodies, and the same reading of the answers. The gateway fronts the stub's whisper.cpp,
kokoro-fastapi, vLLM and sd-server flavours, with a key, as docs/speech-rerank-images.md tells
an operator to set Open WebUI up."""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile

import aiohttp
import pytest
import requests

from gwproc import Gateway, config_for
from stubproc import start_stub, wait_for
from support.media_client import wav

KEY, ADMIN = "sk-open-webui", "sk-admin-owui"
ENV = {"KEY": KEY, "ADMIN_KEY": ADMIN}
AUTH = {"keys": [{"name": "open-webui", "key_env": "KEY"}], "admin_key_env": "ADMIN_KEY"}
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")


@pytest.fixture(scope="module")
def gw():
    with start_stub("whispercpp") as whisper, start_stub("kokoro") as kokoro, \
            start_stub("vllm", "--model", "BAAI/bge-reranker-base") as vllm, start_stub("sdcpp") as sd:
        cfg = config_for({"w": {"url": whisper.url, "kind": "whispercpp", "slots": 1},
                          "k": {"url": kokoro.base, "kind": "openai", "slots": 1},
                          "v": {"url": vllm.base, "kind": "vllm", "slots": 2},
                          "sd": {"url": sd.base, "kind": "openai", "slots": 1}},
                         {"whisper-1": {"backend": "w"},
                          "tts-1": {"backend": "k", "upstream_model": "kokoro", "capabilities": ["speech"]},
                          "reranker": {"backend": "v", "upstream_model": "BAAI/bge-reranker-base"},
                          "sd": {"backend": "sd", "upstream_model": "sd-cpp-local"}},
                         auth=AUTH)
        with Gateway(cfg, env=ENV) as g:
            wait_for(lambda: all(b["up"] for b in g.admin({"authorization": f"Bearer {ADMIN}"})["backends"].values()), 10)
            yield g


def test_speech_to_text_as_open_webui_transcribes(gw):
    # audio.py transcribe(), engine "openai": requests with files= and data=
    base = gw.url + "/v1"
    with tempfile.TemporaryDirectory() as d:
        file_path = os.path.join(d, "0b1c.wav")
        with open(file_path, "wb") as f:
            f.write(wav(1.5))
        r = requests.post(url=f"{base}/audio/transcriptions", headers={"Authorization": f"Bearer {KEY}"},
                          files={"file": ("0b1c.wav", open(file_path, "rb"))}, data={"model": "whisper-1"})
    r.raise_for_status()
    assert r.json()["text"].strip()


def test_text_to_speech_and_its_pickers_as_open_webui_asks(gw):
    base = gw.url + "/v1"
    payload = {"input": "Hello from Open WebUI.", "voice": "af_heart"}
    payload["model"] = "tts-1"  # speech(): the configured TTS_MODEL replaces the client's

    async def speak() -> tuple[int, bytes]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), trust_env=True) as session:
            async with session.post(url=f"{base}/audio/speech", json=payload,
                                    headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}) as r:
                r.raise_for_status()
                return r.status, await r.read()

    status, audio = asyncio.run(speak())
    assert status == 200 and len(audio) > 0
    # get_available_models() / get_available_voices(), in the versions that send the key
    headers = {"Authorization": f"Bearer {KEY}"}
    models = requests.get(f"{base}/audio/models", headers=headers)
    models.raise_for_status()
    assert [m["id"] for m in models.json().get("models", [])] == ["tts-1"]
    response = requests.get(f"{base}/audio/voices", headers=headers)
    response.raise_for_status()
    voices = {voice["id"]: voice["name"] for voice in response.json().get("voices", [])}
    assert "af_heart" in voices
    # the versions that send no key get the gateway's 401, and fall back to OpenAI's voice names
    assert requests.get(f"{base}/audio/voices").status_code == 401


def test_the_external_reranker_as_open_webui_scores_documents(gw):
    # retrieval/models/external.py ExternalReranker.predict, its url the full rerank endpoint
    sentences = [("capital of France", "The cat sat."), ("capital of France", "Paris is the capital of France."),
                 ("capital of France", "Berlin is in Germany.")]
    query = sentences[0][0]
    docs = [i[1] for i in sentences]
    payload = {"model": "reranker", "query": query, "documents": docs, "top_n": len(docs)}
    r = requests.post(f"{gw.url}/v1/rerank", headers={"Content-Type": "application/json",
                                                      "Authorization": f"Bearer {KEY}"}, json=payload)
    r.raise_for_status()
    data = r.json()
    assert "results" in data
    scores = [result["relevance_score"] for result in sorted(data["results"], key=lambda x: x["index"])]
    assert len(scores) == 3 and max(scores) == scores[1]


def test_image_generation_and_edit_as_open_webui_makes_them(gw):
    base = gw.url + "/v1"
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    data = {"model": "sd", "prompt": "a lighthouse", "n": 1, "size": "64x64", "response_format": "b64_json"}

    async def both():
        async with aiohttp.ClientSession() as session:
            async with session.post(url=f"{base}/images/generations", json=data, headers=headers) as r:
                r.raise_for_status()
                res = await r.json(content_type=None)
            form = aiohttp.FormData()
            for key, value in {"model": "sd", "prompt": "make it night", "response_format": "b64_json"}.items():
                form.add_field(key, str(value))
            form.add_field("image", PNG, filename="image.png", content_type="image/png")
            async with session.post(url=f"{base}/images/edits", data=form,
                                    headers={"Authorization": f"Bearer {KEY}"}) as r:
                r.raise_for_status()
                edited = await r.json(content_type=None)
        return res, edited

    res, edited = asyncio.run(both())
    for doc in (res, edited):
        image = base64.b64decode(doc["data"][0]["b64_json"])
        assert image.startswith(b"\x89PNG")
