"""Record the client sessions `bench.prefix` replays (`python -m bench.prefix --record`).

Each session is what a real client sent the gateway, request by request, while it held a
multi-turn agent conversation with the stub agent (`--agent --reasoning`: it calls a tool, then
reports the tool's output, with reasoning that comes back signed as `thinking`):

- claude-code-VERSION: each pinned Claude Code (`.ci/deps/claude-code.sh` installs them into
  .cache/claude-code/VERSION) runs `claude -p` three times in one working directory, the second
  and third with `--continue`, through a recording pass-through proxy (tests/recording_proxy.py);
- claude-code-VERSION-countdown: the same with CLAUDE_CODE_TOTAL_TOKENS_REMINDER=countdown, which
  puts a live `<total_tokens>N tokens left</total_tokens>` at the end of the system prompt and
  after each tool result;
- anthropic-sdk: the Anthropic SDK, tools, streamed and whole turns, thinking sent back, and
  `role: system` entries inside `messages` (as recent Claude Code sends them);
- openai-sdk: the OpenAI SDK, tools, and a system message in the middle of the conversation;
- openai-responses: the OpenAI SDK's `responses.create`: instructions, tools, function_call /
  function_call_output round trips, one conversation chained by `previous_response_id` (store:
  true, only the new input sent) and one stateless as Codex runs (store: false, the whole input
  re-sent each turn, reasoning kept as `encrypted_content`), developer messages mid-conversation;
- codex: Codex CLI (`.ci/deps/codex.sh`, .cache/codex) runs `codex exec`, then `codex exec
  resume --last` twice, through the recording proxy.

The SDKs' requests are taken from their own HTTP client (an httpx event hook), so the bodies are
exactly what went on the wire.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .prefix import SESSIONS, KEPT_HEADERS, Stack, save_session, start_stack
from .procs import ROOT, workdir

INSTALLER = ROOT / ".ci" / "deps" / "claude-code.sh"
CODEX_INSTALLER = ROOT / ".ci" / "deps" / "codex.sh"
CODEX = ROOT / ".cache" / "codex" / "node_modules" / ".bin" / "codex"


def claude_cli(version: str) -> Path:
    return ROOT / ".cache" / "claude-code" / version / "node_modules" / ".bin" / "claude"


def claude_versions() -> list[str]:
    """The releases .ci/deps/claude-code.sh pins, newest first."""
    done = subprocess.run(["bash", str(INSTALLER), "--versions"], capture_output=True, text=True, timeout=60)
    return done.stdout.split()
BASH_TOOL = {"name": "Bash", "description": "Run a shell command and return its output.",
             "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
READ_TOOL = {"name": "Read", "description": "Read a file.",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}


def _conversation(model: str, body: dict) -> str:
    """Claude Code's requests: one conversation per (model, first user message)."""
    import hashlib

    first = next((m for m in body.get("messages", []) if m.get("role") == "user"), {})
    # Claude Code moves its cache_control markers from turn to turn: not part of what it said
    raw = json.dumps([model, _without_cache_control(first.get("content"))], sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def _without_cache_control(value):
    if isinstance(value, list):
        return [_without_cache_control(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    return value


class _Recorder:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.label = ""

    def hook(self, request) -> None:
        body = json.loads(request.content) if request.content else None
        headers = {k.lower(): v for k, v in request.headers.items() if k.lower() in KEPT_HEADERS}
        path = request.url.raw_path.decode()
        self.requests.append({"path": path, "headers": headers, "conversation": self.label, "body": body})


def _anthropic_session(stack: Stack) -> list[dict]:
    import anthropic
    import httpx2 as httpx  # the SDKs (anthropic >= 2, openai >= 2) ship on httpx2

    rec = _Recorder()
    client = anthropic.Anthropic(base_url=stack.gateway.url + "/llm", api_key="x", max_retries=0,
                                 http_client=httpx.Client(event_hooks={"request": [rec.hook]}, timeout=60))
    system = [{"type": "text", "text": "You are a coding agent working in a small repository."},
              {"type": "text", "text": "Use the tools; answer briefly."}]

    def turn(messages: list, stream: bool) -> list:
        kw = dict(model="claude-opus-4-8", max_tokens=512, system=system, tools=[BASH_TOOL, READ_TOOL],
                  thinking={"type": "enabled", "budget_tokens": 2048}, messages=messages)
        if stream:
            with client.messages.stream(**kw) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kw)
        return [b.model_dump(exclude_none=True) for b in msg.content]

    for label, opening in (("anthropic-a", "What does this repository contain?"),
                           ("anthropic-b", "Is there a test suite here?")):
        rec.label = label
        messages: list = [{"role": "user", "content": opening}]
        for k in range(3):
            content = turn(messages, stream=k % 2 == 0)
            messages.append({"role": "assistant", "content": content})
            results = [{"type": "tool_result", "tool_use_id": b["id"], "content": f"README.md\nsrc/ (call {k})"}
                       for b in content if b["type"] == "tool_use"]
            if results:
                messages.append({"role": "user", "content": results})
                content = turn(messages, stream=k % 2 == 1)
                messages.append({"role": "assistant", "content": content})
            # Claude Code style: a system entry inside messages, then the next user turn
            messages.append({"role": "system", "content": f"Reminder {k}: the user prefers short answers."})
            messages.append({"role": "user", "content": [{"type": "text", "text": f"Next step {k}, please."}]})
        turn(messages, stream=True)
    # No tools at all: a conversation that templates without a tool role (Gemma 3) can render,
    # with system entries inside messages all the same.
    rec.label = "anthropic-chat"
    messages = [{"role": "user", "content": "Explain what a prefix cache is."}]
    for k in range(3):
        msg = client.messages.create(model="claude-opus-4-8", max_tokens=256, system=system, messages=messages)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        messages.append({"role": "system", "content": f"Reminder {k}: the user prefers short answers."})
        messages.append({"role": "user", "content": f"Go on ({k})."})
    client.messages.create(model="claude-opus-4-8", max_tokens=256, system=system, messages=messages)
    return rec.requests


def _openai_session(stack: Stack) -> list[dict]:
    import httpx2 as httpx  # the SDKs (anthropic >= 2, openai >= 2) ship on httpx2
    import openai

    rec = _Recorder()
    client = openai.OpenAI(base_url=stack.gateway.url + "/llm/v1", api_key="x", max_retries=0,
                           http_client=httpx.Client(event_hooks={"request": [rec.hook]}, timeout=60))
    tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                               "parameters": t["input_schema"]}} for t in (BASH_TOOL, READ_TOOL)]
    for label, opening in (("openai-a", "What does this repository contain?"),
                           ("openai-b", "Which Python version does it need?")):
        rec.label = label
        messages: list = [{"role": "system", "content": "You are a coding agent. Use the tools."},
                          {"role": "user", "content": opening}]
        for k in range(3):
            stream = k % 2 == 1
            if stream:
                # the SDK's stream helper assembles the message as a client would
                with client.beta.chat.completions.stream(model="reasoning", messages=messages, tools=tools,
                                                         max_tokens=256) as s:
                    msg = s.get_final_completion().choices[0].message
            else:
                msg = client.chat.completions.create(model="reasoning", messages=messages, tools=tools,
                                                     max_tokens=256).choices[0].message
            entry = {"role": "assistant", "content": msg.content}
            if msg.tool_calls:
                entry["tool_calls"] = [{"id": c.id, "type": "function",
                                        "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                       for c in msg.tool_calls]
            messages.append(entry)
            for c in msg.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": c.id, "content": f"README.md\nsrc/ (call {k})"})
            if msg.tool_calls:
                msg = client.chat.completions.create(model="reasoning", messages=messages, tools=tools,
                                                     max_tokens=256).choices[0].message
                messages.append({"role": "assistant", "content": msg.content})
            messages.append({"role": "system", "content": f"Reminder {k}: keep answers short."})
            messages.append({"role": "user", "content": f"Next step {k}, please."})
        client.chat.completions.create(model="reasoning", messages=messages, tools=tools, max_tokens=256)
    rec.label = "openai-chat"  # no tools, a system message mid-conversation
    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "Explain what a prefix cache is."}]
    for k in range(3):
        msg = client.chat.completions.create(model="reasoning", messages=messages, max_tokens=256).choices[0].message
        messages.append({"role": "assistant", "content": msg.content})
        messages.append({"role": "system", "content": f"Reminder {k}: keep it short."})
        messages.append({"role": "user", "content": f"Go on ({k})."})
    client.chat.completions.create(model="reasoning", messages=messages, max_tokens=256)
    return rec.requests


def _claude_code_session(stack: Stack, pinned: str, extra_env: dict | None = None) -> tuple[str, list[dict]]:
    done = subprocess.run(["bash", str(INSTALLER)], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"could not install Claude Code:\n{done.stdout}\n{done.stderr}")
    CLAUDE = claude_cli(pinned)
    version = subprocess.run([str(CLAUDE), "--version"], capture_output=True, text=True, timeout=60).stdout.split()[0]
    if version != pinned:
        raise RuntimeError(f"{CLAUDE} is {version}, not the pinned {pinned}")
    sys.path.insert(0, str(ROOT / "tests"))
    from recording_proxy import RecordingProxy

    prompts = [
        "Run `echo hello-from-tool` with the Bash tool and tell me what it printed.",
        "Run it once more, please.",
        "And a third time.",
    ]
    with RecordingProxy(stack.gateway.url) as proxy, tempfile.TemporaryDirectory(prefix="cc-home-") as home, \
            tempfile.TemporaryDirectory(prefix="cc-work-") as work:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home,
               "SHELL": shutil.which("bash") or "/bin/bash", "LANG": "C.UTF-8",
               "ANTHROPIC_BASE_URL": proxy.url + "/llm", "ANTHROPIC_AUTH_TOKEN": "x",
               "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
               **(extra_env or {})}
        for i, prompt in enumerate(prompts):
            args = [str(CLAUDE), "-p", prompt, "--allowedTools", "Bash"] + (["--continue"] if i else [])
            run = subprocess.run(args, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                 text=True, timeout=120)
            if run.returncode != 0:
                raise RuntimeError(f"claude -p failed: {run.stdout}\n{run.stderr}")
        requests = []
        for x in proxy.exchanges:
            if x.method == "POST" and x.path == "/llm/v1/messages" and isinstance(x.body, dict):
                headers = {k: v for k, v in x.headers.items() if k in KEPT_HEADERS}
                requests.append({"path": x.path_qs, "headers": headers,
                                 "conversation": _conversation(x.body.get("model", ""), x.body), "body": x.body})
    return version, requests


def _responses_session(stack: Stack) -> list[dict]:
    import httpx2 as httpx
    import openai

    rec = _Recorder()
    client = openai.OpenAI(base_url=stack.gateway.url + "/llm/v1", api_key="x", max_retries=0,
                           http_client=httpx.Client(event_hooks={"request": [rec.hook]}, timeout=60))
    tools = [{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
             for t in (BASH_TOOL, READ_TOOL)]
    instructions = "You are a coding agent working in a small repository. Use the tools; answer briefly."

    def turn(stream: bool, **kw):
        kw = dict(model="reasoning", instructions=instructions, max_output_tokens=256, **kw)
        if stream:
            with client.responses.stream(**kw) as s:
                resp = s.get_final_response()
        else:
            resp = client.responses.create(**kw)
        # the answer a later previous_response_id names, and the calls its outputs answer
        rec.requests[-1]["response_id"] = resp.id
        rec.requests[-1]["response_calls"] = [i.call_id for i in resp.output if i.type == "function_call"]
        return resp

    def outputs_of(resp) -> list[dict]:
        return [item.model_dump(exclude_none=True) for item in resp.output]

    def results_for(resp, k: int) -> list[dict]:
        return [{"type": "function_call_output", "call_id": item.call_id, "output": f"README.md\nsrc/ (call {k})"}
                for item in resp.output if item.type == "function_call"]

    # chained: store: true, each turn sends only its new input and names the previous answer
    rec.label = "responses-chained"
    resp = turn(False, tools=tools, input="What does this repository contain?")
    for k in range(3):
        results = results_for(resp, k)
        if results:
            resp = turn(k % 2 == 0, tools=tools, previous_response_id=resp.id, input=results)
        nxt = [{"role": "developer", "content": f"Reminder {k}: the user prefers short answers."},
               {"role": "user", "content": [{"type": "input_text", "text": f"Next step {k}, please."}]}]
        resp = turn(k % 2 == 1, tools=tools, previous_response_id=resp.id, input=nxt)
    # stateless, as Codex: store: false, the whole conversation re-sent, reasoning sealed
    rec.label = "responses-stateless"
    items: list = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Is there a test suite here?"}]}]
    for k in range(3):
        resp = turn(k % 2 == 0, tools=tools, input=list(items), store=False, include=["reasoning.encrypted_content"])
        items += outputs_of(resp)
        results = results_for(resp, k)
        if results:
            items += results
            resp = turn(k % 2 == 1, tools=tools, input=list(items), store=False, include=["reasoning.encrypted_content"])
            items += outputs_of(resp)
        items += [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": f"Reminder {k}: keep it short."}]},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Next step {k}, please."}]}]
    turn(True, tools=tools, input=list(items), store=False, include=["reasoning.encrypted_content"])
    # no tools (a template without a tool role can render it), developer messages mid-way
    rec.label = "responses-chat"
    resp = turn(False, input="Explain what a prefix cache is.")
    for k in range(3):
        resp = turn(k % 2 == 0, previous_response_id=resp.id,
                    input=[{"role": "developer", "content": f"Reminder {k}: keep it short."},
                           {"role": "user", "content": f"Go on ({k})."}])
    return rec.requests


def _codex_home(home: Path, base_url: str) -> None:
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(f"""\
model = "reasoning"
model_provider = "homelab"

[model_providers.homelab]
name = "homelab"
base_url = "{base_url}"
wire_api = "responses"
env_key = "HOMELAB_API_KEY"
request_max_retries = 0
stream_max_retries = 0
""")


def _codex_session(stack: Stack) -> tuple[str, list[dict]]:
    done = subprocess.run(["bash", str(CODEX_INSTALLER)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"could not install Codex:\n{done.stdout}\n{done.stderr}")
    version = subprocess.run([str(CODEX), "--version"], capture_output=True, text=True, timeout=60).stdout.split()[-1]
    sys.path.insert(0, str(ROOT / "tests"))
    from recording_proxy import RecordingProxy

    prompts = ["Run `echo hello-from-tool` and tell me what it printed.", "Run it once more, please.", "And a third time."]
    with RecordingProxy(stack.gateway.url) as proxy, tempfile.TemporaryDirectory(prefix="codex-home-") as home:
        _codex_home(Path(home), proxy.url + "/llm/v1")
        work = Path(home) / "work"
        work.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
        env.update(HOME=home, CODEX_HOME=str(Path(home) / ".codex"), HOMELAB_API_KEY="x", NO_COLOR="1")
        for i, prompt in enumerate(prompts):
            base = [str(CODEX), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "-C", str(work)]
            args = base + (["resume", "--last", prompt] if i else [prompt])
            run = subprocess.run(args, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
            if run.returncode != 0:
                raise RuntimeError(f"codex exec failed: {run.stdout[-2000:]}\n{run.stderr[-3000:]}")
        requests = []
        for x in proxy.exchanges:
            if x.method == "POST" and x.path == "/llm/v1/responses" and isinstance(x.body, dict):
                headers = {k: v for k, v in x.headers.items() if k in KEPT_HEADERS}
                # one conversation: Codex re-sends all of it each turn (store: false)
                requests.append({"path": x.path_qs, "headers": headers, "conversation": "codex", "body": x.body})
    return version, requests


RECORDINGS = ("claude-code", "anthropic-sdk", "openai-sdk", "openai-responses", "codex")


def record_all(only: tuple[str, ...] = RECORDINGS) -> None:
    """Record the sessions named in `only` (RECORDINGS), overwriting their files."""
    wd = workdir()
    stack = start_stack(wd, agent=True)
    meta = {"recorded_with": "python -m bench.prefix --record"}
    try:
        SESSIONS.mkdir(exist_ok=True)
        for pinned in claude_versions():
            if "claude-code" in only or f"claude-code-{pinned}" in only:
                version, cc = _claude_code_session(stack, pinned)
                save_session(SESSIONS / f"claude-code-{version}.json", {"client": f"Claude Code {version}", **meta}, cc)
                version, cc = _claude_code_session(stack, pinned, {"CLAUDE_CODE_TOTAL_TOKENS_REMINDER": "countdown"})
                save_session(SESSIONS / f"claude-code-{version}-countdown.json",
                             {"client": f"Claude Code {version}, CLAUDE_CODE_TOTAL_TOKENS_REMINDER=countdown", **meta}, cc)
        import anthropic
        import openai

        if "anthropic-sdk" in only:
            save_session(SESSIONS / "anthropic-sdk.json", {"client": f"anthropic SDK {anthropic.__version__}", **meta},
                         _anthropic_session(stack))
        if "openai-sdk" in only:
            save_session(SESSIONS / "openai-sdk.json", {"client": f"openai SDK {openai.__version__}", **meta},
                         _openai_session(stack))
        if "openai-responses" in only:
            save_session(SESSIONS / "openai-responses.json",
                         {"client": f"openai SDK {openai.__version__}, responses", **meta}, _responses_session(stack))
        if "codex" in only:
            version, cx = _codex_session(stack)
            save_session(SESSIONS / "codex.json", {"client": f"Codex CLI {version}", **meta}, cx)
    finally:
        stack.stop()


if __name__ == "__main__":
    record_all(tuple(sys.argv[1:]) or RECORDINGS)
