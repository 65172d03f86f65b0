"""The editors' code-completion requests, taken from their source, and each answer read as that
editor reads it: one class per plugin, so a test says which plugin it is and a change in a plugin
changes one place.

Each plugin's `...()` methods return a `Call`: the path it posts to (relative to what the user
configures as the plugin's endpoint, given as the docstring's setting), the JSON body it sends,
and `read(status, body) -> text`, what the editor would show, or `Refused` when the editor would
show nothing (it ignores the answer, or throws on it). The bodies are the plugins' own, field for
field, with their defaults; the sources (the commit read):

* llama.vim (ggml-org/llama.vim a1c8e6e, autoload/llama.vim): `s:fim` (line ~800) and the ring
  buffer's warm-up `s:ring_update` (~550), `s:fim_on_response` (~900: an answer counts only if it
  matches `^\\s*{` and `"content"\\s*:"`), the info line (~1050: `tokens_cached`, `timings/...`).
* llama.vscode (ggml-org/llama.vscode 3938fb3, src/llama-server.ts): `createRequestPayload`
  (`getFIMCompletion`, and `updateExtraContext`'s warm-up), read by completion.ts
  `getComplFromContent` (an object with `content`, or an array of them) and statusbar.ts
  (`tokens_cached`, `timings.*`); package.json's defaults (n_predict 128, max_parallel_completions
  3, t_max_prompt_ms 500, t_max_predict_ms 500).
* Continue (continuedev/continue d0a3c0b, core/llm/llms/): `OpenAI.ts` `_legacystreamComplete`
  (`completions`, streamed; `choices[0].text`), `Ollama.ts` `_streamFim` (`api/generate` with
  `suffix`, NDJSON, `response`; only when `/api/show`'s template has `.Suffix`), `LlamaCpp.ts`
  `_streamComplete` (llama.cpp's `completion`, SSE, `content`).
* llm-ls (huggingface/llm-ls 1c52b94, crates/llm-ls/src/backend.rs, main.rs): `build_body`
  (the user's `request_body` + `prompt`, `model`, `stream: false`), `build_url` (llamacpp and
  openai: `/v1/completions`, ollama: `/api/generate`), `parse_*_text` (`choices[].text`,
  `response`). The prompt is the FIM form llm-ls builds with the configured tokens.
* Twinny (twinnydotdev/twinny 193d14c, src/extension/provider-options.ts
  `createStreamRequestBodyFim`, utils.ts `getFimDataFromProvider`): ollama (`/api/generate`,
  NDJSON, `response`) and llamacpp (the configured path, llama.cpp's `/completion`, SSE,
  `content`). The prompt is the FIM form Twinny builds from its template.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable


class Refused(Exception):
    """What the editor does with an answer it cannot use: it shows nothing (llama.vim returns
    early; the others throw), with why."""


@dataclass
class Call:
    path: str
    body: dict
    read: Callable[[int, bytes], str]
    headers: dict = field(default_factory=dict)


def _sse(body: bytes) -> list[dict]:
    """SSE `data:` payloads as the plugins' SSE readers parse them (Continue's streamSse, Twinny's
    `data:` split): JSON each, `[DONE]` the end."""
    out = []
    for line in body.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        out.append(json.loads(data))
    return out


def _ndjson(body: bytes) -> list[dict]:
    return [json.loads(line) for line in body.split(b"\n") if line.strip()]


def _ok(status: int, body: bytes) -> None:
    if status != 200:
        raise Refused(f"HTTP {status}: {body[:300]!r}")


# -- llama.vim ---------------------------------------------------------------------------------

LLAMA_VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                    "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                    "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]


class LlamaVim:
    """llama.vim: `g:llama_config.endpoint_fim = 'http://HOST:8080/infill'` (its default config,
    `model_fim` '' and so `"model": ""` in every request)."""

    n_predict = 128
    t_max_prompt_ms = 500
    t_max_predict_ms = 1000

    @staticmethod
    def extra(chunks: list[tuple[str, str]]) -> list[dict]:
        """`s:ring_get_extra()`: the ring buffer's chunks."""
        return [{"text": text, "time": 0, "filename": name} for name, text in chunks]

    def fim(self, prefix: str, middle: str, suffix: str, *, indent: int = 0, extra: list[dict] | None = None,
            first: bool = True) -> Call:
        body = {"id_slot": 0, "input_prefix": prefix, "input_suffix": suffix, "input_extra": extra or [],
                "prompt": middle, "n_predict": self.n_predict, "stop": [], "n_indent": indent, "top_k": 40,
                "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
                "t_max_prompt_ms": self.t_max_prompt_ms,
                # the first request of a burst is quick; a speculative one follows it
                "t_max_predict_ms": 250 if first else self.t_max_predict_ms,
                "response_fields": LLAMA_VIM_FIELDS, "model": ""}
        return Call("/infill", body, self.read)

    def warmup(self, extra: list[dict]) -> Call:
        """`s:ring_update`: the extra context sent ahead, nothing generated, the answer unread."""
        body = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "",
                "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
                "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""], "model": ""}
        return Call("/infill", body, self.read_warmup)

    @staticmethod
    def read(status: int, body: bytes) -> str:
        raw = body.decode()  # curl's stdout, whatever the status (curl --silent, no --fail)
        if not raw:
            raise Refused("an empty answer")
        if not re.match(r"^\s*\{", raw) or not re.search(r'"content"\s*:"', raw):
            raise Refused(f'not a completion (no `"content":"`): {raw[:300]}')
        return json.loads(raw)["content"]

    @staticmethod
    def read_warmup(status: int, body: bytes) -> str:
        _ok(status, body)
        return body.decode()

    @staticmethod
    def info(body: bytes) -> dict:
        """What the info line shows (`s:fim_render`): `c: tokens_cached`, and `p:` / `g:` from the
        flattened timings when all six are there."""
        doc = json.loads(body)
        out = {"tokens_cached": doc.get("tokens_cached", 0), "truncated": doc.get("truncated", False)}
        keys = ["prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second"]
        if all(f"timings/{k}" in doc for k in keys):
            out.update({k: doc[f"timings/{k}"] for k in keys})
        return out


# -- llama.vscode ------------------------------------------------------------------------------


class LlamaVscode:
    """llama.vscode: `"llama-vscode.endpoint": "http://HOST:8080"` (it posts `{endpoint}/infill`),
    no model named unless the user selects one."""

    n_predict = 128
    max_parallel_completions = 3
    t_max_prompt_ms = 500
    t_max_predict_ms = 500

    @staticmethod
    def chunks(chunks: list[tuple[str, str]]) -> list[dict]:
        """extra-context.ts: each chunk `{text, time, filename}`."""
        return [{"text": text, "time": 0, "filename": name} for name, text in chunks]

    def fim(self, prefix: str, prompt: str, suffix: str, *, indent: int = 0, chunks: list[dict] | None = None,
            model: str = "") -> Call:
        body = {"id_slot": 0, "input_prefix": prefix, "input_suffix": suffix, "input_extra": chunks or [],
                "prompt": prompt, "n_predict": self.n_predict, "n_cmpl": self.max_parallel_completions,
                "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
                "cache_prompt": True, **({"n_indent": indent} if indent else {}),
                "t_max_prompt_ms": self.t_max_prompt_ms, "t_max_predict_ms": self.t_max_predict_ms,
                **({"model": model} if model.strip() else {})}
        return Call("/infill", body, self.read)

    def warmup(self, chunks: list[dict], model: str = "") -> Call:
        """`updateExtraContext`: `createRequestPayload(true, "", "", chunks, "", model)`."""
        body = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": chunks, "prompt": "",
                "n_predict": 0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": self.t_max_prompt_ms,
                "t_max_predict_ms": 1}
        return Call("/infill", body, self.read_warmup)

    @staticmethod
    def read(status: int, body: bytes) -> str:
        """axios (throws on a non-2xx), then `getComplFromContent`: the first suggestion."""
        _ok(status, body)
        data = json.loads(body)
        if isinstance(data, dict) and "content" in data:
            return data["content"] or ""
        if isinstance(data, list) and data:
            return data[0].get("content") or ""
        raise Refused(f"no content: {body[:300]!r}")

    @staticmethod
    def read_warmup(status: int, body: bytes) -> str:
        _ok(status, body)
        return ""

    @staticmethod
    def status_bar(body: bytes) -> dict:
        """statusbar.ts: `c: tokens_cached`, `p:` / `g:` from `timings`."""
        data = json.loads(body)
        t = data.get("timings") or {}
        return {"tokens_cached": data.get("tokens_cached"), "prompt_n": t.get("prompt_n"),
                "predicted_n": t.get("predicted_n"), "predicted_per_second": t.get("predicted_per_second")}


# -- Continue ----------------------------------------------------------------------------------


class ContinueOpenAI:
    """Continue's `provider: openai` with `useLegacyCompletionsEndpoint` (`apiBase:
    http://HOST:8080/llm/v1`): the FIM prompt Continue rendered itself, streamed."""

    def complete(self, model: str, prompt: str, *, max_tokens: int = 64, stop: list[str] | None = None,
                 temperature: float = 0.01) -> Call:
        body = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
                "stop": stop or ["\n\n"], "prompt": prompt}
        return Call("/completions", body, self.read)

    @staticmethod
    def read(status: int, body: bytes) -> str:
        _ok(status, body)
        out = []
        for value in _sse(body):
            if "error" in value:
                raise Refused(f"error chunk: {value}")
            choices = value.get("choices") or []
            if choices and choices[0].get("text") and value.get("finish_reason") != "eos":
                out.append(choices[0]["text"])
        return "".join(out)


class ContinueOllama:
    """Continue's `provider: ollama` (`apiBase: http://HOST:8080`): `/api/show` first (a template
    with `.Suffix` makes it send the suffix), then `/api/generate` with the prefix and `suffix`."""

    def show(self, model: str) -> Call:
        return Call("/api/show", {"name": model}, self.read_show)

    @staticmethod
    def read_show(status: int, body: bytes) -> str:
        _ok(status, body)
        return "fim" if ".Suffix" in (json.loads(body).get("template") or "") else "no fim"

    def fim(self, model: str, prefix: str, suffix: str, *, max_tokens: int = 64, stop: list[str] | None = None,
            temperature: float = 0.01) -> Call:
        body = {"model": model, "prompt": prefix, "suffix": suffix,
                "options": {"temperature": temperature, "num_predict": max_tokens, "stop": stop or ["\n\n"]},
                "keep_alive": 1800, "stream": True}
        return Call("/api/generate", body, self.read)

    @staticmethod
    def read(status: int, body: bytes) -> str:
        _ok(status, body)
        out = []
        for j in _ndjson(body):
            if "response" in j:
                out.append(j["response"])
            elif "error" in j:
                raise Refused(j["error"])
        return "".join(out)


class ContinueLlamaCpp:
    """Continue's `provider: llama.cpp` (`apiBase: http://HOST:8080/`): llama.cpp's own
    `completion`, streamed, with the FIM prompt Continue rendered itself."""

    def complete(self, model: str, prompt: str, *, max_tokens: int = 64, stop: list[str] | None = None,
                 temperature: float = 0.01) -> Call:
        body = {"model": model, "prompt": prompt, "stream": True, "n_predict": max_tokens,
                "stop": stop or ["\n\n"], "temperature": temperature}
        return Call("/completion", body, self.read)

    @staticmethod
    def read(status: int, body: bytes) -> str:
        _ok(status, body)
        return "".join(v["content"] for v in _sse(body) if v.get("content"))


# -- llm-ls ------------------------------------------------------------------------------------


class LlmLs:
    """llm-ls (llm.nvim, llm-vscode, llm-intellij): `backend` `llamacpp` or `openai` with `url:
    http://HOST:8080` (it appends `/v1/completions`), or `ollama` (`/api/generate`); the prompt
    is `fim.prefix + before + fim.suffix + after + fim.middle`."""

    @staticmethod
    def prompt(fim: dict, before: str, after: str) -> str:
        return f"{fim['prefix']}{before}{fim['suffix']}{after}{fim['middle']}"

    def openai(self, model: str, prompt: str, request_body: dict | None = None) -> Call:
        """backend `llamacpp` or `openai`: `request_body` is the user's (llm.nvim's docs:
        `{max_tokens, temperature, top_p}`)."""
        body = {**(request_body or {"max_tokens": 60, "temperature": 0.2, "top_p": 0.95}),
                "prompt": prompt, "model": model, "stream": False}
        return Call("/v1/completions", body, self.read_openai)

    def ollama(self, model: str, prompt: str, request_body: dict | None = None) -> Call:
        body = {**(request_body or {"options": {"num_predict": 60, "temperature": 0.2, "top_p": 0.95}}),
                "prompt": prompt, "model": model, "stream": False}
        return Call("/api/generate", body, self.read_ollama)

    @staticmethod
    def read_openai(status: int, body: bytes) -> str:
        data = json.loads(body)  # serde's untagged enum: a generation or an error, whatever the status
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise Refused(f"not a generation: {body[:300]!r}")
        return data["choices"][0]["text"]

    @staticmethod
    def read_ollama(status: int, body: bytes) -> str:
        data = json.loads(body)
        if not isinstance(data, dict) or not isinstance(data.get("response"), str):
            raise Refused(f"not a generation: {body[:300]!r}")
        return data["response"]


# -- Twinny ------------------------------------------------------------------------------------


class Twinny:
    """Twinny's FIM provider: `ollama` (apiPath `/api/generate`) or `llamacpp` (apiPath
    `/completion`), host and port the gateway's; the prompt is its FIM template's."""

    def ollama(self, model: str, prompt: str, *, num_predict: int = 64, temperature: float = 0.2) -> Call:
        body = {"model": model, "prompt": prompt, "stream": True, "keep_alive": "5m",
                "options": {"temperature": temperature, "num_predict": num_predict}}
        return Call("/api/generate", body, self.read_ollama)

    def llamacpp(self, prompt: str, *, num_predict: int = 64, temperature: float = 0.2) -> Call:
        body = {"prompt": prompt, "stream": True, "temperature": temperature, "max_tokens": num_predict}
        return Call("/completion", body, self.read_llamacpp)

    @staticmethod
    def read_ollama(status: int, body: bytes) -> str:
        _ok(status, body)
        return "".join(j.get("response") or "" for j in _ndjson(body))

    @staticmethod
    def read_llamacpp(status: int, body: bytes) -> str:
        _ok(status, body)
        return "".join(v.get("content") or "" for v in _sse(body))


def send(base: str, call: Call, key: str | None = None) -> tuple[int, bytes, str]:
    """Post `call` to `base` (the endpoint the user configured) the way curl or a fetch does. ->
    (status, body, what the editor reads from it, or raises Refused)."""
    from rawhttp import post_raw  # tests/ on the path

    headers = {**call.headers, **({"Authorization": f"Bearer {key}"} if key else {})}
    status, _, body = post_raw(base.rstrip("/") + call.path, call.body, headers, timeout=120)
    return status, body, call.read(status, body)
