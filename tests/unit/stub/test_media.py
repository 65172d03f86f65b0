"""The stub's rerank, score, speech and image endpoints (stub/rerank.py, audio.py, images.py,
media.py, media_flavours.py) over a loopback socket: each server's shapes, the directives, and the
evidence the gateway's tests judge it by (one `request` line, then exactly one `completed` or
`cancelled` line; in_flight back to 0; upload bytes counted as they arrive; the concurrency seen).
The pure parts of rerank.py, audio.py, images.py and media_flavours.py: their own test files."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from pathlib import Path

import aiohttp
import pytest

from homelab_frontend.stub.media import parse_media_directives, wav_header, wav_seconds
from homelab_frontend.stub.server import StubServer
from homelab_frontend.stub.state import StubConfig

DOCS = ["Bananas are yellow and sweet.", "The Eiffel Tower stands in Paris, the capital of France.",
        "Berlin is a city in Germany."]
QUERY = "What is the capital of France?"


def wav(seconds: float, rate: int = 16000) -> bytes:
    data = b"\0\0" * int(seconds * rate)
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) + b"data" + struct.pack("<I", len(data)) + data)


def form(file: bytes | None = None, filename: str = "speech.wav", name: str = "file", **fields: str) -> aiohttp.FormData:
    data = aiohttp.FormData(default_to_multipart=True)
    for key, value in fields.items():
        data.add_field(key, value)
    if file is not None:
        data.add_field(name, file, filename=filename, content_type="audio/wav")
    return data


def run(flavour: str, scenario, tmp_path: Path, **config):
    """Run `scenario(http, stub)` against a stub of that flavour; -> (its result, the log lines)."""
    log = tmp_path / f"{flavour}.log"

    async def main():
        async with StubServer(StubConfig(flavour=flavour, log=str(log), **config)) as stub:
            async with aiohttp.ClientSession() as http:
                result = await scenario(http, stub)
            for _ in range(200):  # the handler's end (its finally) may trail the client's
                if stub.state.stats.in_flight == 0:
                    break
                await asyncio.sleep(0.01)
            return result, stub.state.stats.as_dict()

    result, stats = asyncio.run(main())
    return result, stats, log.read_text().splitlines()


def ends(lines: list[str]) -> list[str]:
    return [ln.split()[0] for ln in lines if ln.split()[0] in ("completed", "cancelled", "failed", "rejected")]


# -- pure parts --

def test_directives_read_only_known_keys_and_clamp_at_zero():
    d = parse_media_directives("hi [stub delay_ms=30 chunks=2 status=503 bogus=1 read_ms=-5] there")
    assert (d.delay_ms, d.chunks, d.status, d.read_ms) == (30, 2, 503, 0)
    assert parse_media_directives(None).delay_ms is None
    assert parse_media_directives("no directive").status is None


def test_wav_seconds_reads_the_header_and_a_streamed_header_falls_back_to_the_size():
    assert wav_seconds(wav(2.5)[:64], len(wav(2.5))) == pytest.approx(2.5)
    header = wav_header(24000)
    assert wav_seconds(header, len(header) + 48000) == pytest.approx(1.0)
    assert wav_seconds(b"ID3" + b"\0" * 60, 1000) is None


# -- rerank and score --

def test_vllm_rerank_orders_by_relevance_cuts_to_top_n_and_echoes_documents(tmp_path):
    async def scenario(http, stub):
        out = []
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            async with http.post(stub.url + path, json={"model": "rr", "query": QUERY, "documents": DOCS,
                                                        "top_n": 2, "return_documents": False}) as r:
                out.append((r.status, await r.json()))
        return out

    out, stats, lines = run("vllm", scenario, tmp_path, models=("rr",))
    for status, body in out:
        assert status == 200
        assert body["id"].startswith("score-") and body["model"] == "rr"
        assert [r["index"] for r in body["results"]] == [1, 0] or [r["index"] for r in body["results"]][0] == 1
        assert len(body["results"]) == 2
        assert body["results"][0]["document"] == {"text": DOCS[1], "multi_modal": None}
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] > 0
    assert ends(lines) == ["completed"] * 3 and stats["max_in_flight"] == 1


def test_vllm_rerank_refuses_text_objects_and_unknown_models_in_its_shape(tmp_path):
    async def scenario(http, stub):
        out = []
        for body in ({"model": "rr", "query": QUERY, "documents": [{"text": "a"}]},
                     {"model": "nope", "query": QUERY, "documents": DOCS},
                     {"model": "rr", "query": f"{QUERY} [stub status=503]", "documents": DOCS}):
            async with http.post(stub.url + "/v1/rerank", json=body) as r:
                out.append((r.status, await r.json()))
        return out

    out, _, lines = run("vllm", scenario, tmp_path, models=("rr",))
    assert [s for s, _ in out] == [400, 404, 503]
    assert out[0][1]["error"]["param"] == "body.documents" and out[0][1]["error"]["code"] == 400
    assert out[0][1]["error"]["type"] == "Bad Request"  # as vLLM 0.32 answers a body its model refuses
    assert "does not exist" in out[1][1]["error"]["message"]
    assert ends(lines) == ["rejected"] * 3


def test_vllm_score_pairs_one_to_many_and_refuses_mismatched_lengths(tmp_path):
    async def scenario(http, stub):
        async with http.post(stub.url + "/score", json={"model": "rr", "text_1": QUERY, "text_2": DOCS}) as r:
            one = (r.status, await r.json())
        async with http.post(stub.url + "/v1/score", json={"model": "rr", "queries": [QUERY, QUERY],
                                                           "documents": DOCS}) as r:
            bad = (r.status, await r.json())
        return one, bad

    (one, bad), _, _ = run("vllm", scenario, tmp_path, models=("rr",))
    assert one[0] == 200 and one[1]["object"] == "list"
    assert [d["index"] for d in one[1]["data"]] == [0, 1, 2] and all(d["object"] == "score" for d in one[1]["data"])
    scores = [d["score"] for d in one[1]["data"]]
    assert scores.index(max(scores)) == 1
    assert bad[0] == 400 and "1:1, 1:N or N:N" in bad[1]["error"]["message"]


def test_llamacpp_rerank_answers_jina_and_tei_shapes_and_501_without_reranking(tmp_path):
    async def scenario(http, stub):
        async with http.post(stub.url + "/v1/rerank", json={"model": "m", "query": QUERY, "documents": DOCS,
                                                            "top_n": 1}) as r:
            jina = (r.status, await r.json())
        async with http.post(stub.url + "/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}) as r:
            tei = (r.status, await r.json())
        async with http.post(stub.url + "/reranking", json={"query": QUERY, "documents": [{"text": "a"}]}) as r:
            objects = (r.status, await r.json())
        return jina, tei, objects

    (jina, tei, objects), _, _ = run("llamacpp", scenario, tmp_path)
    assert jina[0] == 200 and jina[1]["results"] == [{"index": 1, "relevance_score": jina[1]["results"][0]["relevance_score"]}]
    assert jina[1]["model"] == "m" and jina[1]["object"] == "list"
    assert tei[0] == 200 and tei[1][0]["index"] == 1 and tei[1][0]["text"] == DOCS[1] and "score" in tei[1][0]
    assert objects == (400, {"error": {"code": 400, "message": '"documents" must be a non-empty string array',
                                       "type": "invalid_request_error"}})

    async def without(http, stub):
        async with http.post(stub.url + "/v1/rerank", json={"query": QUERY, "documents": DOCS}) as r:
            return r.status, await r.json()

    (status, body), _, _ = run("llamacpp", without, tmp_path, reranking=False)
    assert status == 501 and body["error"]["type"] == "not_supported_error"


def test_rerank_concurrency_is_counted_and_a_client_gone_mid_scoring_is_cancelled(tmp_path):
    async def scenario(http, stub):
        body = {"model": "rr", "query": f"{QUERY} [stub delay_ms=100]", "documents": DOCS}
        both = [asyncio.create_task(http.post(stub.url + "/rerank", json=body)) for _ in range(2)]
        for r in await asyncio.gather(*both):
            assert r.status == 200
            r.release()
        with pytest.raises(asyncio.TimeoutError):
            async with http.post(stub.url + "/rerank", json=body, timeout=aiohttp.ClientTimeout(total=0.15)) as r:
                await r.read()

    _, stats, lines = run("vllm", scenario, tmp_path, models=("rr",))
    assert stats["max_in_flight"] == 2 and stats["in_flight"] == 0
    assert ends(lines) == ["completed", "completed", "cancelled"]
    assert sum("cancelled" in ln for ln in lines) == 1


# -- speech to text --

def test_whispercpp_answers_each_format_with_its_content_type(tmp_path):
    async def scenario(http, stub):
        out = {}
        for fmt in ("json", "text", "srt", "vtt", "verbose_json", "bogus"):
            async with http.post(stub.url + "/inference", data=form(wav(3), response_format=fmt)) as r:
                out[fmt] = (r.status, r.headers["Content-Type"], await r.text())
        async with http.get(stub.url + "/v1/models") as r:
            out["models"] = (r.status, "", "")
        async with http.get(stub.url + "/health") as r:
            out["health"] = (r.status, "", await r.text())
        return out

    out, stats, lines = run("whispercpp", scenario, tmp_path)
    assert out["json"][:2] == (200, "application/json") and json.loads(out["json"][2])["text"].startswith(" Hello")
    assert out["text"][1] == "text/html; charset=utf-8"
    assert out["srt"][1] == "application/x-subrip" and out["srt"][2].startswith("1\n00:00:00,000 --> 00:00:01,000\n")
    assert out["vtt"][1] == "text/vtt" and out["vtt"][2].startswith("WEBVTT\n\n00:00:00.000 --> ")
    verbose = json.loads(out["verbose_json"][2])
    assert verbose["duration"] == pytest.approx(3.0) and len(verbose["segments"]) == 3
    assert set(json.loads(out["bogus"][2])) == {"text"}
    assert out["models"][0] == 404 and out["health"] == (200, "", '{"status":"ok"}')
    assert stats["upload_bytes"] == 6 * len(wav(3))
    assert any(ln.startswith("upload model=None bytes=") for ln in lines)


def test_whispercpp_refusals_and_its_inference_path(tmp_path):
    async def scenario(http, stub):
        out = []
        async with http.post(stub.url + "/v/asr", data=form(None, response_format="json")) as r:
            out.append((r.status, await r.json()))
        async with http.post(stub.url + "/v/asr", data=form(b"ID3 not a wav" * 10, filename="a.mp3")) as r:
            out.append((r.status, await r.json()))
        async with http.post(stub.url + "/inference", data=form(wav(1))) as r:
            out.append((r.status, None))
        return out

    out, _, _ = run("whispercpp", scenario, tmp_path, request_path="/v", inference_path="/asr")
    assert out == [(400, {"error": "no 'file' field in the request"}), (400, {"error": "failed to read audio data"}),
                   (404, None)]


def test_whispercpp_decodes_one_request_at_a_time(tmp_path):
    async def scenario(http, stub):
        async def one():
            async with http.post(stub.url + "/inference",
                                 data=form(wav(1), prompt="[stub delay_ms=60 chunks=2]")) as r:
                return r.status, asyncio.get_running_loop().time()
        return await asyncio.gather(one(), one())

    out, stats, _ = run("whispercpp", scenario, tmp_path)
    (s1, t1), (s2, t2) = out
    assert s1 == s2 == 200
    assert abs(t1 - t2) >= 0.1  # the second waited for the first's two 60 ms segments
    assert stats["max_in_flight"] == 2  # both held by the server meanwhile


def test_vllm_transcription_json_is_json_for_text_too_and_streams_its_chunks(tmp_path):
    async def scenario(http, stub):
        out = {}
        for fmt in ("json", "text", "srt"):
            async with http.post(stub.url + "/v1/audio/transcriptions",
                                 data=form(wav(2.2), model="whisper", response_format=fmt)) as r:
                out[fmt] = (r.status, await r.json())
        async with http.post(stub.url + "/v1/audio/translations", data=form(wav(1), model="whisper")) as r:
            out["translate"] = (r.status, await r.json())
        async with http.post(stub.url + "/v1/audio/transcriptions",
                             data=form(wav(1), model="whisper", stream="true", stream_include_usage="true")) as r:
            out["stream"] = (r.status, await r.text())
        return out

    out, _, _ = run("vllm", scenario, tmp_path, models=("whisper",))
    assert out["json"][1]["usage"] == {"type": "duration", "seconds": 3}
    assert out["text"] == out["json"]
    assert out["srt"][0] == 400 and "only support response_format" in out["srt"][1]["error"]["message"]
    assert set(out["translate"][1]) == {"text"}
    frames = [ln[6:] for ln in out["stream"][1].split("\n") if ln.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert all(c["object"] == "transcription.chunk" and c["id"].startswith("transcribe-") for c in chunks)
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] > 0


def test_speaches_transcription_formats_and_its_stream_events(tmp_path):
    model = "Systran/faster-whisper-tiny.en"

    async def scenario(http, stub):
        out = {}
        for fmt in ("text", "srt", "vtt", "json"):
            async with http.post(stub.url + "/v1/audio/transcriptions",
                                 data=form(wav(1), model=model, response_format=fmt)) as r:
                out[fmt] = (r.status, r.headers["Content-Type"], await r.text())
        async with http.post(stub.url + "/v1/audio/transcriptions",
                             data=form(wav(1), model=model, stream="true", prompt="[stub chunks=2]")) as r:
            out["stream"] = (r.status, r.headers["Content-Type"], await r.text())
        async with http.post(stub.url + "/v1/audio/transcriptions", data=form(None, model=model)) as r:
            out["missing"] = (r.status, "", await r.text())
        return out

    out, _, _ = run("speaches", scenario, tmp_path)
    assert out["text"][1].startswith("text/plain") and out["srt"][1].startswith("text/plain")
    assert out["vtt"][1].startswith("text/vtt")
    assert json.loads(out["json"][2]) == {"text": out["text"][2], "logprobs": None, "usage": None}
    events = [json.loads(ln[6:]) for ln in out["stream"][2].split("\n") if ln.startswith("data: ")]
    assert [e["type"] for e in events] == ["transcript.text.delta"] * 2 + ["transcript.text.done"]
    assert events[-1]["text"] == events[0]["delta"] + events[1]["delta"]
    assert out["missing"][0] == 422 and json.loads(out["missing"][2])["detail"][0]["loc"] == ["body", "file"]


def test_a_client_gone_mid_upload_is_cancelled_with_the_bytes_read_so_far(tmp_path):
    total = 2 * 1024 * 1024

    async def scenario(http, stub):
        async def body():
            for _ in range(4):
                yield b"x" * 128 * 1024
            await asyncio.sleep(30)  # the rest never comes: the client gives up first

        data = aiohttp.FormData()
        data.add_field("response_format", "json")
        data.add_field("file", body(), filename="big.wav", content_type="audio/wav")
        with pytest.raises(asyncio.TimeoutError):
            async with http.post(stub.url + "/inference", data=data,
                                 timeout=aiohttp.ClientTimeout(total=0.5)) as r:
                await r.read()
        return total

    _, stats, lines = run("whispercpp", scenario, tmp_path)
    assert ends(lines) == ["cancelled"]
    assert 0 < stats["upload_bytes"] < total and stats["in_flight"] == 0
    assert "bytes in" in lines[-1]


# -- text to speech --

def test_speech_streams_its_chunks_at_a_pace_with_the_format_content_type(tmp_path):
    async def scenario(http, stub):
        body = {"model": "kokoro", "input": "Hello there [stub chunks=4 delay_ms=30 chunk_bytes=100]",
                "voice": "af_heart", "response_format": "wav"}
        times, data = [], b""
        async with http.post(stub.url + "/v1/audio/speech", json=body) as r:
            headers = dict(r.headers)
            async for piece in r.content.iter_any():
                times.append(asyncio.get_running_loop().time())
                data += piece
        return headers, times, data

    (headers, times, data), stats, lines = run("kokoro", scenario, tmp_path)
    assert headers["Content-Type"] == "audio/wav" and headers["X-Accel-Buffering"] == "no"
    assert headers["Content-Disposition"] == "attachment; filename=speech.wav"
    assert data[:4] == b"RIFF" and len(data) == 44 + 4 * 100
    assert times[-1] - times[0] >= 0.06  # chunks arrived as made, not all at once
    assert ends(lines) == ["completed"] and "chunks=4" in lines[-1]
    assert stats["prompt_tokens"] == len("Hello there [stub chunks=4 delay_ms=30 chunk_bytes=100]")


def test_speaches_speech_sse_events_and_its_voice_and_model_lists(tmp_path):
    model = "speaches-ai/Kokoro-82M-v1.0-ONNX"

    async def scenario(http, stub):
        body = {"model": model, "input": "Hi [stub chunks=3 delay_ms=0 chunk_bytes=10]", "voice": "af_heart",
                "stream_format": "sse"}
        async with http.post(stub.url + "/v1/audio/speech", json=body) as r:
            sse = (r.headers["Content-Type"], await r.text())
        async with http.get(stub.url + "/v1/audio/voices") as r:
            voices = await r.json()
        async with http.get(stub.url + "/v1/audio/models") as r:
            models = await r.json()
        async with http.post(stub.url + "/v1/audio/speech", json={"model": model, "input": "x"}) as r:
            missing = (r.status, await r.json())
        return sse, voices, models, missing

    (sse, voices, models, missing), _, _ = run("speaches", scenario, tmp_path)
    events = [json.loads(ln[6:]) for ln in sse[1].split("\n") if ln.startswith("data: ")]
    assert sse[0].startswith("text/event-stream")
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    assert len(base64.b64decode(events[0]["audio"])) == 10
    assert voices["voices"][0] == {"name": "af_heart", "language": "en-us", "gender": "female", "id": "af_heart"}
    assert [m["id"] for m in models["models"]] == [model]
    assert missing[0] == 422 and missing[1]["detail"][0]["loc"] == ["body", "voice"]


def test_a_client_gone_mid_audio_stream_is_cancelled(tmp_path):
    async def scenario(http, stub):
        body = {"model": "kokoro", "input": "Long [stub chunks=50 delay_ms=50]", "voice": "af_heart"}
        async with http.post(stub.url + "/v1/audio/speech", json=body) as r:
            await r.content.readany()
            r.close()  # leaves mid-stream
        await asyncio.sleep(0.2)

    _, stats, lines = run("kokoro", scenario, tmp_path)
    assert ends(lines) == ["cancelled"] and stats["in_flight"] == 0
    done = int(lines[-1].split(" after ")[1].split()[0])
    assert 1 <= done < 50


def test_kokoro_refuses_an_unknown_model_with_its_detail_object(tmp_path):
    async def scenario(http, stub):
        async with http.post(stub.url + "/v1/audio/speech", json={"model": "nope", "input": "x"}) as r:
            return r.status, await r.json()

    (status, body), _, _ = run("kokoro", scenario, tmp_path)
    assert status == 400 and body["detail"]["message"] == "Unsupported model: nope"


# -- images --

def test_sdcpp_generates_pngs_of_the_size_asked_as_b64_json(tmp_path):
    async def scenario(http, stub):
        async with http.post(stub.url + "/v1/images/generations",
                             json={"model": "anything", "prompt": "a cat [stub steps=2]", "n": 2, "size": "64x32",
                                   "response_format": "url"}) as r:
            ok = (r.status, await r.json())
        async with http.post(stub.url + "/v1/images/generations", json={"n": 1}) as r:
            no_prompt = (r.status, await r.json())
        async with http.get(stub.url + "/v1/models") as r:
            models = await r.json()
        return ok, no_prompt, models

    (ok, no_prompt, models), _, lines = run("sdcpp", scenario, tmp_path)
    assert ok[0] == 200 and ok[1]["output_format"] == "png" and len(ok[1]["data"]) == 2
    image = base64.b64decode(ok[1]["data"][0]["b64_json"])
    assert image[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", image[16:24]) == (64, 32)
    assert no_prompt == (400, {"error": "prompt required"})
    assert models["data"][0]["id"] == "sd-cpp-local"
    assert "steps=4" in [ln for ln in lines if ln.startswith("completed")][0]  # 2 images x 2 steps


def test_sdcpp_edits_are_multipart_and_a_client_gone_mid_render_is_cancelled(tmp_path):
    async def scenario(http, stub):
        async with http.post(stub.url + "/v1/images/edits", json={"prompt": "x"}) as r:
            not_multipart = (r.status, await r.json())
        async with http.post(stub.url + "/v1/images/edits", data=form(None, prompt="x")) as r:
            no_image = (r.status, await r.json())
        async with http.post(stub.url + "/v1/images/edits",
                             data=form(b"\x89PNG" + b"\0" * 5000, filename="in.png", name="image", prompt="edit",
                                       size="16x16")) as r:
            edited = (r.status, await r.json())
        with pytest.raises(asyncio.TimeoutError):
            async with http.post(stub.url + "/v1/images/generations", json={"prompt": "slow [stub delay_ms=200]"},
                                 timeout=aiohttp.ClientTimeout(total=0.3)) as r:
                await r.read()
        return not_multipart, no_image, edited

    (not_multipart, no_image, edited), stats, lines = run("sdcpp", scenario, tmp_path)
    assert not_multipart == (400, {"error": "Content-Type must be multipart/form-data"})
    assert no_image == (400, {"error": "at least one image[] required"})
    assert edited[0] == 200 and len(edited[1]["data"]) == 1
    assert stats["upload_bytes"] == 5004
    assert ends(lines) == ["rejected", "rejected", "completed", "cancelled"]


def test_the_cli_flags_of_the_media_servers_reach_the_config():
    import argparse

    from homelab_frontend.stub import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    config = cli.config_from_args(parser.parse_args(
        ["--port", "0", "--flavour", "whispercpp", "--request-path", "/v", "--inference-path", "/asr",
         "--upload-read-ms", "5", "--no-rerank"]))
    assert (config.flavour, config.request_path, config.inference_path) == ("whispercpp", "/v", "/asr")
    assert config.upload_read_ms == 5 and config.reranking is False
    defaults = cli.config_from_args(parser.parse_args(["--port", "0", "--flavour", "sdcpp"]))
    assert defaults.inference_path == "/inference" and defaults.reranking is True and defaults.upload_read_ms == 0
