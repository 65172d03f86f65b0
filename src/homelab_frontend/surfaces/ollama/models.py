"""Model names and model documents in Ollama's shapes (`/api/tags`, `/api/ps`, `/api/show`): pure.

Names
    Ollama names a model `name:tag`, and an untagged name means `:latest` (Open WebUI adds it to
    every untagged name it sends). So a configured model `reasoning` is listed as
    `reasoning:latest`; `qwen2.5:3b` stays as it is. Requests resolve either form
    (policy/routing.resolve_alias), and answers echo the name the client sent.
Capabilities (`/api/show`)
    From the backend where it tells (upstream/capabilities.py: Ollama's own list, llama.cpp's
    /props), else the model's `capabilities:` in the config, else only `completion` (every model
    the gateway routes is served for chat). Several backends: only what all of those that tell
    agree on. `model_info` has `general.architecture` (the backend's, else "unknown"),
    `general.basename` and `<arch>.context_length`: the context a request may really use (the
    gateway's own figure, as its clamp uses: config, else the backend's /v1/models), else the
    backend's. VS Code Copilot sizes its prompts from it and turns tool calling on by `tools`.
    `template` and `parameters` only when the backend gave them.
What each model is, beside Ollama's own fields
    `/api/tags` and `/api/ps` entries also carry the model's `capabilities`, `context_length` and
    `state` (loaded, loading, sleeping, stopped...: surfaces/model_card.py); `/api/show` its
    `state` beside the capabilities. Ollama's clients ignore fields they do not know.
Sizes and digests
    The gateway holds no model files: `size` is 0 and `digest` a SHA-256 of the name (stable, so
    clients that key on it see the same model each time; it names no blob).
"""

from __future__ import annotations

import hashlib

import msgspec

from ...upstream.capabilities import Facts
from ..model_card import Card

__all__ = ["merge_facts", "ps_entry", "show_document", "tag_name", "tags_entry"]


def tag_name(name: str) -> str:
    """`reasoning` -> `reasoning:latest`; a tagged name (`qwen2.5:3b`, `ns/m:q4`) as it is."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def merge_facts(told: list[Facts], configured: list[str] | None) -> Facts:
    """One account from what the backends told (None: that one did not say) and the config."""
    if told:
        caps = [c for c in told[0].capabilities if all(c in f.capabilities for f in told[1:])]
        first = told[0]
        lens = [f.context_length for f in told if f.context_length]
        return Facts(tuple(caps), first.model_info, first.details, first.template, first.parameters,
                     min(lens) if lens else None)
    return Facts(tuple(configured) if configured else ("completion",))


def _details(facts: Facts) -> dict:
    keys = ("parent_model", "format", "family", "families", "parameter_size", "quantization_level")
    return {k: facts.details[k] for k in keys if k in facts.details}


def tags_entry(name: str, modified_at: str, card: Card | None = None) -> dict:
    tagged = tag_name(name)
    entry = {"name": tagged, "model": tagged, "modified_at": modified_at, "size": 0, "digest": digest(tagged),
             "details": _details(card.facts) if card else {}}
    if card is not None:
        entry["capabilities"] = list(card.capabilities)
        if card.context_length:
            entry["context_length"] = card.context_length
        entry["state"] = card.state
    return entry


def ps_entry(name: str, context_length: int | None, card: Card | None = None) -> dict:
    """A running model. No `expires_at`: a backend the gateway does not manage stays loaded, and
    claiming a time would be invented."""
    entry = tags_entry(name, "", card)
    del entry["modified_at"]
    entry["size_vram"] = 0
    if context_length:
        entry["context_length"] = context_length
    return entry


def with_fim(facts: Facts, fim) -> Facts:
    """A model with a FIM template (config `fim:`) can fill in the middle through the gateway:
    `insert` among its capabilities, and, when the backend gave no template, one in Ollama's Go
    syntax with `.Suffix` (what Continue looks for to decide a model takes a suffix)."""
    caps = facts.capabilities if "insert" in facts.capabilities else (*facts.capabilities, "insert")
    template = facts.template
    if template is None or ".Suffix" not in template:
        if fim.order == "spm":
            fill = f"{fim.suffix}{{{{ .Suffix }}}}{fim.prefix}{{{{ .Prompt }}}}{fim.middle}"
        else:
            fill = f"{fim.prefix}{{{{ .Prompt }}}}{fim.suffix}{{{{ .Suffix }}}}{fim.middle}"
        template = f"{{{{- if .Suffix }}}}{fill}{{{{- else }}}}{{{{ .Prompt }}}}{{{{- end }}}}"
    return msgspec.structs.replace(facts, capabilities=caps, template=template)


def show_document(name: str, facts: Facts, context_length: int | None, modified_at: str,
                  card: Card | None = None) -> dict:
    info = dict(facts.model_info)
    arch = info.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        arch = "unknown"
        info["general.architecture"] = arch
    base = name.rsplit("/", 1)[-1].split(":", 1)[0]
    info.setdefault("general.basename", base)
    length = context_length or facts.context_length
    if length:
        info[f"{arch}.context_length"] = length
    doc: dict = {
        "modelfile": "",
        "details": _details(facts),
        "model_info": info,
        "capabilities": list(facts.capabilities),
        "modified_at": modified_at,
    }
    if card is not None:
        doc["state"] = card.state
    if facts.template is not None:
        doc["template"] = facts.template
    if facts.parameters is not None:
        doc["parameters"] = facts.parameters
    return doc
