"""Claude Code end to end: the real CLI (`claude -p`) through a real gateway to the stub agents.

Two releases, both pinned in `.ci/deps/claude-code.sh`: the newest when last pinned, and the
oldest we support. The script installs each from the npm registry into its own directory in a
cache outside the clone (`claude-code.sh --bin VERSION` says where; CI runs it first, here it is
a no-op then). Without the registry the install fails and so does every test here, loudly: no
silent skip. Every test that runs the CLI runs once per release.

The stubs run with `--agent`: given tools, they answer with reasoning and a `Bash` call to
`echo hello-from-tool`; once the tool's result comes back, `The tool said: <result>`. So a final
answer containing `hello-from-tool`, plus a tool message carrying exactly that text at the stub,
means Claude Code really ran the command and sent its output back through the gateway. With
`[stub chain=ToolSearch,WebFetch]` the agent first loads WebFetch through Claude Code's
ToolSearch (deferred tools), then calls it.

Between Claude Code and the gateway sits a recording pass-through proxy: every request on the
wire (HEAD of the base URL, `?beta=true`, headers, bodies) and its status, which the gateway's own
access log (only /llm routes, no headers) cannot show. The recording is saved next to the test's
temporary files and summarised in assertion messages. Assertions are on what the gateway
controls (what reached the upstream, statuses, the access log), not on Claude Code's wording.
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
from homelab_frontend.stub.script import AGENT_REASONING_TOKENS, REASONING_TEXT, cycle_words
from recording_proxy import Exchange, RecordingProxy
from stubproc import start_stub, wait_for
from support.npm_cli import cli_bin

pytestmark = pytest.mark.timeout(900)  # the first run may install Claude Code (~245 MB, twice)

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / ".ci" / "deps" / "claude-code.sh"
R1 = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
QWEN = "qwen2.5:3b-instruct"
CLIENT_KEY = "sk-homelab-e2e-client"
ADMIN_KEY = "sk-homelab-e2e-admin"
PROMPT = "Run `echo hello-from-tool` with the Bash tool and tell me what it printed."
TOOL_SEARCH_PROMPT = "Fetch the project page for me. [stub chain=ToolSearch,WebFetch]"
RUN_TIMEOUT = 90.0  # one `claude -p`; a normal run takes ~2 s
# A session of one tool call is 2 requests (plus, on a broken stream, Claude Code's own retries):
# far more means something loops (a stub agent that never sees its tool result made 760 in 120 s).
MAX_REQUESTS = 8
# What the gateway wraps a mid-conversation system turn in (docs/anthropic.md: System turns).
SYSTEM_OPEN, SYSTEM_CLOSE = "<system>\n", "\n</system>"


def _pinned_versions() -> list[str]:
    text = INSTALLER.read_text()
    newest = re.search(r"^NEWEST=(\S+)$", text, re.M)
    oldest = re.search(r"^OLDEST=(\S+)$", text, re.M)
    assert newest and oldest, f"no NEWEST= / OLDEST= lines in {INSTALLER}"
    return [newest.group(1), oldest.group(1)]


VERSIONS = _pinned_versions()


def _cli_path(version: str) -> Path:
    return cli_bin(INSTALLER, version)


@pytest.fixture(scope="module")
def installed() -> None:
    """Every pinned Claude Code, installed on first use. A failed install fails the tests."""
    try:
        done = subprocess.run(["bash", str(INSTALLER)], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"installing Claude Code from the npm registry timed out:\n{exc.stdout}\n{exc.stderr}")
    if done.returncode != 0:
        pytest.fail(
            "could not install Claude Code from the npm registry (is the registry reachable?):\n"
            f"$ bash {INSTALLER}  -> exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )


@pytest.fixture(scope="module", params=VERSIONS, ids=[f"cc-{v}" for v in VERSIONS])
def claude_cli(request, installed) -> Path:
    cli = _cli_path(request.param)
    version = subprocess.run([str(cli), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith(request.param + " "), version.stdout
    return cli


def _version_of(cli: Path) -> str:
    return cli.parents[2].name


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
        # A test whose stub dropped connections may have left a backend marked down by passive
        # health (policy/passive_health.py) until its next probe: the next test starts once the
        # gateway has taken it back, not inside that window.
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        wait_for(lambda: all(b["up"] for b in self.gateway.admin(admin)["backends"].values()), 60, 0.1)
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
    wait_for(lambda: not stack.gateway.admin(headers)["requests"], timeout=30)
    wait_for(lambda: all(b["in_use"] == 0 for b in stack.gateway.admin(headers)["backends"].values()), timeout=30)
    wait_for(lambda: stack.vllm.stats()["in_flight"] == 0 and stack.ollama.stats()["in_flight"] == 0, timeout=30)


def _has_late_system(messages: list[dict]) -> bool:
    roles = [m["role"] for m in messages]
    first_other = next((i for i, role in enumerate(roles) if role != "system"), len(roles))
    return "system" in roles[first_other:]


def _no_late_system(stub) -> None:
    """No upstream request carried a system message after a non-system one (system_turns)."""
    for r in stub.requests():
        assert not _has_late_system(r["body"]["messages"]), [m["role"] for m in r["body"]["messages"]]


def _bounded(stack: Stack) -> None:
    calls = _messages_calls(stack)
    upstream = len(stack.vllm.requests()) + len(stack.ollama.requests())
    assert len(calls) <= MAX_REQUESTS and upstream <= MAX_REQUESTS, _summary(stack.proxy.exchanges)


_TOKEN_COUNTER = re.compile(r"\s*<total_tokens>\d+ tokens left</total_tokens>\s*")


def _system_turns_after_results(calls: list[Exchange]) -> list[str]:
    """The text of the system turns Claude Code put right after the (last) tool result, less the
    `<total_tokens>` counters, which the gateway drops (they would defeat the prefix cache)."""
    body = calls[-1].body
    msgs = body["messages"]
    at = max(i for i, m in enumerate(msgs) if m["role"] == "user" and isinstance(m["content"], list)
             and any(b.get("type") == "tool_result" for b in m["content"]))
    texts = []
    for m in msgs[at + 1:]:
        if m["role"] != "system":
            break
        c = m["content"]
        text = c if isinstance(c, str) else "\n\n".join(b["text"] for b in c if b.get("text"))
        texts.append("\n\n".join(p for p in _TOKEN_COUNTER.split(text) if p))
    return [t for t in texts if t]


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
        ((), "gpu0", "vllm"),  # the default model (claude-opus-5-5; 2.1.197: claude-opus-4-8) -> `claude-*`
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

    # The tool really ran: its output came back to the model as a tool message, not an error,
    # followed by the system turns Claude Code sent after it (`<total_tokens>`), merged in place.
    stub = stack.vllm if stub_name == "vllm" else stack.ollama
    tools = _upstream_tool_messages(stub)
    notes = "".join(f"\n\n{SYSTEM_OPEN}{t}{SYSTEM_CLOSE}" for t in _system_turns_after_results(_messages_calls(stack)))
    assert [m["content"] for m in tools] == ["hello-from-tool" + notes], context
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
    # Mid-conversation system turns never reach the upstream as such (the newest release sends
    # them on both models; 2.1.197 not on haiku); the session is bounded.
    if _version_of(claude_cli) == VERSIONS[0]:
        assert any(_has_late_system(x.body["messages"]) for x in calls), context
    _no_late_system(stub)
    _bounded(stack)
    _idle(stack)


def test_thinking_round_trips_as_upstream_reasoning(claude_cli, stack, tmp_path):
    """The reasoning model's thinking goes to Claude Code as a signed `thinking` block; Claude
    Code sends it back in the next request's history, and the gateway, recognising its own
    signature, hands it to the upstream as that assistant turn's reasoning. When Claude Code asks
    for `display: "omitted"` (newer releases), the block has no text and the reasoning travels
    in the (sealed) signature instead."""
    stack.reset()
    run = run_claude(claude_cli, stack, PROMPT)
    saved = _save(stack, tmp_path, "claude-code-thinking")
    assert run.returncode == 0, f"{run.output}\nrecording: {saved}"
    calls = _messages_calls(stack)
    history = [b for x in calls for m in x.body["messages"] if m["role"] == "assistant"
               for b in (m["content"] if isinstance(m["content"], list) else [])]
    thinking = [b for b in history if b.get("type") == "thinking"]
    assert thinking, f"recording: {saved}"
    upstream = [m for r in stack.vllm.requests() for m in r["body"]["messages"] if m["role"] == "assistant"]
    omitted = calls[0].body.get("thinking", {}).get("display") == "omitted"
    if omitted:
        assert all(b["thinking"] == "" and b["signature"].startswith("hlf2.") for b in thinking), f"recording: {saved}"
        said = "".join(cycle_words(REASONING_TEXT, AGENT_REASONING_TOKENS))  # what the stub agent reasoned
        assert upstream and upstream[-1].get("reasoning") == said, f"recording: {saved}"
    else:
        assert all(b["signature"].startswith("hlf1.") for b in thinking), f"recording: {saved}"
        assert upstream and upstream[-1].get("reasoning") == thinking[-1]["thinking"], f"recording: {saved}"
    if _version_of(claude_cli) == VERSIONS[0]:
        assert omitted, "the newest Claude Code is expected to ask for display: omitted"


# -- deferred tools -------------------------------------------------------------------------------


def test_tool_search_loads_a_deferred_tool(claude_cli, stack, tmp_path):
    """ToolSearch -> WebFetch, judged at the upstream: before the load only the non-deferred tools
    are offered; after it WebFetch is, the placeholder and the other deferred tools never are, and
    the ToolSearch result reaches the model as a tool message naming WebFetch. (2.1.197 searches
    tools only with ENABLE_TOOL_SEARCH=true; newer releases do by default.)"""
    stack.reset()
    run = run_claude(claude_cli, stack, TOOL_SEARCH_PROMPT, extra_env={"ENABLE_TOOL_SEARCH": "true"})
    saved = _save(stack, tmp_path, "claude-code-tool-search")
    context = f"exit {run.returncode}\noutput: {run.output!r}\n{_summary(stack.proxy.exchanges)}\nrecording: {saved}"
    assert run.returncode == 0, context
    _no_4xx(stack)

    calls = _messages_calls(stack)
    deferred = {t["name"] for x in calls for t in x.body.get("tools", []) if t.get("defer_loading")}
    assert "WebFetch" in deferred, context  # Claude Code did defer it (and then loaded it)
    if _version_of(claude_cli) == VERSIONS[0]:
        assert "DeferredToolPlaceholder" in deferred, context  # sent, and (below) never offered
    requests = stack.vllm.requests()
    offered = [{t["function"]["name"] for t in r["body"].get("tools", [])} for r in requests]
    assert len(requests) == 3, context  # ToolSearch, WebFetch, the answer
    assert "ToolSearch" in offered[0] and "WebFetch" not in offered[0], context
    assert all("WebFetch" in o for o in offered[1:]), context
    for o in offered:
        assert "DeferredToolPlaceholder" not in o, context
        assert not (o & (deferred - {"WebFetch"})), context  # nothing deferred that was not loaded
    # The stub called WebFetch, which it does only when it is offered.
    calls_made = [c["function"]["name"] for m in requests[-1]["body"]["messages"] for c in m.get("tool_calls") or []]
    assert calls_made == ["ToolSearch", "WebFetch"], context
    loaded = [m for m in requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert len(loaded) == 1 and "WebFetch" in loaded[0]["content"], context
    _no_late_system(stack.vllm)
    _bounded(stack)
    _idle(stack)


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
    assert run.seconds < 30, context  # it gave up by itself; nothing hung
    if _version_of(claude_cli) == VERSIONS[-1]:
        # The oldest release shows the gateway's own error text; newer ones retry by themselves
        # and end with a message of their own, which is Claude Code's business.
        assert "error" in run.output.lower() and says in run.output, context

    # The first attempt was a stream that broke after it had started.
    first = stack.access_log()[0]
    assert first["stream"] is True and first["status"] == 200, first
    assert first["outcome"] == "error_upstream_midstream", first
    # The tool never ran, and nothing the gateway got from Claude Code was refused.
    assert _upstream_tool_messages(stack.vllm) == []
    _no_4xx(stack)
    _bounded(stack)
    _idle(stack)
