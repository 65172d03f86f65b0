"""Claude Code end to end: the real CLI (`claude -p`) through a real gateway to the stub agents.

Claude Code comes from the npm registry, pinned, installed by `.ci/deps/claude-code.sh` into the
gitignored `.cache/claude-code` (CI runs that script first; here it is a no-op then). Without the
registry the install fails and so does every test here, loudly: no silent skip.

The stubs run with `--agent`: given tools, they answer with reasoning and a `Bash` call to
`echo hello-from-tool`; once the tool's result comes back, `The tool said: <result>`. So a final
answer containing `hello-from-tool`, plus a tool message carrying exactly that text at the stub,
means Claude Code really ran the command and sent its output back through the gateway.

Between Claude Code and the gateway sits a recording pass-through proxy: every request on the
wire (HEAD of the base URL, `?beta=true`, headers, bodies) and its status, which the gateway's own
access log (only /llm routes, no headers) cannot show. The recording is saved next to the test's
temporary files and summarised in assertion messages.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from gwproc import Gateway, config_for
from recording_proxy import Exchange, RecordingProxy
from stubproc import start_stub, wait_for

pytestmark = pytest.mark.timeout(600)  # the first run may install Claude Code (~245 MB)

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / ".ci" / "deps" / "claude-code.sh"
CLI = ROOT / ".cache" / "claude-code" / "node_modules" / ".bin" / "claude"
R1 = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
QWEN = "qwen2.5:3b-instruct"
CLIENT_KEY = "sk-homelab-e2e-client"
ADMIN_KEY = "sk-homelab-e2e-admin"
PROMPT = "Run `echo hello-from-tool` with the Bash tool and tell me what it printed."
RUN_TIMEOUT = 90.0  # one `claude -p`; a normal run takes ~2 s


def _pinned_version() -> str:
    m = re.search(r"^VERSION=(\S+)$", INSTALLER.read_text(), re.M)
    assert m, f"no VERSION= line in {INSTALLER}"
    return m.group(1)


@pytest.fixture(scope="module")
def claude_cli() -> Path:
    """The pinned Claude Code, installed on first use. A failed install fails the tests."""
    try:
        done = subprocess.run(["bash", str(INSTALLER)], capture_output=True, text=True, timeout=480)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"installing Claude Code from the npm registry timed out:\n{exc.stdout}\n{exc.stderr}")
    if done.returncode != 0:
        pytest.fail(
            "could not install Claude Code from the npm registry (is the registry reachable?):\n"
            f"$ bash {INSTALLER}  -> exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    version = subprocess.run([str(CLI), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith(_pinned_version()), version.stdout
    return CLI


@dataclass
class Stack:
    vllm: object
    ollama: object
    gateway: Gateway
    proxy: RecordingProxy
    log_mark: int = 0  # access-log lines written before the current test

    def reset(self) -> None:
        self.vllm.reset()
        self.ollama.reset()
        self.proxy.exchanges.clear()
        self.log_mark = len(self.gateway.access_log())

    def access_log(self) -> list[dict]:
        return self.gateway.access_log()[self.log_mark :]


@pytest.fixture(scope="module")
def stack():
    """vLLM-like (reasoning) and Ollama-like stubs in agent mode, a gateway with Claude Code's
    aliases and a client key, and the recording proxy in front of it. Contexts as large as a real
    deployment's: Claude Code's system prompt and tools alone are several thousand tokens."""
    with start_stub("vllm", "--reasoning", "--agent", "--model", R1, "--max-model-len", "32768") as vllm, \
         start_stub("ollama", "--agent", "--model", QWEN) as ollama:
        cfg = config_for(
            {
                "gpu0": {"url": vllm.base, "kind": "vllm", "slots": 4},
                "ollama": {"url": ollama.base, "kind": "ollama", "slots": 2},
            },
            {"reasoning": {"backend": "gpu0", "upstream_model": R1}, QWEN: {"backend": "ollama"}},
            aliases={"claude-*haiku*": QWEN, "claude-*": "reasoning"},
            auth={"keys": [{"name": "claude-code", "key_env": "E2E_CLIENT_KEY"}], "admin_key_env": "E2E_ADMIN_KEY"},
        )
        env = {"E2E_CLIENT_KEY": CLIENT_KEY, "E2E_ADMIN_KEY": ADMIN_KEY}
        with Gateway(cfg, env=env) as gw, RecordingProxy(gw.url) as proxy:
            yield Stack(vllm, ollama, gw, proxy)


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_claude(cli: Path, stack: Stack, prompt: str, *args: str, extra_env: dict | None = None) -> Run:
    """`claude -p PROMPT` against the gateway (through the proxy), in a throwaway HOME and working
    directory, with an environment built from scratch: nothing of the caller's (no real
    ANTHROPIC_* variables, no CI=true) leaks in."""
    with tempfile.TemporaryDirectory(prefix="cc-home-") as home, tempfile.TemporaryDirectory(prefix="cc-work-") as work:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "SHELL": shutil.which("bash") or "/bin/bash",
            "LANG": "C.UTF-8",
            "ANTHROPIC_BASE_URL": stack.proxy.url + "/llm",
            "ANTHROPIC_AUTH_TOKEN": CLIENT_KEY,  # sent as Authorization: Bearer
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            **(extra_env or {}),
        }
        started = time.monotonic()
        try:
            # `--allowedTools Bash` rather than `--dangerously-skip-permissions`, which refuses to
            # run as root (as CI is) unless IS_SANDBOX=1.
            done = subprocess.run(
                [str(cli), "-p", prompt, "--allowedTools", "Bash", *args],
                cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"claude -p did not finish within {RUN_TIMEOUT} s:\n{exc.stdout!r}\n{exc.stderr!r}\n"
                        + _summary(stack.proxy.exchanges))
        return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def _summary(exchanges: list[Exchange]) -> str:
    lines = ["what Claude Code sent (method path -> status):"]
    for x in exchanges:
        body = x.body if isinstance(x.body, dict) else {}
        brief = {k: body[k] for k in ("model", "stream", "max_tokens", "thinking", "output_config") if k in body}
        lines.append(f"  {x.method} {x.path_qs} -> {x.status} {json.dumps(brief)} {x.response_body or ''}"[:600])
    return "\n".join(lines)


def _save(stack: Stack, tmp_path: Path, name: str) -> Path:
    """Keep the full recording for a human: what Claude Code sent, what reached the stubs."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({
        "wire": [x.__dict__ for x in stack.proxy.exchanges],
        "access_log": stack.access_log(),
        "vllm_stub": stack.vllm.requests(),
        "ollama_stub": stack.ollama.requests(),
    }, indent=1, default=str))
    return path


def _no_4xx(stack: Stack) -> None:
    summary = _summary(stack.proxy.exchanges)
    assert stack.proxy.exchanges, "the proxy saw no request at all"
    for x in stack.proxy.exchanges:
        assert x.status is None or not 400 <= x.status < 500, f"the gateway rejected a request:\n{summary}"
    for line in stack.access_log():
        assert not 400 <= (line["status"] or 0) < 500, f"access log: {line}\n{summary}"


def _messages_calls(stack: Stack) -> list[Exchange]:
    return [x for x in stack.proxy.exchanges if x.method == "POST" and x.path == "/llm/v1/messages"]


def _upstream_tool_messages(stub) -> list[dict]:
    return [m for r in stub.requests() for m in r["body"]["messages"] if m.get("role") == "tool"]


def _idle(stack: Stack) -> None:
    """Every slot back and nothing left running, at the gateway and at both stubs."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    wait_for(lambda: not stack.gateway.admin(headers)["requests"], timeout=5)
    wait_for(lambda: all(b["in_use"] == 0 for b in stack.gateway.admin(headers)["backends"].values()), timeout=5)
    wait_for(lambda: stack.vllm.stats()["in_flight"] == 0 and stack.ollama.stats()["in_flight"] == 0, timeout=5)


# -- a whole agent turn -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/llm", "/llm/"])
def test_base_url_answers_the_connection_warm_up(stack, path):
    """Claude Code opens with `HEAD $ANTHROPIC_BASE_URL` (fire and forget); answer it, don't 404.
    Needs no Claude Code, so it runs even where the install failed."""
    for method in ("HEAD", "GET"):
        req = urllib.request.Request(stack.gateway.url + path, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200, (method, path)


@pytest.mark.parametrize(
    "model_args, alias_target, stub_name",
    [
        ((), "gpu0", "vllm"),  # the default model (claude-opus-4-8) -> `claude-*` -> reasoning
        (("--model", "haiku"), "ollama", "ollama"),  # claude-haiku-... -> `claude-*haiku*` -> qwen
    ],
    ids=["default-to-vllm-reasoning", "haiku-to-ollama"],
)
def test_claude_code_runs_a_tool_through_the_gateway(claude_cli, stack, tmp_path, model_args, alias_target, stub_name):
    stack.reset()
    run = run_claude(claude_cli, stack, PROMPT, *model_args)
    saved = _save(stack, tmp_path, "claude-code-agent-turn")
    context = f"exit {run.returncode}\nstdout: {run.stdout!r}\nstderr: {run.stderr!r}\n{_summary(stack.proxy.exchanges)}\nrecording: {saved}"

    assert run.returncode == 0, context
    assert "hello-from-tool" in run.stdout, context

    # The tool really ran: its output came back to the model as a tool message, not an error.
    stub = stack.vllm if stub_name == "vllm" else stack.ollama
    tools = _upstream_tool_messages(stub)
    assert [m["content"].strip() for m in tools] == ["hello-from-tool"], context
    # ... in answer to the Bash call the stub made, under the id the stub gave it.
    last = stub.requests()[-1]["body"]["messages"]
    call = next(m for m in last if m.get("tool_calls"))["tool_calls"][0]
    assert call["function"]["name"] == "Bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "echo hello-from-tool"}
    assert tools[0]["tool_call_id"] == call["id"]

    # What Claude Code sent was all accepted, and went where the aliases say.
    _no_4xx(stack)
    calls = _messages_calls(stack)
    assert len(calls) >= 2, context
    for x in calls:
        assert x.status == 200 and x.body["stream"] is True, context
        assert x.body["model"].startswith("claude-"), context
    served = [line for line in stack.access_log() if line["path"] == "/llm/v1/messages"]
    assert served and all(line["backend"] == alias_target and line["outcome"] == "ok" for line in served), served
    assert all(line["model"].startswith("claude-") for line in served), served  # the name the client sent
    _idle(stack)


def test_thinking_round_trips_as_upstream_reasoning(claude_cli, stack, tmp_path):
    """The reasoning model's thinking goes to Claude Code as a signed `thinking` block; Claude
    Code sends it back in the next request's history, and the gateway, recognising its own
    signature, hands it to the upstream as that assistant turn's reasoning."""
    stack.reset()
    run = run_claude(claude_cli, stack, PROMPT)
    saved = _save(stack, tmp_path, "claude-code-thinking")
    assert run.returncode == 0, f"{run.output}\nrecording: {saved}"
    calls = _messages_calls(stack)
    history = [b for x in calls for m in x.body["messages"] if m["role"] == "assistant"
               for b in (m["content"] if isinstance(m["content"], list) else [])]
    thinking = [b for b in history if b.get("type") == "thinking"]
    assert thinking and all(b["signature"].startswith("hlf1.") for b in thinking), f"recording: {saved}"
    upstream = [m for r in stack.vllm.requests() for m in r["body"]["messages"] if m["role"] == "assistant"]
    assert upstream and upstream[-1].get("reasoning") == thinking[-1]["thinking"], f"recording: {saved}"


# -- the stream breaks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "directive, says",
    [
        # Dropped after the thinking block: Claude Code already holds part of the answer, so it
        # reports the gateway's error event as it is.
        ("fail_after=6", "closed the connection mid-stream"),
        # Dropped inside the first block: Claude Code falls back to a non-streaming request,
        # which the stub fails too (every time), retries, then gives up with the gateway's 502.
        ("fail_after=2", "closed the connection"),
        # vLLM's in-band error frame mid-stream, passed on with vLLM's message.
        ("error_after=6", "Internal server error"),
    ],
)
def test_interrupted_stream_ends_claude_code_with_an_error(claude_cli, stack, tmp_path, directive, says):
    stack.reset()
    run = run_claude(
        claude_cli, stack, f"{PROMPT} [stub {directive}]",
        # Its default is 10 retries with exponential backoff (minutes); the point here is that
        # it ends, with the error, not how patient it is.
        extra_env={"CLAUDE_CODE_MAX_RETRIES": "2"},
    )
    saved = _save(stack, tmp_path, "claude-code-interrupted")
    context = f"exit {run.returncode} after {run.seconds:.1f} s\noutput: {run.output!r}\n{_summary(stack.proxy.exchanges)}\nrecording: {saved}"

    assert run.returncode != 0, context
    assert "error" in run.output.lower() and says in run.output, context
    assert run.seconds < RUN_TIMEOUT / 2, context  # it gave up by itself; nothing hung

    # The first attempt was a stream that broke after it had started.
    first = stack.access_log()[0]
    assert first["stream"] is True and first["status"] == 200, first
    assert first["outcome"] == "error_upstream_midstream", first
    # The tool never ran, and nothing the gateway got from Claude Code was refused.
    assert _upstream_tool_messages(stack.vllm) == []
    _no_4xx(stack)
    _idle(stack)
