"""Codex CLI end to end: the real CLI (`codex exec`) through a real gateway to the stub agent.

Codex comes from the npm registry, pinned, installed by `.ci/deps/codex.sh` into a cache outside
the clone (`codex.sh --bin` says where; its native binary is an npm optional dependency).
Without the registry the install fails and so does every test here, loudly: no silent skip.

Codex speaks only the Responses API. It runs in a throwaway HOME whose config.toml names the
gateway as a custom provider (`wire_api = "responses"`), the example in docs/responses.md. The vLLM stub runs
with `--agent`: given tools, it answers with reasoning and a call of Codex's `exec_command` tool
with `echo hello-from-tool`; once the tool's output comes back, `The tool said: <output>`. So a
final answer quoting `hello-from-tool`, plus a tool message carrying that output at the stub,
means Codex really ran the command and sent its output back through the gateway.

A recording proxy sits between Codex and the gateway: it shows what Codex sent (headers such as
`x-codex-beta-features`, every body) in assertion messages.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from stubproc import wait_for
from gwproc import Gateway, config_for
from recording_proxy import RecordingProxy
from stubproc import start_stub
from support.npm_cli import cli_bin

pytestmark = pytest.mark.timeout(600)  # the first run may install Codex

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / ".ci" / "deps" / "codex.sh"
CLI = cli_bin(INSTALLER)
R1 = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
QWEN = "qwen2.5:3b-instruct"
CLIENT_KEY = "sk-homelab-e2e-codex"
PROMPT = "Run `echo hello-from-tool` and tell me what it printed."
RUN_TIMEOUT = 90.0  # one `codex exec`; a normal run takes about a second


def _pinned_version() -> str:
    m = re.search(r"^VERSION=(\S+)$", INSTALLER.read_text(), re.M)
    assert m, f"no VERSION= line in {INSTALLER}"
    return m.group(1)


@pytest.fixture(scope="module")
def codex_cli() -> Path:
    done = subprocess.run(["bash", str(INSTALLER)], capture_output=True, text=True, timeout=480)
    if done.returncode != 0:
        pytest.fail("could not install Codex from the npm registry (is the registry reachable?):\n"
                    f"$ bash {INSTALLER}  -> exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    version = subprocess.run([str(CLI), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip().endswith(_pinned_version()), version.stdout
    return CLI


@pytest.fixture(scope="module")
def stack():
    with start_stub("vllm", "--reasoning", "--agent", "--model", R1, "--max-model-len", "32768") as vllm, \
         start_stub("vllm", "--agent", "--model", "tiny", "--max-model-len", "1024") as tiny, \
         start_stub("ollama", "--agent", "--model", QWEN) as ollama:
        cfg = config_for(
            {"gpu0": {"url": vllm.base, "kind": "vllm", "slots": 4}, "small": {"url": tiny.base, "kind": "vllm"},
             "ollama": {"url": ollama.base, "kind": "ollama", "slots": 2}},
            {"reasoning": {"backend": "gpu0", "upstream_model": R1}, "tiny": {"backend": "small"}, QWEN: {"backend": "ollama"}},
            auth={"keys": [{"name": "codex", "key_env": "E2E_CLIENT_KEY"}]},
        )
        with Gateway(cfg, env={"E2E_CLIENT_KEY": CLIENT_KEY}) as gw, RecordingProxy(gw.url) as proxy:
            yield Stack(vllm, ollama, gw, proxy)


@dataclass
class Stack:
    vllm: object
    ollama: object
    gw: Gateway
    proxy: RecordingProxy


def codex_home(home: Path, base_url: str, model: str = "reasoning") -> None:
    """docs/responses.md's Codex config, pointed at `base_url`."""
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(f"""\
model = "{model}"
model_provider = "homelab"
show_raw_agent_reasoning = true

[model_providers.homelab]
name = "homelab"
base_url = "{base_url}"
wire_api = "responses"
env_key = "HOMELAB_API_KEY"
request_max_retries = 0
stream_max_retries = 1
""")


def run_codex(cli: Path, home: Path, prompt: str) -> tuple[subprocess.CompletedProcess, float]:
    work = home / "work"
    work.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(HOME=str(home), CODEX_HOME=str(home / ".codex"), HOMELAB_API_KEY=CLIENT_KEY, NO_COLOR="1")
    t0 = time.monotonic()
    done = subprocess.run(
        [str(cli), "exec", "--skip-git-repo-check", "--ephemeral", "--dangerously-bypass-approvals-and-sandbox",
         "-C", str(work), prompt],
        env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL,
    )
    return done, time.monotonic() - t0


def _summary(proxy: RecordingProxy) -> str:
    lines = []
    for x in proxy.exchanges:
        body = x.body if isinstance(x.body, dict) else {}
        lines.append(f"{x.method} {x.path_qs} -> {x.status} input={[i.get('type') for i in body.get('input', [])]}"
                     f" {(x.response_body or '')[:300]}")
    return "\n".join(lines)


def test_codex_runs_the_shell_tool_through_the_gateway(codex_cli, stack, tmp_path):
    vllm, gw, proxy = stack.vllm, stack.gw, stack.proxy
    vllm.reset()
    proxy.exchanges.clear()
    codex_home(tmp_path, proxy.url + "/llm/v1")
    done, _ = run_codex(codex_cli, tmp_path, PROMPT)
    why = f"exit {done.returncode}\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}\n{_summary(proxy)}"
    assert done.returncode == 0, why
    assert "The tool said:" in done.stdout and "hello-from-tool" in done.stdout, why
    # what Codex sent: only POST /responses, streaming, with its beta header; every answer a 200
    assert proxy.exchanges and all(x.method == "POST" and x.path_qs == "/llm/v1/responses" and x.status == 200
                                   for x in proxy.exchanges), why
    assert proxy.exchanges[0].headers.get("x-codex-beta-features") == "remote_compaction_v2", why
    first = proxy.exchanges[0].body
    assert first["stream"] is True and first["store"] is False and "reasoning.encrypted_content" in first["include"]
    # Codex asks for a reasoning summary; the raw reasoning comes as vLLM sends it (content, not a
    # summary), and Codex shows it with show_raw_agent_reasoning
    assert first["reasoning"].get("summary") == "auto", first["reasoning"]
    assert "Let me think about" in done.stdout + done.stderr, why
    assert any(t.get("type") == "namespace" for t in first["tools"]) and any(t.get("type") == "web_search" for t in first["tools"])
    # the tool really ran, and its output reached the upstream
    reqs = vllm.requests()
    assert len(reqs) == 2, why
    msgs = reqs[1]["body"]["messages"]
    tool = [m for m in msgs if m["role"] == "tool"]
    assert len(tool) == 1 and "hello-from-tool" in tool[0]["content"], msgs[-3:]
    call = [m for m in msgs if m.get("tool_calls")][-1]
    assert call["tool_calls"][0]["function"]["name"] == "exec_command"
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"cmd": "echo hello-from-tool"}
    # the reasoning came back sealed (store: false) and went upstream again as reasoning
    assert call.get("reasoning") == "Let me think about ", call
    # hosted web_search was dropped, the multi_agent_v1 namespace flattened
    names = [t["function"]["name"] for t in reqs[0]["body"]["tools"]]
    assert "web_search" not in names and any(n.startswith("multi_agent_v1__") for n in names), names
    # and the gateway's own record of it
    log = [r for r in gw.access_log() if r["path"] == "/llm/v1/responses"][-2:]
    assert [r["dialect"] for r in log] == ["responses", "responses"] and all(r["outcome"] == "ok" for r in log)
    assert all(r["key"] == "codex" for r in log)


def test_a_broken_stream_ends_codex_with_an_error_not_a_hang(codex_cli, stack, tmp_path):
    vllm, gw, proxy = stack.vllm, stack.gw, stack.proxy
    vllm.reset()
    proxy.exchanges.clear()
    logged_before = len([r for r in gw.access_log() if r["path"] == "/llm/v1/responses"])
    codex_home(tmp_path, proxy.url + "/llm/v1")
    done, seconds = run_codex(codex_cli, tmp_path, "Say something long. [stub content=50 fail_after=3]")
    why = f"exit {done.returncode} after {seconds:.1f} s\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}\n{_summary(proxy)}"
    assert done.returncode != 0, why
    assert seconds < 60, why
    assert "error" in (done.stderr + done.stdout).lower(), why
    # every attempt was a stream that the gateway ended with response.failed
    assert proxy.exchanges and all(x.status == 200 for x in proxy.exchanges), why
    # Codex exits on the response.failed frame, which can be before the gateway has written that
    # request's access-log line (at the end of the handler): wait for it, so the slice below is
    # this test's requests and not the previous test's last one
    wait_for(lambda: len([r for r in gw.access_log() if r["path"] == "/llm/v1/responses"])
             >= logged_before + len(proxy.exchanges), 10)
    log = [r for r in gw.access_log() if r["path"] == "/llm/v1/responses"][-len(proxy.exchanges):]
    assert all(r["outcome"] == "error_upstream_midstream" for r in log), (log, why)
    # Codex retried the failed stream (stream_max_retries = 1), then gave up
    assert len(proxy.exchanges) == 2, why
    assert "backend closed the connection mid-stream" in done.stderr + done.stdout, why


def test_a_prompt_too_long_for_the_model_is_a_context_error_codex_understands(codex_cli, stack, tmp_path):
    """Codex's ~4k-token system prompt does not fit a 1024-token model: the upstream's refusal
    reaches Codex as 400 `context_length_exceeded`, which it reports as such, without retrying."""
    vllm, gw, proxy = stack.vllm, stack.gw, stack.proxy
    proxy.exchanges.clear()
    codex_home(tmp_path, proxy.url + "/llm/v1", model="tiny")
    done, seconds = run_codex(codex_cli, tmp_path, PROMPT)
    why = f"exit {done.returncode} after {seconds:.1f} s\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}\n{_summary(proxy)}"
    assert done.returncode != 0, why
    assert "context window" in done.stderr + done.stdout, why
    assert [x.status for x in proxy.exchanges] == [400], why
    err = json.loads(proxy.exchanges[0].response_body)["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "input", err


def test_codex_through_an_ollama_backend(codex_cli, stack, tmp_path):
    """The same tool turn on an Ollama-flavoured upstream: no reasoning, the call in one chunk."""
    ollama, gw, proxy = stack.ollama, stack.gw, stack.proxy
    ollama.reset()
    proxy.exchanges.clear()
    codex_home(tmp_path, proxy.url + "/llm/v1", model=QWEN)
    done, _ = run_codex(codex_cli, tmp_path, PROMPT)
    why = f"exit {done.returncode}\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}\n{_summary(proxy)}"
    assert done.returncode == 0, why
    assert "The tool said:" in done.stdout and "hello-from-tool" in done.stdout, why
    reqs = ollama.requests()
    assert len(reqs) == 2, why
    tool = [m for m in reqs[1]["body"]["messages"] if m["role"] == "tool"]
    assert len(tool) == 1 and "hello-from-tool" in tool[0]["content"]
