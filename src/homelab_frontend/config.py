"""YAML config -> typed `Config`. Every default lives here, and every problem is reported with
the key path that holds it (`models.reasoning.backend: no backend named 'gpu9'`)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec
import yaml


class Listen(msgspec.Struct, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 8080


class Queue(msgspec.Struct, forbid_unknown_fields=True):
    depth: int = 32  # waiting requests per backend beyond its slots
    timeout_s: float = 60.0  # longest wait for a slot


class Timeouts(msgspec.Struct, forbid_unknown_fields=True):
    connect_s: float = 5.0  # TCP connect to the backend
    # Admission to the first upstream chunk: covers the backend's own queue and a long prefill.
    first_token_s: float = 300.0
    idle_s: float = 60.0  # longest silence between two upstream chunks of a stream
    total_s: float | None = None  # whole request; off: long generations are legitimate
    # A non-streaming upstream call sends nothing until it is done, so neither first_token_s nor
    # idle_s can judge it; this bounds it unless total_s is set.
    nonstream_s: float = 600.0


class ReadLimits(msgspec.Struct, forbid_unknown_fields=True):
    """What the gateway reads from a backend at most: an upstream is untrusted input too."""

    max_line_bytes: int = 1024 * 1024  # one SSE line of a stream
    max_body_bytes: int = 16 * 1024 * 1024  # a whole non-streaming answer (or error, probe) body


BackendKind = Literal["vllm", "ollama", "llamacpp", "openai", "peer"]


class Run(msgspec.Struct, forbid_unknown_fields=True):
    """A managed backend: the gateway starts, stops (or puts to sleep) its server
    (lifecycle/ has the state machine, the swap policy and the process supervisor)."""

    cmd: list[str] | str  # argv; a string is split like a shell would (never run by a shell)
    env: dict[str, str] = msgspec.field(default_factory=dict)  # added to the gateway's environment
    cwd: str | None = None
    uses: dict[str, float] = msgspec.field(default_factory=dict)  # of `resources`, while running
    ready_url: str | None = None  # default: GET <url>/models answering 200
    start_timeout_s: float = 300.0  # from spawn to ready
    idle_ttl_s: float | None = None  # stop after this long with no request (from its end); None: never
    stop_timeout_s: float = 15.0  # one SIGTERM, then SIGKILL after this
    # should the gateway die (kill -9 included): the tree's one SIGTERM, then SIGKILL after this
    # (lifecycle/supervisor.py's DEATH_GRACE_S; vLLM needs ~3 s to unlink its shared memory)
    kill_grace_s: float = 5.0
    preload: bool = False  # start at boot instead of at the first request
    unload: Literal["stop", "sleep"] = "stop"  # sleep: vLLM's POST /sleep and /wake_up (kind vllm)
    sleep_level: int = 1  # vLLM sleep level: 1 keeps the weights in CPU memory, 2 drops them
    backoff_s: float = 5.0  # after a failed start; doubles per consecutive failure (to 32x)

    def argv(self) -> list[str]:
        return shlex.split(self.cmd) if isinstance(self.cmd, str) else list(self.cmd)


class Lifecycle(msgspec.Struct, forbid_unknown_fields=True):
    """How managed backends share `resources` (lifecycle/policy.py)."""

    # batch: serve what is queued for a running backend before swapping it out, but swap at the
    # latest once another backend's oldest request has waited swap_after_s. fifo: strict arrival
    # order across backends (what llama-swap does), for comparison (bench.swap).
    policy: Literal["batch", "fifo"] = "batch"
    swap_after_s: float = 20.0


# -- several boxes (docs/several-boxes.md): a peer is another homelab-frontend used as a backend --


class Peer(msgspec.Struct, forbid_unknown_fields=True):
    """A backend of `kind: peer`: another box's gateway, its url that gateway's `/llm/v1`, its
    `api_key_env` a key of that gateway's (marked `peer: true` there). Its models, their state
    and its slots come from the peer's own `/llm/v1/models`, polled every `health_interval_s`."""

    # the peer's models served here under their own names (names or globs); None: all of them.
    # A model in `models:` that names this backend is served whatever this says.
    models: list[str] | None = None
    # loaded first: a model two boxes serve goes where it is loaded while that box has a free
    # slot; to a box where it must start only when the wait where it is loaded is longer than the
    # start there (the peer's own figure: its last start, else its start timeout) plus this.
    start_penalty_s: float = 0.0


class Backend(msgspec.Struct, forbid_unknown_fields=True):
    url: str  # OpenAI-compatible base URL, ending in /v1
    slots: int = 8
    api_key_env: str | None = None
    # What the upstream software is: decides which wire extras it understands (vLLM's
    # stop_reason and continuous usage stats) and what the gateway must do itself. Left out:
    # detected from the backend's /v1/models (upstream/backend_kind.py); vllm until the first probe.
    kind: BackendKind | None = None
    max_model_len: int | None = None  # default: read from the backend's /v1/models
    queue: Queue = msgspec.field(default_factory=Queue)
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    limits: ReadLimits = msgspec.field(default_factory=ReadLimits)
    health_interval_s: float = 10.0
    run: Run | None = None  # the gateway runs this backend's server (a managed backend)
    peer: Peer = msgspec.field(default_factory=Peer)  # kind peer: which of its models, loaded-first

    @property
    def reports_stop_reason(self) -> bool:
        return self.kind == "vllm"

    @property
    def streams_upstream(self) -> bool:
        """Ask for a stream even when the client wants one whole answer. llama.cpp checks a
        non-streaming client's socket only after a full second in which no task at all gave a
        result, so while anything else runs on it (another slot's tokens, a /metrics scrape) a
        generation whose client left runs to its end; a stream it stops at the next token."""
        return self.kind == "llamacpp"


class Fim(msgspec.Struct, forbid_unknown_fields=True):
    """A model's fill-in-the-middle template: the tokens around a prefix P and a suffix S. `psm`
    (most families) renders prefix + P + suffix + S + middle; `spm` (Codestral) renders
    suffix + S + prefix + P + middle. The model then generates the middle."""

    prefix: str
    suffix: str
    middle: str = ""
    order: Literal["psm", "spm"] = "psm"


# The common families' templates, each checked against the special tokens of that family's
# tokenizer (docs/code-completion.md names the sources). CodeLlama's tokens carry their spaces:
# its training format is "<PRE> " + P + " <SUF>" + S + " <MID>".
FIM_PRESETS: dict[str, Fim] = {
    "qwen2.5-coder": Fim("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    "deepseek-coder": Fim("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581end\uff5c>"),
    "codellama": Fim("<PRE> ", " <SUF>", " <MID>"),
    "starcoder2": Fim("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "codestral": Fim("[PREFIX]", "[SUFFIX]", "", order="spm"),
}


MODEL_CAPABILITIES = ("completion", "tools", "thinking", "vision", "embedding", "insert", "audio")


class Model(msgspec.Struct, forbid_unknown_fields=True):
    backend: str | None = None
    backends: list[str] | None = None
    upstream_model: str | None = None  # default: the client name
    max_model_len: int | None = None
    # System turns after the first non-system message: merged into the neighbouring user/tool
    # message (every chat template accepts that), or sent as they are (templates that render
    # them in place, e.g. Qwen2.5, Llama 3.1). See upstream/system_turns.py.
    system_turns: Literal["merge", "native"] = "merge"
    # Several backends: keep a conversation's turns on one of them, for its prefix cache
    # (policy/affinity.py); a turn waits at most this much longer there than on the least-loaded one.
    affinity: bool = True
    affinity_max_wait_s: float = 2.0
    # Another model to serve this one's requests when every backend of this one is down (not
    # when they are busy: busy waits in the queue). The answer still names the client's model.
    fallback: str | None = None
    # What the model can do, for Ollama's /api/show (completion, tools, thinking, vision,
    # embedding, insert, audio), when its backends do not say (vLLM never does; Ollama and
    # llama.cpp do, and win). Left out: only `completion` is claimed.
    capabilities: list[str] | None = None
    # Code completion (docs/code-completion.md). `fim`: the model's fill-in-the-middle template,
    # or a preset's name (FIM_PRESETS, any case): a completion with a `suffix` is rendered into one
    # prompt with it. Left out: a `suffix` goes to a llama.cpp backend's /infill, or is a 400.
    fim: Fim | str | None = None
    # A client's new completion on this model cancels its previous one (queued or generating).
    supersede: bool = False
    # Queue order between this model's requests and others' on a shared backend: higher first
    # (added to the key's priority).
    priority: int = 0

    def fim_template(self) -> Fim | None:
        if isinstance(self.fim, str):
            return FIM_PRESETS.get(self.fim.lower())
        return self.fim

    def backend_names(self) -> list[str]:
        if self.backends:
            return list(self.backends)
        return [self.backend] if self.backend else []


class Budget(msgspec.Struct, forbid_unknown_fields=True):
    """Tokens a key may use per UTC day / UTC calendar month: input + output, counted as each
    request finishes (usage/budgets.py). Past it the key's new requests get a 429."""

    tokens_per_day: int | None = None
    tokens_per_month: int | None = None


class AuthKey(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    key_env: str | None = None
    key: str | None = None  # literal, discouraged: prefer key_env
    max_concurrent: int | None = None
    priority: int = 0  # higher goes first in a queue
    models: list[str] | None = None  # allowed client model names / globs; None: all
    budget: Budget | None = None
    # A front gateway's key (docs/several-boxes.md): requests with it may name the person the
    # front admitted (x-hlf-on-behalf-of), who is then the one counted, and the backend it holds.
    peer: bool = False


class Auth(msgspec.Struct, forbid_unknown_fields=True):
    keys: list[AuthKey] = msgspec.field(default_factory=list)
    admin_key_env: str | None = None


class Limits(msgspec.Struct, forbid_unknown_fields=True):
    max_body_bytes: int = 32 * 1024 * 1024
    max_json_depth: int = 64
    max_messages: int = 10_000
    max_tools: int = 512
    max_header_bytes: int = 16 * 1024


class Connections(msgspec.Struct, forbid_unknown_fields=True):
    """Client connection hygiene: a connection that never finishes its request, or sits idle,
    must not hold a file descriptor (and a place under the cap) for an hour."""

    head_timeout_s: float = 15.0  # from a connection's (or an idle one's next) first byte to a whole request head
    keepalive_timeout_s: float = 75.0  # an idle keep-alive connection is closed after this
    max_connections: int = 1000  # open client connections; past it the oldest idle one is closed


class Anthropic(msgspec.Struct, forbid_unknown_fields=True):
    ping_interval_s: float = 10.0  # keep-alive frames while the upstream is silent
    # Secret for thinking-block signatures; unset: a random one per process (signatures from
    # before a restart then no longer verify, and such thinking is dropped from history).
    signing_key_env: str | None = None


class ResponseStore(msgspec.Struct, forbid_unknown_fields=True):
    # SQLite file for stored Responses (`store: true`); default under $XDG_STATE_HOME (or
    # ~/.local/state)/homelab-frontend/. With a `cluster:` section they live in its Redis instead.
    path: str | None = None
    ttl_s: float = 30 * 24 * 3600.0  # a stored response is forgotten this long after it was made
    max_bytes: int = 256 * 1024 * 1024  # the oldest responses go first beyond this total


class Responses(msgspec.Struct, forbid_unknown_fields=True):
    store: ResponseStore = msgspec.field(default_factory=ResponseStore)


class Usage(msgspec.Struct, forbid_unknown_fields=True):
    """The usage ledger (usage/): per key x model x hour. SQLite by default, beside the
    Responses store's file; with a `cluster:` section, in its Redis (shared by the replicas)."""

    enabled: bool = True
    path: str | None = None  # default: $XDG_STATE_HOME (or ~/.local/state)/homelab-frontend/usage.sqlite3
    retention_days: int = 400  # hourly rows older than this are deleted
    flush_interval_s: float = 0.5  # a crash loses at most this much (plus one write)


class Tracing(msgspec.Struct, forbid_unknown_fields=True):
    """OpenTelemetry traces over OTLP/HTTP (tracing/; `pip install homelab-frontend[otel]`).
    Off unless `otlp_endpoint` is set; the standard OTEL_* variables apply on top."""

    otlp_endpoint: str | None = None  # e.g. http://127.0.0.1:4318/v1/traces
    sample: float = 1.0  # share of new traces kept (a client's sampled traceparent is always kept)
    service_name: str = "homelab-frontend"
    capture_content: bool = False  # the prompt's last user text as an attribute; off: no prompt text


class Completions(msgspec.Struct, forbid_unknown_fields=True):
    """Code completion endpoints (surfaces/completions/)."""

    # The model of an /infill request that names none (llama.vscode sends no model)
    default_model: str | None = None


class Cluster(msgspec.Struct, forbid_unknown_fields=True):
    redis_url: str
    lease_s: float = 10.0
    replica_id: str | None = None  # default: hostname-pid


class Config(msgspec.Struct, forbid_unknown_fields=True):
    listen: Listen = msgspec.field(default_factory=Listen)
    backends: dict[str, Backend] = msgspec.field(default_factory=dict)
    models: dict[str, Model] = msgspec.field(default_factory=dict)
    aliases: dict[str, str] = msgspec.field(default_factory=dict)  # name or glob -> model
    auth: Auth = msgspec.field(default_factory=Auth)
    limits: Limits = msgspec.field(default_factory=Limits)
    connections: Connections = msgspec.field(default_factory=Connections)
    anthropic: Anthropic = msgspec.field(default_factory=Anthropic)
    responses: Responses = msgspec.field(default_factory=Responses)
    cluster: Cluster | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    tracing: Tracing = msgspec.field(default_factory=Tracing)
    completions: Completions = msgspec.field(default_factory=Completions)
    resources: dict[str, float] = msgspec.field(default_factory=dict)  # what managed backends share
    lifecycle: Lifecycle = msgspec.field(default_factory=Lifecycle)
    shutdown_grace_s: float = 30.0  # SIGTERM: how long in-flight requests may finish
    access_log: str | None = None  # a file path; default: stderr


class ConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


_UNKNOWN = re.compile(r"Object contains unknown field `([^`]*)`")
_MSGSPEC_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def _msgspec_problem(prefix: str, err: msgspec.ValidationError) -> str:
    text = str(err)
    m = _MSGSPEC_PATH.search(text)
    path = prefix
    if m:
        tail = m.group("path").replace("[", ".").replace("]", "").replace("'", "")
        path = f"{prefix}{tail}" if prefix else tail.lstrip(".")
        text = text[: m.start()]
    unknown = _UNKNOWN.match(text)
    if unknown:
        key = unknown.group(1)
        return f"{path + '.' if path else ''}{key}: unknown key"
    return f"{path or '(top)'}: {text[0].lower() + text[1:] if text else 'invalid'}"


def _convert(prefix: str, raw: Any, typ: type, problems: list[str]) -> Any:
    try:
        return msgspec.convert(raw, typ, strict=True)
    except msgspec.ValidationError as err:
        problems.append(_msgspec_problem(prefix, err))
        return None


def parse(raw: Any) -> Config:
    """Validate a loaded YAML document. Raises ConfigError with one line per problem."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(["(top): expected a mapping of sections"])
    problems: list[str] = []
    sections: dict[str, Any] = {}
    # Section by section, so that one bad section does not hide the problems of the others.
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("backends", "models"):
            continue
        part = _convert("", {key: value}, Config, problems)
        if part is not None:
            fields[key] = getattr(part, key)
    top = msgspec.structs.replace(Config(), **fields)
    backends: dict[str, Backend] = {}
    raw_backends = raw.get("backends") or {}
    if not isinstance(raw_backends, dict):
        problems.append("backends: expected a mapping of backend names")
        raw_backends = {}
    for name, b in raw_backends.items():
        got = _convert(f"backends.{name}", b, Backend, problems)
        if got is not None:
            backends[str(name)] = got
    models: dict[str, Model] = {}
    raw_models = raw.get("models") or {}
    if not isinstance(raw_models, dict):
        problems.append("models: expected a mapping of model names")
        raw_models = {}
    for name, m in raw_models.items():
        got = _convert(f"models.{name}", m if m is not None else {}, Model, problems)
        if got is not None:
            models[str(name)] = got
    sections.update(backends=backends, models=models)
    cfg = msgspec.structs.replace(top, **sections)
    problems += _check(cfg, raw_backends)
    if problems:
        raise ConfigError(problems)
    return cfg


def _fallback_problems(models: dict[str, Model]) -> list[str]:
    """A fallback names a model; following fallbacks never comes back to where it started."""
    problems = []
    for name, m in models.items():
        if m.fallback is None:
            continue
        if m.fallback not in models:
            problems.append(f"models.{name}.fallback: no model named {m.fallback!r}")
            continue
        chain = [name]
        nxt: str | None = m.fallback
        while nxt is not None and nxt in models and nxt not in chain:
            chain.append(nxt)
            nxt = models[nxt].fallback
        if nxt == name:
            problems.append(f"models.{name}.fallback: a loop ({' -> '.join([*chain, name])})")
    return problems


def _fim_problems(p: str, m: Model) -> list[str]:
    if isinstance(m.fim, str):
        if m.fim.lower() not in FIM_PRESETS:
            return [f"{p}.fim: unknown preset {m.fim!r} (known: {', '.join(FIM_PRESETS)}; "
                    "or give {prefix, suffix, middle})"]
        return []
    if m.fim is not None:
        problems = [f"{p}.fim.{k}: must not be empty" for k in ("prefix", "suffix") if not getattr(m.fim, k)]
        if m.fim.order == "psm" and not m.fim.middle:
            problems.append(f"{p}.fim.middle: must not be empty for order psm (what tells the model to write the middle?)")
        return problems
    return []


def _check(cfg: Config, raw_backends: dict) -> list[str]:
    problems: list[str] = []
    if not (0 <= cfg.listen.port <= 65535):
        problems.append(f"listen.port: {cfg.listen.port} is not a TCP port")
    for name, b in cfg.backends.items():
        p = f"backends.{name}"
        parts = urlsplit(b.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(f"{p}.url: {b.url!r} is not an http(s) URL")
        if b.slots < 1:
            problems.append(f"{p}.slots: must be at least 1, got {b.slots}")
        if b.queue.depth < 0:
            problems.append(f"{p}.queue.depth: must be 0 or more, got {b.queue.depth}")
        if b.queue.timeout_s < 0:
            problems.append(f"{p}.queue.timeout_s: must be 0 or more")
        for field in ("connect_s", "first_token_s", "idle_s", "nonstream_s"):
            if getattr(b.timeouts, field) <= 0:
                problems.append(f"{p}.timeouts.{field}: must be more than 0")
        if b.timeouts.total_s is not None and b.timeouts.total_s <= 0:
            problems.append(f"{p}.timeouts.total_s: must be more than 0 (or left out)")
        for field in ("max_line_bytes", "max_body_bytes"):
            if getattr(b.limits, field) < 1024:
                problems.append(f"{p}.limits.{field}: must be at least 1024, got {getattr(b.limits, field)}")
        if b.run is not None:
            problems += _check_run(cfg, p, b)
        if b.kind == "peer" and b.run is not None:
            problems.append(f"{p}.run: a peer runs its own servers (leave run out, or the kind)")
        if b.peer.start_penalty_s < 0:
            problems.append(f"{p}.peer.start_penalty_s: must be 0 or more")
    for rname, amount in cfg.resources.items():
        if amount < 0:
            problems.append(f"resources.{rname}: must be 0 or more, got {amount:g}")
    if cfg.lifecycle.swap_after_s < 0:
        problems.append("lifecycle.swap_after_s: must be 0 or more")
    for name, m in cfg.models.items():
        p = f"models.{name}"
        if m.backend and m.backends:
            problems.append(f"{p}: give either backend or backends, not both")
        names = m.backend_names()
        if not names:
            problems.append(f"{p}.backend: missing (which backend serves this model?)")
        if m.affinity_max_wait_s < 0:
            problems.append(f"{p}.affinity_max_wait_s: must be 0 or more")
        for k, cap in enumerate(m.capabilities or []):
            if cap not in MODEL_CAPABILITIES:
                problems.append(f"{p}.capabilities[{k}]: unknown capability {cap!r} "
                                f"(known: {', '.join(MODEL_CAPABILITIES)})")
        problems += _fim_problems(p, m)
        for i, bname in enumerate(names):
            key = f"{p}.backend" if m.backend else f"{p}.backends[{i}]"
            if bname not in cfg.backends and bname not in raw_backends:
                problems.append(f"{key}: no backend named {bname!r}")
    problems += _fallback_problems(cfg.models)
    dm = cfg.completions.default_model
    if dm is not None and dm not in cfg.models and dm not in cfg.aliases:
        problems.append(f"completions.default_model: no model named {dm!r}")
    peers = any(b.kind == "peer" for b in cfg.backends.values())
    for pattern, target in cfg.aliases.items():
        if target not in cfg.models and not peers:  # with peers: maybe one of theirs, known later
            problems.append(f"aliases.{pattern}: no model named {target!r}")
        if pattern in cfg.models:
            problems.append(f"aliases.{pattern}: shadows the model of the same name")
    seen: set[str] = set()
    for i, k in enumerate(cfg.auth.keys):
        if (k.key is None) == (k.key_env is None):
            problems.append(f"auth.keys[{i}]: give exactly one of key or key_env")
        if k.name in seen:
            problems.append(f"auth.keys[{i}].name: duplicate name {k.name!r}")
        seen.add(k.name)
        if k.max_concurrent is not None and k.max_concurrent < 1:
            problems.append(f"auth.keys[{i}].max_concurrent: must be at least 1")
        if k.budget is not None:
            for field in ("tokens_per_day", "tokens_per_month"):
                v = getattr(k.budget, field)
                if v is not None and v < 1:
                    problems.append(f"auth.keys[{i}].budget.{field}: must be at least 1, got {v}")
    if cfg.cluster is not None:
        if not cfg.cluster.redis_url.startswith(("redis://", "rediss://", "unix://")):
            problems.append(f"cluster.redis_url: {cfg.cluster.redis_url!r} is not a redis URL")
        if cfg.cluster.lease_s <= 0:
            problems.append("cluster.lease_s: must be more than 0")
    if cfg.usage.retention_days < 32:
        # a month's budget is summed from the ledger at start-up: it must hold the whole month
        problems.append(f"usage.retention_days: must be at least 32, got {cfg.usage.retention_days}")
    if not (0 < cfg.usage.flush_interval_s <= 10):
        problems.append("usage.flush_interval_s: must be more than 0 and at most 10")
    if cfg.tracing.otlp_endpoint is not None:
        if urlsplit(cfg.tracing.otlp_endpoint).scheme not in ("http", "https"):
            problems.append(f"tracing.otlp_endpoint: {cfg.tracing.otlp_endpoint!r} is not an http(s) URL")
    if not (0 <= cfg.tracing.sample <= 1):
        problems.append(f"tracing.sample: must be between 0 and 1, got {cfg.tracing.sample:g}")
    if cfg.responses.store.ttl_s <= 0:
        problems.append("responses.store.ttl_s: must be more than 0")
    if cfg.responses.store.max_bytes < 1:
        problems.append("responses.store.max_bytes: must be at least 1")
    for field in ("head_timeout_s", "keepalive_timeout_s"):
        if getattr(cfg.connections, field) <= 0:
            problems.append(f"connections.{field}: must be more than 0")
    if cfg.connections.max_connections < 1:
        problems.append(f"connections.max_connections: must be at least 1, got {cfg.connections.max_connections}")
    if cfg.shutdown_grace_s < 0:
        problems.append("shutdown_grace_s: must be 0 or more")
    return problems


def _check_run(cfg: Config, p: str, b: Backend) -> list[str]:
    """The shape of `run` only: the files a command names need not exist on this machine."""
    assert b.run is not None
    r, p = b.run, f"{p}.run"
    problems: list[str] = []
    try:
        argv = r.argv()
    except ValueError as err:
        problems.append(f"{p}.cmd: cannot split {r.cmd!r} like a shell would: {err}")
        argv = ["?"]
    if not argv or not argv[0]:
        problems.append(f"{p}.cmd: empty (which program runs this backend?)")
    for rname, amount in r.uses.items():
        if rname not in cfg.resources:
            known = ", ".join(sorted(cfg.resources)) or "none declared"
            problems.append(f"{p}.uses.{rname}: no such resource (resources: {known})")
        elif amount < 0:
            problems.append(f"{p}.uses.{rname}: must be 0 or more, got {amount:g}")
        elif amount > cfg.resources[rname]:
            problems.append(f"{p}.uses.{rname}: {amount:g} is more than all of it ({cfg.resources[rname]:g}): "
                            "this backend could never start")
    for field in ("start_timeout_s", "stop_timeout_s", "backoff_s"):
        if getattr(r, field) <= 0:
            problems.append(f"{p}.{field}: must be more than 0")
    if not 0 <= r.kill_grace_s < float("inf"):
        problems.append(f"{p}.kill_grace_s: must be a finite number of seconds, 0 or more")
    if r.idle_ttl_s is not None and r.idle_ttl_s <= 0:
        problems.append(f"{p}.idle_ttl_s: must be more than 0 (or null: never)")
    if r.ready_url is not None:
        parts = urlsplit(r.ready_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(f"{p}.ready_url: {r.ready_url!r} is not an http(s) URL")
    if r.unload == "sleep" and b.kind != "vllm":
        problems.append(f"{p}.unload: sleep is vLLM's sleep mode: it needs `kind: vllm` on the backend "
                        f"(got {b.kind or 'no kind'})")
    if r.sleep_level not in (1, 2):
        problems.append(f"{p}.sleep_level: must be 1 or 2, got {r.sleep_level}")
    if r.cwd is not None and not r.cwd:
        problems.append(f"{p}.cwd: empty (leave it out for the gateway's own)")
    return problems


def load(path: str | os.PathLike) -> Config:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError([f"{path}: cannot read: {err.strerror}"]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError([f"{path}: not valid YAML{where}: {getattr(err, 'problem', err)}"]) from None
    return parse(raw)
