"""`python -m bench.prefix`: do the prompts the gateway sends upstream stay cacheable, turn after turn?

An inference server reuses the KV cache of a prompt prefix only when the next prompt starts with
the same tokens. For an agent session that means: turn k+1's rendered prompt must begin with all
of turn k's. This replays recorded client sessions (bench/sessions/*.json: what Claude Code, the
Anthropic SDK, the OpenAI SDK (chat completions and Responses) and Codex CLI sent, with tool calls
and mid-conversation system content)
through a real gateway to a stub that records the upstream requests, renders each upstream request
with real chat templates (bench/templates/, rendered as vLLM does: bench/chat_render.py), and
reports per template and per client:

- prefix share: for each turn k+1 of a conversation, the share of turn k's prompt that is a prefix
  of turn k+1's (1.000 = append-only). `history` pairs are those whose break, if any, lies only in
  the generation prompt (the `<|im_start|>assistant` the answer follows), which a template may
  render differently once the answer is history (DeepSeek-R1's `<think>`);
- refusals: requests the template cannot render, split into the template's own (it has no tool
  role, or demands 9-character tool ids) and ours;
- lost: text the client sent that is missing from the upstream body (the gateway's doing), and text
  of the upstream body missing from the rendered prompt (the template's doing, e.g. R1-distill
  keeps only the last system message).

Where a template moves the system prompt (or the tool list) into the last user turn (Mistral), no
translation can make it append-only: such breaks are reported as the template's.

    python -m bench.prefix [--json] [--sessions GLOB]
    python -m bench.prefix --record [--only NAME]  # re-record (Claude Code, Codex from .cache/)
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .chat_render import TEMPLATES, Template, TemplateRefused, render
from .procs import Proc, workdir

SESSIONS = Path(__file__).resolve().parent / "sessions"
UPSTREAM = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
SMALL = "qwen2.5:3b-instruct"
# Thinking blocks in the recordings are signed by the recording gateway; the replaying one must
# verify them the same way, so both use this (public, bench-only) signing key.
SIGNING_KEY = "hlf-bench-prefix-signing-key"
KEPT_HEADERS = ("x-claude-code-session-id", "session-id", "anthropic-beta", "anthropic-version")


# -- session files ----------------------------------------------------------------------------------
# Claude Code repeats its ~80 KB system prompt and tools, and every earlier message, in each
# request; a file stores each distinct value once ("blobs", by hash) and requests point at them.


BLOB_KEYS = ("system", "tools", "messages", "input", "instructions")


def _ref(blobs: dict, value: Any) -> Any:
    raw = json.dumps(value, sort_keys=True, ensure_ascii=False)
    if len(raw) < 512:
        return value
    key = hashlib.sha256(raw.encode()).hexdigest()[:16]
    blobs.setdefault(key, value)
    return {"$blob": key}


def _deref(blobs: dict, value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"$blob"}:
        return blobs[value["$blob"]]
    return value


def save_session(path: Path, meta: dict, requests: list[dict]) -> None:
    blobs: dict = {}
    out = []
    for r in requests:
        body = dict(r["body"])
        for k in BLOB_KEYS:  # each block, tool, message and input item once
            if isinstance(body.get(k), list):
                body[k] = [_ref(blobs, v) for v in body[k]]
            elif k in body:
                body[k] = _ref(blobs, body[k])
        entry = {"path": r["path"], "headers": r.get("headers", {}), "conversation": r["conversation"], "body": body}
        for k in ("response_id", "response_calls"):  # a Responses answer that later turns name
            if r.get(k):
                entry[k] = r[k]
        out.append(entry)
    path.write_text(json.dumps({**meta, "requests": out, "blobs": blobs}, indent=0, ensure_ascii=False) + "\n")


def load_session(path: Path) -> dict:
    doc = json.loads(path.read_text())
    blobs = doc.pop("blobs", {})
    for r in doc["requests"]:
        body = r["body"]
        for k in BLOB_KEYS:
            if isinstance(body.get(k), list):
                body[k] = [_deref(blobs, v) for v in body[k]]
            elif k in body:
                body[k] = _deref(blobs, body[k])
    return doc


# -- the stack ----------------------------------------------------------------------------------------


@dataclass
class Stack:
    stub: Proc
    gateway: Proc

    def stop(self) -> None:
        self.gateway.stop()
        self.stub.stop()


def start_stack(wd: str, agent: bool = False) -> Stack:
    args = [sys.executable, "-m", "homelab_frontend.stub", "--flavour", "vllm", "--port", "0",
            "--model", UPSTREAM, "--model", SMALL, "--reasoning", "--max-model-len", "1000000"]
    stub = Proc("stub", args + (["--agent"] if agent else []), wd)
    cfg = {
        "backends": {"gpu0": {"url": stub.url + "/v1", "kind": "vllm", "slots": 4}},
        "models": {"reasoning": {"backend": "gpu0", "upstream_model": UPSTREAM}, SMALL: {"backend": "gpu0"}},
        "aliases": {"claude-*haiku*": SMALL, "claude-*": "reasoning"},
        "anthropic": {"signing_key_env": "HLF_BENCH_SIGNING_KEY"},
        # stored Responses (previous_response_id) in this run's own directory, not the user's
        "responses": {"store": {"path": os.path.join(wd, "responses.sqlite3")}},
        "usage": {"path": os.path.join(wd, "usage.sqlite3")},  # and so is the usage ledger
    }
    path = os.path.join(wd, "gateway.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    gw = Proc("gateway", [sys.executable, "-m", "homelab_frontend", "serve", "--config", path, "--port", "0"], wd,
              env={"HLF_BENCH_SIGNING_KEY": SIGNING_KEY})
    return Stack(stub, gw)


def _call(url: str, path: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def responses_answer(raw: bytes) -> tuple[str | None, list[str]]:
    """A Responses answer, whole or streamed (its `response.completed`): its id and the call_ids of
    its function calls."""
    text = raw.decode("utf-8", "replace")
    resp: dict = {}
    if text.lstrip().startswith("{"):
        resp = json.loads(text)
    else:
        for line in text.splitlines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                if event.get("type") == "response.completed":
                    resp = event["response"]
    calls = [item["call_id"] for item in resp.get("output", []) if item.get("type") == "function_call"]
    return resp.get("id"), calls


def _map_ids(body: dict, ids: dict[str, str]) -> dict:
    """A chained Responses turn as this gateway must see it: its previous_response_id and the
    call_ids its function_call_outputs answer are the ones this replay's answers carried."""
    if not body.get("previous_response_id"):
        return body
    items = body.get("input")
    if isinstance(items, list):
        items = [{**i, "call_id": ids.get(i["call_id"], i["call_id"])} if isinstance(i, dict) and "call_id" in i else i
                 for i in items]
    return {**body, "previous_response_id": ids.get(body["previous_response_id"], body["previous_response_id"]),
            "input": items}


def replay(stack: Stack, requests: list[dict]) -> list[dict | None]:
    """Each client request through the gateway; -> the upstream body it became (None: refused).

    A Responses turn that continues with `previous_response_id` names the answer (and its tool
    calls) the recording gateway made; they are mapped to the ones this gateway gave the same turn
    (the agent stub answers a replayed turn as it answered the recorded one, with new ids)."""
    _call(stack.stub.url, "/stub/reset", {})
    out: list[dict | None] = []
    ids: dict[str, str] = {}
    for r in requests:
        headers = {**r.get("headers", {}), "x-api-key": "x"}
        status, raw = _call(stack.gateway.url, r["path"], _map_ids(r["body"], ids), headers)
        if status == 200 and r.get("response_id"):
            new_id, new_calls = responses_answer(raw)
            ids[r["response_id"]] = new_id or ""
            if len(new_calls) != len(r.get("response_calls", [])):
                raise RuntimeError(f"replayed {r['response_id']} made {len(new_calls)} tool calls, "
                                   f"the recording {len(r.get('response_calls', []))}")
            ids.update(zip(r.get("response_calls", []), new_calls))
        seen = json.loads(_call(stack.stub.url, "/stub/requests")[1])
        _call(stack.stub.url, "/stub/reset", {})
        if status != 200 or len(seen) != 1:
            raise RuntimeError(f"replay of {r['path']} failed: {status} {raw[:300]!r} ({len(seen)} upstream requests)")
        out.append(seen[0]["body"])
    return out


# -- what the client said, and whether it arrived -------------------------------------------------------


def _strings(value: Any, keys: tuple[str, ...] = ("text", "content")) -> list[str]:
    """Every text the client wrote in a message or block tree."""
    if isinstance(value, str):
        return [value]
    out: list[str] = []
    if isinstance(value, list):
        for v in value:
            out += _strings(v, keys)
    elif isinstance(value, dict):
        if value.get("type") in ("thinking", "redacted_thinking", "image", "image_url"):
            return out  # not text the model is shown as such (thinking goes as reasoning)
        for k in keys:
            if k in value:
                out += _strings(value[k], keys)
    return out


BILLING = "x-anthropic-billing-header"
COUNTER = re.compile(r"<total_tokens>[^<>]{0,64}</total_tokens>")


def _input_texts(items: Any) -> list[str]:
    """A Responses `input`: messages' text parts, tool outputs, the names of the calls."""
    if isinstance(items, str):
        return [items]
    texts: list[str] = []
    for item in items or []:
        kind = item.get("type", "message")
        if kind == "message":
            texts += _strings(item.get("content"))
        elif kind == "function_call":
            texts.append(item.get("name", ""))
        elif kind == "function_call_output":
            texts += _strings(item.get("output"))
    return texts


def client_texts(r: dict) -> list[str]:
    body = r["body"]
    texts = _strings(body.get("system")) if "system" in body else []
    if "input" in body or "instructions" in body:
        texts += _strings(body.get("instructions")) + _input_texts(body.get("input"))
    for m in body.get("messages", []):
        texts += _strings(m.get("content"))
        for call in m.get("tool_calls") or []:
            texts.append(call.get("function", {}).get("name", ""))
        if isinstance(m.get("content"), list):
            texts += [b.get("name", "") for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
    # dropped on purpose (README): the per-request billing header and Claude Code's token counter
    # mean nothing to a local model
    texts = [COUNTER.sub("\n", t) for t in texts]
    return [t.strip() for t in texts if t.strip() and not t.startswith(BILLING)]


def upstream_texts(body: dict) -> list[str]:
    texts = []
    for m in body.get("messages", []):
        texts += _strings(m.get("content"))
        for call in m.get("tool_calls") or []:
            texts.append(call.get("function", {}).get("name", ""))
    return [t.strip() for t in texts if t.strip()]


def _missing(texts: list[str], haystack: str) -> list[str]:
    # A text is "there" when each of its lines is (parts of one message may be joined by a
    # newline, and templates trim).
    return [t for t in texts if t not in haystack and not all(line.strip() in haystack for line in t.splitlines())]


# -- analysis -------------------------------------------------------------------------------------------


def _lcp(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _plain(value: Any) -> Any:
    """A client value as the model sees it: without cache_control markers (which clients move from
    turn to turn and the gateway never forwards), and a content list of text blocks the same as
    its text (Claude Code sends the newest user turn as `[{"type": "text", ...}]` and the same
    turn as a plain string once it is history; both reach the upstream as the same string)."""
    if isinstance(value, list):
        if value and all(isinstance(v, dict) and v.get("type") == "text" and set(v) <= {"type", "text", "cache_control"}
                         for v in value):
            return "\n".join(v.get("text", "") for v in value)
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    return value


def client_extends(prev: dict, cur: dict) -> bool:
    """Did the client itself keep the conversation append-only from `prev` to `cur`: the same
    system prompt and tools, and all of prev's messages first, unchanged? When it did not (Claude
    Code rewrote a line of its own system prompt between two `claude -p --continue` runs), a break
    is the client's, whatever the gateway does."""
    a, b = _plain(prev["body"]), _plain(cur["body"])
    if any(a.get(k) != b.get(k) for k in ("system", "tools", "instructions")):
        return False
    if "input" in b:
        # Responses: either chained to prev's answer (previous_response_id, only the new input
        # sent) or, stateless (store: false, as Codex runs), all of prev's input re-sent first
        if b.get("previous_response_id"):
            return b["previous_response_id"] == prev.get("response_id")
        ma, mb = a.get("input", []), b.get("input", [])
        ma, mb = ([{"role": "user", "content": x}] if isinstance(x, str) else x for x in (ma, mb))
        return len(ma) <= len(mb) and mb[: len(ma)] == ma
    ma, mb = a.get("messages", []), b.get("messages", [])
    return len(ma) <= len(mb) and mb[: len(ma)] == ma


def _inherent_refusal(t: Template, body: dict, message: str) -> bool:
    msgs = body.get("messages", [])
    tools_used = any(m.get("role") == "tool" or m.get("tool_calls") for m in msgs)
    if not t.tool_role and tools_used:
        return True
    return "Tool call IDs should be alphanumeric strings with length 9" in message


def _inherent_break(t: Template, body: dict) -> bool:
    msgs = body.get("messages", [])
    return t.system_in_last_user and (any(m.get("role") == "system" for m in msgs) or bool(body.get("tools")))


@dataclass
class TemplateReport:
    template: str
    requests: int = 0
    refused_template: int = 0
    refused_ours: int = 0
    refusal_reasons: dict[str, int] = field(default_factory=dict)
    pairs: int = 0
    shares: list[float] = field(default_factory=list)
    history_stable: int = 0
    template_breaks: int = 0  # pairs broken by the template's own rules
    client_breaks: int = 0  # pairs where the client itself changed what it had sent before
    lost_in_rendering: int = 0  # requests with upstream text missing from the prompt
    lost_examples: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        ours = self.shares
        return {
            "requests": self.requests,
            "rendered": self.requests - self.refused_template - self.refused_ours,
            "refused_by_template": self.refused_template,
            "refused_ours": self.refused_ours,
            "refusals": self.refusal_reasons,
            "pairs": self.pairs,
            "min_prefix_share": round(min(ours), 4) if ours else None,
            "mean_prefix_share": round(sum(ours) / len(ours), 4) if ours else None,
            "pairs_history_stable": self.history_stable,
            "pairs_broken_by_template": self.template_breaks,
            "pairs_changed_by_client": self.client_breaks,
            "requests_losing_text_in_template": self.lost_in_rendering,
            "lost_examples": self.lost_examples[:3],
        }


def analyze(requests: list[dict], upstream: list[dict | None]) -> dict:
    lost_in_gateway = []
    for r, up in zip(requests, upstream):
        missing = _missing(client_texts(r), "\n".join(upstream_texts(up or {})))
        lost_in_gateway += missing
    reports = {}
    for t in TEMPLATES:
        rep = TemplateReport(t.name)
        prompts: list[tuple[dict, str | None, str | None, dict]] = []  # (client request, prompt, history, body)
        for r, up in zip(requests, upstream):
            rep.requests += 1
            try:
                prompt = render(t, up)
                history = render(t, up, add_generation_prompt=False)
            except TemplateRefused as exc:
                reason = str(exc)[:80]
                rep.refusal_reasons[reason] = rep.refusal_reasons.get(reason, 0) + 1
                if _inherent_refusal(t, up, str(exc)):
                    rep.refused_template += 1
                else:
                    rep.refused_ours += 1
                prompts.append((r, None, None, up))
                continue
            missing = _missing(upstream_texts(up), prompt)
            if missing:
                rep.lost_in_rendering += 1
                rep.lost_examples.append(missing[0][:60])
            prompts.append((r, prompt, history, up))
        last: dict[str, tuple[dict, str | None, str | None]] = {}
        for r, prompt, history, body in prompts:
            conv = r["conversation"]
            if conv in last:
                prev_r, prev_prompt, prev_history = last[conv]
                if prev_prompt is not None and prompt is not None:
                    n = _lcp(prev_prompt, prompt)
                    share = n / len(prev_prompt)
                    if not client_extends(prev_r, r):
                        rep.client_breaks += 1
                    elif _inherent_break(t, body) and share < 1.0:
                        rep.template_breaks += 1
                    else:
                        rep.pairs += 1
                        rep.shares.append(share)
                        if n >= len(prev_history or ""):
                            rep.history_stable += 1
            last[conv] = (r, prompt, history)
        reports[t.name] = rep.summary()
    return {"requests": len(requests), "conversations": len({r["conversation"] for r in requests}),
            "client_text_lost_in_gateway": len(lost_in_gateway), "lost_examples": [x[:80] for x in lost_in_gateway[:3]],
            "templates": reports}


def run(paths: list[Path]) -> dict:
    wd = workdir()
    stack = start_stack(wd, agent=True)  # answers as in the recording: chained turns build on them
    out = {}
    try:
        for path in paths:
            doc = load_session(path)
            upstream = replay(stack, doc["requests"])
            out[path.stem] = {"client": doc.get("client", path.stem), **analyze(doc["requests"], upstream)}
    finally:
        stack.stop()
    return out


def print_report(results: dict) -> None:
    for name, res in results.items():
        print(f"{name} ({res['client']}): {res['requests']} requests in {res['conversations']} conversations; "
              f"client text lost in the gateway: {res['client_text_lost_in_gateway']}")
        print(f"  {'template':26} {'rendered':>8} {'refused(tmpl/ours)':>18} {'pairs':>5} {'min':>7} {'mean':>7} "
              f"{'hist-ok':>7} {'tmpl-breaks':>11} {'client-edits':>12} {'lost':>4}")
        for t, s in res["templates"].items():
            mn = "-" if s["min_prefix_share"] is None else f"{s['min_prefix_share']:.3f}"
            me = "-" if s["mean_prefix_share"] is None else f"{s['mean_prefix_share']:.3f}"
            print(f"  {t:26} {s['rendered']:>8} {str(s['refused_by_template']) + '/' + str(s['refused_ours']):>18} "
                  f"{s['pairs']:>5} {mn:>7} {me:>7} {s['pairs_history_stable']:>7} {s['pairs_broken_by_template']:>11} "
                  f"{s['pairs_changed_by_client']:>12} {s['requests_losing_text_in_template']:>4}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.prefix", description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", default=str(SESSIONS / "*.json"), help="glob of session files")
    ap.add_argument("--record", action="store_true", help="re-record the sessions first (bench/prefix_record.py)")
    ap.add_argument("--only", action="append", default=None, metavar="NAME",
                    help="with --record: only these recordings (claude-code or claude-code-VERSION, anthropic-sdk, "
                         "openai-sdk, openai-responses, codex); repeatable")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.record:
        from .prefix_record import record_all

        record_all(tuple(args.only)) if args.only else record_all()
    paths = sorted(Path(p) for p in glob.glob(args.sessions))
    if not paths:
        print(f"no session files match {args.sessions}", file=sys.stderr)
        return 2
    results = run(paths)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print_report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
