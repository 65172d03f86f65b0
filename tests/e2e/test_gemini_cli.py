"""Gemini CLI end to end: the real CLI (`gemini -p`) through a real gateway to the stubs.

Gemini CLI comes from the npm registry, pinned, installed by `.ci/deps/gemini-cli.sh` into a cache
outside the clone (`gemini-cli.sh --bin` says where). Without the registry the install fails and
so does every test here, loudly: no silent skip.

It runs in a throwaway HOME whose settings select the API-key auth and turn telemetry, usage
statistics and update checks off; `GOOGLE_GEMINI_BASE_URL` points it at a recording proxy in
front of the gateway (127.0.0.1 only), `GEMINI_CLI_TRUST_WORKSPACE` trusts its work directory.
The gateway maps `gemini-*pro*` onto a vLLM-flavoured reasoning stub and `gemini-*flash*` onto
a llama.cpp-flavoured one, as docs/gemini.md suggests. Without `-m`, each turn begins with the CLI's
router call (`gemini-3.5-flash-lite:generateContent`, asking for JSON by `responseJsonSchema`,
which the stub honours as vLLM's guided decoding would) and then streams from the model it
picked (`gemini-3.8-flash`).

With `[stub agent]` in the prompt the stub, given tools, calls the CLI's `run_shell_command`
with `echo hello-from-tool`, and once the tool's output comes back answers `The tool said:
<output>`: so a final answer quoting `hello-from-tool`, and a tool message carrying it at the
stub, mean the CLI really ran the command and sent its output back through the gateway.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gwproc import Gateway, config_for
from rawhttp import _request_bytes, post_raw
from recording_proxy import RecordingProxy
from support.merging_relay import MergingRelay
from stubproc import start_stub, wait_for
from support.npm_cli import cli_bin

pytestmark = pytest.mark.timeout(900)  # the first run may install Gemini CLI

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / ".ci" / "deps" / "gemini-cli.sh"
CLI = cli_bin(INSTALLER)
R1 = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
CLIENT_KEY = "sk-homelab-e2e-gemini"
RUN_TIMEOUT = 240.0  # one `gemini -p`: about 15 s on a busy machine, most of it Node starting up


def _pinned_version() -> str:
    m = re.search(r"^VERSION=(\S+)$", INSTALLER.read_text(), re.M)
    assert m, f"no VERSION= line in {INSTALLER}"
    return m.group(1)


@pytest.fixture(scope="module")
def gemini_cli() -> Path:
    done = subprocess.run(["bash", str(INSTALLER)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail("could not install Gemini CLI from the npm registry (is the registry reachable?):\n"
                    f"$ bash {INSTALLER}  -> exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    version = subprocess.run([str(CLI), "--version"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "HOME": "/nonexistent"})
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == _pinned_version(), version.stdout
    return CLI


@pytest.fixture(scope="module")
def stack():
    with start_stub("vllm", "--reasoning", "--model", R1, "--max-model-len", "32768") as vllm, \
         start_stub("llamacpp", "--max-model-len", "32768") as llama:
        cfg = config_for(
            {"gpu0": {"url": vllm.base, "kind": "vllm", "slots": 4},
             "llama": {"url": llama.base, "kind": "llamacpp", "slots": 2}},
            {"reasoning": {"backend": "gpu0", "upstream_model": R1},
             "gemma": {"backend": "llama", "upstream_model": "gemma-3-270m"}},
            aliases={"gemini-*pro*": "reasoning", "gemini-*flash*": "gemma"},
            auth={"keys": [{"name": "gemini-cli", "key_env": "E2E_CLIENT_KEY"}]},
        )
        with Gateway(cfg, env={"E2E_CLIENT_KEY": CLIENT_KEY}) as gw, RecordingProxy(gw.url) as proxy:
            yield {"vllm": vllm, "llama": llama, "gw": gw, "proxy": proxy}


def gemini_home(home: Path) -> None:
    """docs/gemini.md's settings: API-key auth, no telemetry, no usage statistics, no update checks."""
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }))


def run_gemini(cli: Path, home: Path, base_url: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    work = home / "work"
    work.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GEMINI_", "GOOGLE_"))}
    env.update(HOME=str(home), GEMINI_API_KEY=CLIENT_KEY, GOOGLE_GEMINI_BASE_URL=base_url,
               GEMINI_CLI_TRUST_WORKSPACE="true", NO_COLOR="1")
    t0 = time.monotonic()
    done = subprocess.run([str(cli), *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
    return done, time.monotonic() - t0


def _summary(proxy: RecordingProxy) -> str:
    return "\n".join(f"{x.method} {x.path_qs} -> {x.status} {(x.response_body or '')[:300]}" for x in proxy.exchanges)


def _why(done, seconds, proxy) -> str:
    return (f"exit {done.returncode} after {seconds:.1f} s\nstdout:\n{done.stdout[-2000:]}\n"
            f"stderr:\n{done.stderr[-3000:]}\n{_summary(proxy)}")


def _gemini_log(gw: Gateway, n: int) -> list[dict]:
    """The gateway's last `n` access-log lines of Gemini requests, once all are written."""
    wait_for(lambda: len([r for r in gw.access_log() if r["dialect"] == "gemini"]) >= n, 10)
    return [r for r in gw.access_log() if r["dialect"] == "gemini"][-n:]


def test_gemini_p_is_answered_after_the_router_call(gemini_cli, stack, tmp_path):
    llama, gw, proxy = stack["llama"], stack["gw"], stack["proxy"]
    llama.reset()
    proxy.exchanges.clear()
    before = len([r for r in gw.access_log() if r["dialect"] == "gemini"])
    gemini_home(tmp_path)
    done, seconds = run_gemini(gemini_cli, tmp_path, proxy.url + "/llm", "-p", "Say hi. [stub content=6]")
    why = _why(done, seconds, proxy)
    assert done.returncode == 0, why
    assert "Hello from the homelab demo backend." in done.stdout, why
    # one turn, two requests: the router's JSON call, then the stream from the model it picked
    paths = [x.path_qs for x in proxy.exchanges]
    assert paths == ["/llm/v1beta/models/gemini-3.5-flash-lite:generateContent",
                     "/llm/v1beta/models/gemini-3.8-flash:streamGenerateContent?alt=sse"], why
    assert all(x.status == 200 for x in proxy.exchanges), why
    assert proxy.exchanges[0].headers.get("x-goog-api-key") == CLIENT_KEY
    router = llama.requests()[0]["body"]
    assert router["response_format"]["type"] == "json_schema", router
    assert router["response_format"]["json_schema"]["schema"]["properties"]["complexity_score"]["type"] == "integer"
    log = _gemini_log(gw, before + 2)[-2:]
    assert [r["outcome"] for r in log] == ["ok", "ok"] and {r["key"] for r in log} == {"gemini-cli"}


@pytest.mark.parametrize("model,stub", [("gemini-2.5-pro", "vllm"), ("gemini-2.5-flash", "llama")])
def test_an_agent_turn_runs_the_shell_tool_through_the_gateway(gemini_cli, stack, tmp_path, model, stub):
    upstream, proxy = stack[stub], stack["proxy"]
    upstream.reset()
    proxy.exchanges.clear()
    gemini_home(tmp_path)
    done, seconds = run_gemini(gemini_cli, tmp_path, proxy.url + "/llm", "--yolo", "-m", model, "-p",
                               "Run `echo hello-from-tool` and tell me what it printed. [stub agent]")
    why = _why(done, seconds, proxy)
    assert done.returncode == 0, why
    assert "The tool said:" in done.stdout and "hello-from-tool" in done.stdout, why
    # `-m` skips the router: one stream for the call, one for the answer
    assert [x.path_qs for x in proxy.exchanges] == [f"/llm/v1beta/models/{model}:streamGenerateContent?alt=sse"] * 2, why
    reqs = upstream.requests()
    assert len(reqs) == 2, why
    msgs = reqs[1]["body"]["messages"]
    call = [m for m in msgs if m.get("tool_calls")][-1]
    assert call["tool_calls"][0]["function"]["name"] == "run_shell_command"
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"command": "echo hello-from-tool"}
    (tool,) = [m for m in msgs if m["role"] == "tool"]
    assert "hello-from-tool" in tool["content"] and tool["tool_call_id"] == call["tool_calls"][0]["id"], msgs[-2:]
    if stub == "vllm":
        # the reasoning came back in the thoughtSignature on the call and went upstream again
        assert call.get("reasoning") == "Let me think about ", call
        sent = proxy.exchanges[1].body["contents"]
        assert any(p.get("thoughtSignature") for c in sent if c["role"] == "model" for p in c["parts"]), sent


@pytest.mark.parametrize("directive, says, merged", [
    ("fail_after=3", "the backend closed the connection mid-stream", False),  # the connection dropped
    ("error_after=3", "Internal server error", False),  # vLLM's in-band error frame, its own words
    ("error_after=3", "Internal server error", True),  # behind a relay that merges the gateway's writes
], ids=["dropped", "in_band_error", "in_band_error_merged"])
def test_a_broken_stream_ends_gemini_with_an_error_not_a_hang(gemini_cli, stack, tmp_path, directive, says, merged):
    """The error line reaches Gemini CLI's SDK in a read of its own by its framing (the spaces
    before it, gemini/stream.py), not by timing: also when a relay hands the CLI everything the
    gateway wrote in a moment as one write."""
    gw, proxy = stack["gw"], stack["proxy"]
    proxy.exchanges.clear()
    before = len([r for r in gw.access_log() if r["dialect"] == "gemini"])
    gemini_home(tmp_path)
    with contextlib.ExitStack() as relay:
        base = proxy.url
        if merged:
            base = relay.enter_context(MergingRelay(int(proxy.url.rsplit(":", 1)[1]), pause_s=0.2)).url
        done, seconds = run_gemini(gemini_cli, tmp_path, base + "/llm", "-m", "gemini-2.5-pro", "-p",
                                   f"Say something long. [stub reasoning=0 content=50 {directive}]")
    why = _why(done, seconds, proxy)
    assert done.returncode != 0, why
    # the gateway's own words reach the user (the error line arrived in a read of its own)
    assert says in done.stderr + done.stdout, why
    # every attempt was a stream the gateway ended with the error line; Gemini CLI retried a
    # broken stream at most 3 times (its mid-stream limit), then gave up
    assert 1 <= len(proxy.exchanges) <= 4 and all(x.status == 200 for x in proxy.exchanges), why
    log = _gemini_log(gw, before + len(proxy.exchanges))[-len(proxy.exchanges):]
    assert all(r["outcome"] == "error_upstream_midstream" for r in log), (log, why)


def test_a_busy_gateway_tells_gemini_when_to_come_back(gemini_cli, stack, tmp_path):
    """One slot, no queue, held by another client: Gemini CLI's request is a 429
    RESOURCE_EXHAUSTED whose RetryInfo says when to retry; it waits, retries, and is answered
    once the slot is free, with no error for the user."""
    vllm = stack["vllm"]
    cfg = config_for({"gpu0": {"url": vllm.base, "kind": "vllm", "slots": 1, "queue": {"depth": 0}}},
                     {"reasoning": {"backend": "gpu0", "upstream_model": R1}}, aliases={"gemini-*": "reasoning"})
    with Gateway(cfg) as gw, RecordingProxy(gw.url) as proxy:
        # the other client holds the slot (its first token would take two minutes) until Gemini
        # CLI has been told to come back, then leaves: the slot is free for the retry, which
        # so waits on that evidence, not on a fixed hold running out
        addr, req = _request_bytes(gw.llm + "/v1beta/models/reasoning:generateContent",
                                   {"contents": [{"parts": [{"text": "[stub reasoning=0 content=2 ttft_ms=120000]"}]}]})
        other = socket.create_connection(addr, timeout=150)
        other.sendall(req)
        wait_for(lambda: gw.admin()["backends"]["gpu0"]["in_use"] == 1, 10)

        def leave_once_told() -> None:
            try:
                wait_for(lambda: any(x.status == 429 for x in proxy.exchanges), 120, 0.05)
            finally:
                other.shutdown(socket.SHUT_RDWR)
                other.close()

        holder = threading.Thread(target=leave_once_told)
        holder.start()
        gemini_home(tmp_path)
        done, seconds = run_gemini(gemini_cli, tmp_path, proxy.url + "/llm", "-m", "gemini-2.5-pro", "-p",
                                   "Say hi. [stub reasoning=0 content=4]")
        holder.join()
        why = _why(done, seconds, proxy)
        assert done.returncode == 0 and "Hello from the homelab" in done.stdout, why
        statuses = [x.status for x in proxy.exchanges]
        assert statuses[0] == 429 and statuses[-1] == 200 and set(statuses) == {429, 200}, why
        for x in proxy.exchanges[:-1]:
            err = json.loads(x.response_body)["error"]
            delay = x.response_headers.get("retry-after")
            assert err["status"] == "RESOURCE_EXHAUSTED" and delay, why
            assert {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{delay}s"} in err["details"], why
