"""`python -m bench.media`: the relayed calls through the gateway against the same calls direct.

Three figures (issue 37's aims in brackets), each from one run with direct and gateway measured
back to back, alternating, so that the machine's other load falls on both:

1. speech's first audio byte: POST /v1/audio/speech to a kokoro-fastapi-flavoured stub that
   answers its first chunk at once; the time from the request's last byte to the answer's first
   body byte, one stream at a time, median over `--n` (aim: at most +1 ms through the gateway);
2. a 20 MB upload's throughput: a WAV posted to a whisper.cpp-flavoured stub (which reads it
   with aiohttp's multipart reader and answers a short transcript), the whole request's time to
   its answer, direct and through the gateway, median of `--reps` (aim: the ratio at least 0.9);
3. the gateway's memory with four 20 MB uploads in flight at once: the backend reads slowly
   (`--upload-read-ms` per 64 KiB), the gateway's RSS is sampled every 20 ms while all four are
   in flight, its peak minus its idle RSS before them (aim: under 40 MB).

Loopback only; the stubs and the gateway are child processes (bench/procs.py); the client is
this process, raw sockets.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import sys
import threading
import time
from urllib.parse import urlsplit

import yaml

from .procs import Proc, memory_mb, workdir

MB = 1024 * 1024
BOUNDARY = "bench-media-boundary"


def _stub(wd: str, name: str, flavour: str, *args: str) -> Proc:
    return Proc(name, [sys.executable, "-m", "homelab_frontend.stub", "--flavour", flavour, "--port", "0", *args], wd)


def _gateway(wd: str, kokoro: str, whisper: str) -> Proc:
    cfg = {"backends": {"k": {"url": kokoro + "/v1", "kind": "openai", "slots": 4},
                        "w": {"url": whisper, "kind": "whispercpp", "slots": 4}},
           "models": {"tts-1": {"backend": "k", "upstream_model": "kokoro"}, "whisper-1": {"backend": "w"}},
           "limits": {"max_upload_bytes": 64 * MB},
           "access_log": os.path.join(wd, "gateway-access.log"),
           "usage": {"path": os.path.join(wd, "gateway-usage.sqlite3")}}
    path = os.path.join(wd, "gateway.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return Proc("gateway", [sys.executable, "-m", "homelab_frontend", "serve", "--config", path, "--port", "0"], wd)


def _request(url: str, path: str, body: bytes, ctype: str) -> tuple[tuple[str, int], bytes]:
    u = urlsplit(url)
    head = (f"POST {path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return (u.hostname, u.port), head + body


def first_byte_ms(url: str, path: str, model: str) -> float:
    body = json.dumps({"model": model, "input": "[stub chunks=4 delay_ms=0 chunk_bytes=4800] Hello.",
                       "voice": "af_heart", "response_format": "pcm"}).encode()
    addr, req = _request(url, path, body, "application/json")
    with socket.create_connection(addr, timeout=30) as s:
        s.sendall(req)
        t0 = time.perf_counter()
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += s.recv(65536)
        head, _, rest = buf.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        while len(rest) < 8:  # the first chunk's size line and a byte of audio
            more = s.recv(65536)
            if not more:
                break
            rest += more
        t1 = time.perf_counter()
        while s.recv(65536):
            pass
    return (t1 - t0) * 1000


def wav_form(size: int, model: str) -> bytes:
    data = size - 44
    header = (b"RIFF" + struct.pack("<I", 36 + data) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16)
              + b"data" + struct.pack("<I", data))
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n"
            f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            "Content-Type: audio/wav\r\n\r\n").encode() + header + bytes(data) + f"\r\n--{BOUNDARY}--\r\n".encode()


def upload_s(url: str, path: str, body: bytes) -> float:
    addr, req = _request(url, path, body, f"multipart/form-data; boundary={BOUNDARY}")
    t0 = time.perf_counter()
    with socket.create_connection(addr, timeout=120) as s:
        view = memoryview(req)
        for i in range(0, len(view), MB):
            s.sendall(view[i:i + MB])
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:300]
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.media", description=__doc__)
    ap.add_argument("--n", type=int, default=200, help="speech requests per side")
    ap.add_argument("--reps", type=int, default=7, help="20 MB uploads per side")
    ap.add_argument("--upload-mb", type=int, default=20)
    ap.add_argument("--upload-read-ms", type=int, default=40, help="the slow backend's wait per 64 KiB (figure 3)")
    args = ap.parse_args(argv)
    wd = workdir()
    procs: list[Proc] = []
    try:
        kokoro = _stub(wd, "kokoro", "kokoro")
        procs.append(kokoro)
        whisper = _stub(wd, "whisper", "whispercpp")
        procs.append(whisper)
        gw = _gateway(wd, kokoro.url, whisper.url)
        procs.append(gw)

        # 1. speech: first audio byte, one stream at a time
        for _ in range(20):  # warm both paths (connections, code)
            first_byte_ms(kokoro.url, "/v1/audio/speech", "kokoro")
            first_byte_ms(gw.url, "/v1/audio/speech", "tts-1")
        direct, through = [], []
        for _ in range(args.n):
            direct.append(first_byte_ms(kokoro.url, "/v1/audio/speech", "kokoro"))
            through.append(first_byte_ms(gw.url, "/v1/audio/speech", "tts-1"))
        d_med, g_med = statistics.median(direct), statistics.median(through)
        speech = {"direct_ms": round(d_med, 3), "gateway_ms": round(g_med, 3), "added_ms": round(g_med - d_med, 3),
                  "n": args.n}

        # 2. a 20 MB upload, direct and through the gateway
        size = args.upload_mb * MB
        direct_body, gw_body = wav_form(size, "ggml-tiny.en"), wav_form(size, "whisper-1")
        upload_s(whisper.url, "/inference", direct_body)
        upload_s(gw.url, "/v1/audio/transcriptions", gw_body)
        d_s, g_s = [], []
        for _ in range(args.reps):
            d_s.append(upload_s(whisper.url, "/inference", direct_body))
            g_s.append(upload_s(gw.url, "/v1/audio/transcriptions", gw_body))
        d_mbps, g_mbps = size / MB / statistics.median(d_s), size / MB / statistics.median(g_s)
        throughput = {"direct_mb_s": round(d_mbps, 1), "gateway_mb_s": round(g_mbps, 1),
                      "ratio": round(g_mbps / d_mbps, 3), "reps": args.reps, "mb": args.upload_mb}

        # 3. the gateway's RSS with four uploads in flight against a slow reader
        for p in procs[:2]:
            p.stop()
        slow = _stub(wd, "whisper-slow", "whispercpp", "--upload-read-ms", str(args.upload_read_ms))
        procs.append(slow)
        gw.stop()
        gw = _gateway(wd, kokoro.url, slow.url)
        procs.append(gw)
        upload_s(gw.url, "/v1/audio/transcriptions", wav_form(MB, "whisper-1"))  # warm
        time.sleep(0.5)
        idle = memory_mb(gw.pid)["rss_mb"]
        peak = idle
        threads = [threading.Thread(target=upload_s, args=(gw.url, "/v1/audio/transcriptions", gw_body))
                   for _ in range(4)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            peak = max(peak, memory_mb(gw.pid)["rss_mb"])
            time.sleep(0.02)
        memory = {"idle_mb": round(idle, 1), "peak_mb": round(peak, 1), "added_mb": round(peak - idle, 1),
                  "uploads": 4, "mb_each": args.upload_mb}
    finally:
        for p in procs:
            p.stop()
    out = {"speech_first_byte": speech, "upload_throughput": throughput, "upload_memory": memory}
    print(json.dumps(out, indent=2))
    print(f"speech first byte: direct {speech['direct_ms']} ms, gateway {speech['gateway_ms']} ms "
          f"(+{speech['added_ms']} ms; aim <= +1 ms)")
    print(f"{args.upload_mb} MB upload: direct {throughput['direct_mb_s']} MB/s, gateway "
          f"{throughput['gateway_mb_s']} MB/s (ratio {throughput['ratio']}; aim >= 0.9)")
    print(f"four {args.upload_mb} MB uploads in flight: gateway RSS +{memory['added_mb']} MB over idle "
          f"{memory['idle_mb']} MB (aim < 40 MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
