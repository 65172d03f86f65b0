"""YAML config -> typed `Config`. Every default lives here, and every problem is reported with
the key path that holds it (`models.reasoning.backend: no backend named 'gpu9'`)."""

from __future__ import annotations

import difflib
import ipaddress
import os
import shlex
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Mapping, Union, get_args, get_origin
from urllib.parse import SplitResult, urlsplit

import msgspec
import yaml

from . import schema_errors


# Constraints on numbers live on the fields (msgspec checks them, the reference shows them).
Seconds = Annotated[float, msgspec.Meta(gt=0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
AtLeastOne = Annotated[int, msgspec.Meta(ge=1)]


class Listen(msgspec.Struct, forbid_unknown_fields=True):
    """Where the gateway listens (`serve --host/--port` override it)."""

    host: str = "127.0.0.1"
    """The address to bind; anything but loopback without client keys is warned about at start."""
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    """The TCP port (0: any free port)."""


class Queue(msgspec.Struct, forbid_unknown_fields=True):
    """The waiting room in front of a backend's slots (docs/slots.md)."""

    depth: Annotated[int, msgspec.Meta(ge=0)] = 32
    """Waiting requests per backend beyond its slots."""
    timeout_s: NonNegative = 60.0
    """Longest wait for a slot."""


class Timeouts(msgspec.Struct, forbid_unknown_fields=True):
    """How long the gateway waits on a backend, each phase on its own clock."""

    connect_s: Seconds = 5.0
    """TCP connect to the backend."""
    first_token_s: Seconds = 300.0
    """Admission to the first upstream chunk: covers the backend's own queue and a long prefill."""
    idle_s: Seconds = 60.0
    """Longest silence between two upstream chunks of a stream."""
    total_s: Seconds | None = None
    """The whole request; null (off): long generations are legitimate."""
    nonstream_s: Seconds = 600.0
    """A non-streaming upstream call sends nothing until it is done, so neither first_token_s nor idle_s can
    judge it; this bounds it unless total_s is set."""


class ReadLimits(msgspec.Struct, forbid_unknown_fields=True):
    """What the gateway reads from a backend at most: an upstream is untrusted input too."""

    max_line_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 1024 * 1024
    """One SSE line of a stream."""
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 16 * 1024 * 1024
    """A whole non-streaming answer (or error, probe) body."""


BackendKind = Literal["vllm", "ollama", "llamacpp", "openai", "whispercpp", "peer"]
# The relayed endpoints a backend's `paths` may place elsewhere (upstream/backend_kind.py).
MEDIA_ENDPOINTS = ("rerank", "rerank_v2", "score", "transcriptions", "translations", "speech", "voices",
                   "audio_models", "image_generations", "image_edits")


class ClientKeepAlive(msgspec.Struct, forbid_unknown_fields=True):
    """What a client's `keep_alive` (Ollama's, in any dialect's body) may do to a managed backend
    (lifecycle/keep_alive.py)."""

    honour: bool = True
    """False: a client's keep_alive is ignored (idle_ttl_s stands, `keep_alive: 0` unloads nothing)."""
    max_s: NonNegative | None = None
    """The longest idle time a client may ask for (forever, "-1", included); null: no cap."""


class Run(msgspec.Struct, forbid_unknown_fields=True):
    """A managed backend: the gateway starts, stops (or puts to sleep) its server
    (lifecycle/ has the state machine, the swap policy and the process supervisor)."""

    cmd: list[str] | str
    """The server's command line: a list (argv), or a string split like a shell would (never run by a shell)."""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Added to the gateway's environment."""
    cwd: str | None = None
    """The server's working directory; null: the gateway's own."""
    uses: dict[str, NonNegative] = msgspec.field(default_factory=dict)
    """How much of each of `resources` it takes while running."""
    ready_url: str | None = None
    """The URL whose 200 means ready; null: GET <url>/models answering 200 (or the backend's health_path)."""
    start_timeout_s: Seconds = 300.0
    """From spawn to ready; longer is a failed start."""
    idle_ttl_s: Seconds | None = None
    """Stop after this long with no request (from its end); null: never."""
    stop_timeout_s: Seconds = 15.0
    """One SIGTERM, then SIGKILL after this."""
    kill_grace_s: NonNegative = 5.0
    """Should the gateway die (kill -9 included): the tree's one SIGTERM, then SIGKILL after this
    (lifecycle/supervisor.py's DEATH_GRACE_S; vLLM needs ~3 s to unlink its shared memory)."""
    preload: bool = False
    """Start at boot instead of at the first request."""
    unload: Literal["stop", "sleep"] = "stop"
    """How it is unloaded: `stop` the process, or `sleep` (vLLM's POST /sleep and /wake_up; kind vllm)."""
    sleep_level: Annotated[int, msgspec.Meta(ge=1, le=2)] = 1
    """vLLM's sleep level: 1 keeps the weights in CPU memory, 2 drops them."""
    backoff_s: Seconds = 5.0
    """The wait after a failed start; doubles per consecutive failure (to 32x)."""
    client_keep_alive: ClientKeepAlive = msgspec.field(default_factory=ClientKeepAlive)
    """What a client's `keep_alive` may do to this server's idle time (docs/managed-backends.md)."""

    def argv(self) -> list[str]:
        return shlex.split(self.cmd) if isinstance(self.cmd, str) else list(self.cmd)


class Lifecycle(msgspec.Struct, forbid_unknown_fields=True):
    """How managed backends share `resources` (lifecycle/swap_policy.py)."""

    policy: Literal["batch", "fifo"] = "batch"
    """`batch`: serve what is queued for a running backend before swapping it out, but swap at the latest
    once another backend's oldest request has waited swap_after_s. `fifo`: strict arrival order across
    backends (what llama-swap does), for comparison (bench.swap)."""
    swap_after_s: NonNegative = 20.0
    """`batch`: the longest another backend's oldest request waits before a swap."""
    loading_keepalive_s: NonNegative = 5.0
    """A stream waiting for its managed model to load gets its headers at once and a keep-alive frame
    this often (surfaces/loading.py); 0: nothing is sent until the model answers (a refusal stays a status)."""
    loading_note: bool = False
    """Also a visible "loading MODEL" note, where a dialect has a place that stays out of the answer
    (OpenAI Chat's reasoning_content, Ollama's thinking)."""


# -- several boxes (docs/several-boxes.md): a peer is another homelab-frontend used as a backend --


class Peer(msgspec.Struct, forbid_unknown_fields=True):
    """A backend of `kind: peer`: another box's gateway, its url that gateway's `/llm/v1`, its
    `api_key_env` a key of that gateway's (marked `peer: true` there). Its models, their state and
    its slots come from the peer's own `/llm/v1/models`, read every `health_interval_s`."""

    models: list[str] | None = None
    """The peer's models served here under their own names (names or globs); null: all of them. A
    model in `models:` that names this backend is served whatever this says."""
    start_penalty_s: NonNegative = 0.0
    """Loaded first: a model several boxes serve goes where it is loaded while one has a free slot;
    to a box where it must start only when the wait where it is loaded is longer than the start
    there (the peer's own figure) plus this."""


class Backend(msgspec.Struct, forbid_unknown_fields=True):
    """One OpenAI-compatible server (vLLM, Ollama, llama.cpp's llama-server, any other)."""

    url: str
    """Its OpenAI-compatible base URL, ending in /v1 (kinds vllm and ollama require it)."""
    slots: AtLeastOne = 8
    """Sequences it runs at once (vLLM's --max-num-seqs, llama.cpp's --parallel)."""
    api_key_env: str | None = None
    """The environment variable holding the upstream's own key (sent as Bearer); must be set."""
    kind: BackendKind | None = None
    """What the upstream software is: decides which wire extras it understands (vLLM's stop_reason and
    continuous usage stats) and what the gateway must do itself. Left out: detected from the backend's
    /v1/models (upstream/backend_kind.py); vllm until the first probe."""
    max_model_len: int | None = None
    """Its context length; null: read from the backend's /v1/models."""
    queue: Queue = msgspec.field(default_factory=Queue)
    """The waiting room in front of its slots."""
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    """How long to wait on it."""
    limits: ReadLimits = msgspec.field(default_factory=ReadLimits)
    """What is read from it at most."""
    health_interval_s: float = 10.0
    """Seconds between its GET /v1/models probes (never a generation); a probe not answered
    within min(5 s, this) is late, and three late in a row mark the backend down."""
    health_path: str | None = None
    """For a server without GET /v1/models (whisper.cpp's, stable-diffusion.cpp's): the path, from the
    server's root, whose 200 is its health and readiness; null: /v1/models (kind whispercpp: /health)."""
    paths: dict[str, str] = msgspec.field(default_factory=dict)
    """The server's own path (from its root) for a relayed endpoint where it is not OpenAI's, e.g.
    {transcriptions: /inference} for whisper.cpp's --inference-path; keys: rerank, rerank_v2, score,
    transcriptions, translations, speech, voices, audio_models, image_generations, image_edits. Left
    out: the kind's (upstream/backend_kind.py)."""
    run: Run | None = None
    """The gateway runs this backend's server (a managed backend)."""
    on_client_gone: Literal["cancel", "drain"] = "cancel"
    """What a client leaving does to its generation: `cancel` closes the upstream connection (the server
    aborts it); `drain` reads it to its end on its held slot, for a server that must not be aborted
    mid-generation (request/drain.py)."""
    peer: Peer = msgspec.field(default_factory=Peer)
    """Kind peer (docs/several-boxes.md): which of the peer's models are served here, and loaded first."""

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
    """The token before the prefix."""
    suffix: str
    """The token before the suffix."""
    middle: str = ""
    """The token after which the model writes the middle (required for `psm`)."""
    order: Literal["psm", "spm"] = "psm"
    """`psm`: prefix, suffix, middle; `spm`: suffix first (Codestral)."""


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


MODEL_CAPABILITIES = ("completion", "tools", "thinking", "vision", "embedding", "insert", "audio",
                      # the relayed kinds (surfaces/media/): `speech` lists a model (and asks its
                      # backends for voices) in /v1/audio/models and /v1/audio/voices
                      "speech", "transcription", "rerank", "image")
# A model with one of these is a media model: it claims no `completion` (surfaces/model_card.py)
MEDIA_CAPABILITIES = ("rerank", "transcription", "speech", "image")


class Model(msgspec.Struct, forbid_unknown_fields=True):
    """A model clients name, and the backends that serve it."""

    backend: str | None = None
    """The backend that serves it (or `backends`)."""
    backends: list[str] | None = None
    """Several backends that serve it: the least loaded, or the conversation's (`affinity`)."""
    upstream_model: str | None = None
    """The model name sent upstream; null: the client's name."""
    max_model_len: int | None = None
    """Its context length; null: the backends'."""
    system_turns: Literal["merge", "native"] = "merge"
    """System turns after the first non-system message: merged into the neighbouring user/tool message (every
    chat template accepts that), or sent as they are (templates that render them in place, e.g. Qwen2.5,
    Llama 3.1). See upstream/system_turns.py."""
    affinity: bool = True
    """Several backends: keep a conversation's turns on one of them, for its prefix cache
    (policy/affinity.py)."""
    affinity_max_wait_s: NonNegative = 2.0
    """How much longer a turn waits on its conversation's backend than on the least-loaded one."""
    fallback: str | None = None
    """Another model to serve this one's requests when every backend of this one is down (not when they are
    busy: busy waits in the queue). The answer still names the client's model."""
    capabilities: list[str] | None = None
    """What the model can do, for Ollama's /api/show (completion, tools, thinking, vision, embedding, insert,
    audio), when its backends do not say (vLLM never does; Ollama and llama.cpp do, and win). Left out:
    only `completion` is claimed."""
    fim: Fim | str | None = None
    """Code completion (docs/code-completion.md): the model's fill-in-the-middle template, or a preset's name
    (FIM_PRESETS, any case): a completion with a `suffix` is rendered into one prompt with it. Left out: a
    `suffix` goes to a llama.cpp backend's /infill, or is a 400."""
    supersede: bool = False
    """A client's new completion on this model cancels its previous one (queued or generating)."""
    priority: int = 0
    """Queue order between this model's requests and others' on a shared backend: higher first (added to the
    key's priority)."""

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

    tokens_per_day: AtLeastOne | None = None
    """Per UTC day; null: no daily limit."""
    tokens_per_month: AtLeastOne | None = None
    """Per UTC calendar month; null: no monthly limit."""


class AuthKey(msgspec.Struct, forbid_unknown_fields=True):
    """One client key (exactly one of `key_env` and `key`)."""

    name: str
    """Its name in logs, metrics and the ledger (the key itself is never logged)."""
    key_env: str | None = None
    """The environment variable holding the key; must be set."""
    key: str | None = None
    """The key itself, written in the file (discouraged: prefer key_env)."""
    max_concurrent: AtLeastOne | None = None
    """Its requests at once (429 beyond); null: no limit."""
    priority: int = 0
    """Its queue priority: higher goes first."""
    models: list[str] | None = None
    """The client model names or globs it may use; null: all."""
    budget: Budget | None = None
    """Its token budget; null: none."""
    peer: bool = False
    """A front gateway's key (docs/several-boxes.md): its requests may name the person the front
    admitted (x-hlf-on-behalf-of), who is then the one counted, and the backend it holds a slot of."""


class Auth(msgspec.Struct, forbid_unknown_fields=True):
    """Client keys (docs/security.md). None configured: the gateway is open."""

    keys: list[AuthKey] = msgspec.field(default_factory=list)
    """The client keys; empty: anyone who can reach the gateway may use it."""
    admin_key_env: str | None = None
    """The environment variable holding the key of the admin API and metrics; must be set."""


class Limits(msgspec.Struct, forbid_unknown_fields=True):
    """What a client request may be at most (policy/limits.py): larger is a 413 or 400."""

    max_body_bytes: int = 32 * 1024 * 1024
    """A request body."""
    max_json_depth: int = 64
    """Nesting of a JSON body."""
    max_messages: int = 10_000
    """Messages (or input items) in one request."""
    max_tools: int = 512
    """Tools in one request."""
    max_header_bytes: int = 16 * 1024
    """One request header line."""
    max_upload_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 25 * 1024 * 1024
    """An audio or image upload (multipart: transcriptions, translations, image edits), streamed to the
    backend as it arrives: past this, 413 (OpenAI's own limit is 25 MB)."""
    max_form_head_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 1024 * 1024
    """Of an upload, what is kept in memory before the form's `model` is known (surfaces/media/form.py): a
    file sent before the model and larger than this goes to a temporary file on disk."""


class Connections(msgspec.Struct, forbid_unknown_fields=True):
    """Client connection hygiene: a connection that never finishes its request, or sits idle,
    must not hold a file descriptor (and a place under the cap) for an hour."""

    head_timeout_s: Seconds = 15.0
    """From a connection's (or an idle one's next) first byte to a whole request head."""
    keepalive_timeout_s: Seconds = 75.0
    """An idle keep-alive connection is closed after this."""
    max_connections: AtLeastOne = 1000
    """Open client connections; past it the oldest idle one is closed."""
    trusted_proxies: list[str] = msgspec.field(default_factory=list)
    """Reverse proxies in front (addresses or CIDR networks) whose forwarded header names the client
    (policy/forwarded.py; docs/operations.md); nobody's by default, loopback included."""
    forwarded_header: Literal["x-forwarded-for", "forwarded"] = "x-forwarded-for"
    """The header a trusted proxy names the client in: X-Forwarded-For, or RFC 7239's Forwarded."""


class Anthropic(msgspec.Struct, forbid_unknown_fields=True):
    """The Anthropic Messages surface."""

    ping_interval_s: float = 10.0
    """Keep-alive frames while the upstream is silent."""
    signing_key_env: str | None = None
    """The environment variable holding the secret for thinking-block signatures (must be set when given);
    unset: a random one per process (signatures from before a restart then no longer verify, and such
    thinking is dropped from history)."""


class ResponseStore(msgspec.Struct, forbid_unknown_fields=True):
    """Stored Responses (`store: true`, `previous_response_id`)."""

    path: str | None = None
    """SQLite file for stored Responses (`store: true`); default under $XDG_STATE_HOME (or
    ~/.local/state)/homelab-frontend/. With a `cluster:` section they live in its Redis instead."""
    ttl_s: Seconds = 30 * 24 * 3600.0
    """A stored response is forgotten this long after it was made."""
    max_bytes: AtLeastOne = 256 * 1024 * 1024
    """The oldest responses go first beyond this total."""


class Responses(msgspec.Struct, forbid_unknown_fields=True):
    """The OpenAI Responses surface."""

    store: ResponseStore = msgspec.field(default_factory=ResponseStore)
    """Where stored responses are kept."""
    reasoning_as_summary: bool = False
    """`reasoning.summary` asked for: false gives the raw reasoning as `content` (`reasoning_text`) with
    `summary: []`, as vLLM's own Responses server answers; true gives it as the summary instead, for clients
    that read only summaries (docs/responses.md)."""


class Usage(msgspec.Struct, forbid_unknown_fields=True):
    """The usage ledger (usage/): per key x model x hour. SQLite by default, beside the
    Responses store's file; with a `cluster:` section, in its Redis (shared by the replicas)."""

    enabled: bool = True
    """Off: no ledger, no budgets."""
    path: str | None = None
    """The SQLite file; null: $XDG_STATE_HOME (or ~/.local/state)/homelab-frontend/usage.sqlite3."""
    retention_days: Annotated[int, msgspec.Meta(ge=32)] = 400
    """Hourly rows older than this are deleted (a month's budget is summed from them: 32 at least)."""
    flush_interval_s: Annotated[float, msgspec.Meta(gt=0, le=10)] = 0.5
    """Seconds between writes: a crash loses at most this much (plus one write)."""


class Tracing(msgspec.Struct, forbid_unknown_fields=True):
    """OpenTelemetry traces over OTLP/HTTP (tracing/; `pip install homelab-frontend[otel]`).
    Off unless `otlp_endpoint` is set; the standard OTEL_* variables apply on top."""

    otlp_endpoint: str | None = None
    """The OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318/v1/traces; null: no tracing."""
    sample: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0
    """Share of new traces kept (a client's sampled traceparent is always kept)."""
    service_name: str = "homelab-frontend"
    """The traces' service.name."""
    capture_content: bool = False
    """The prompt's last user text as an attribute; off: no prompt text."""


class Completions(msgspec.Struct, forbid_unknown_fields=True):
    """Code completion endpoints (surfaces/completions/)."""

    default_model: str | None = None
    """The model of an /infill request that names none (llama.vscode sends no model)."""


class Cluster(msgspec.Struct, forbid_unknown_fields=True):
    """Several replicas of one gateway sharing slots, stores and managed servers through Redis
    (docs/replicas.md)."""

    redis_url: str
    """A redis://, rediss:// or unix:// URL."""
    lease_s: Seconds = 10.0
    """A replica's leases expire this long after it stops renewing them (it died)."""
    replica_id: str | None = None
    """This replica's name; null: hostname-pid."""


class Config(msgspec.Struct, forbid_unknown_fields=True):
    """The whole file (`serve --config FILE`). Every section may be left out."""

    listen: Listen = msgspec.field(default_factory=Listen)
    """Where the gateway listens."""
    backends: dict[str, Backend] = msgspec.field(default_factory=dict)
    """The upstream servers, by a name of your choice."""
    models: dict[str, Model] = msgspec.field(default_factory=dict)
    """The model names clients send, each onto its backends."""
    aliases: dict[str, str] = msgspec.field(default_factory=dict)
    """Client names or globs (`claude-*`) onto a model above; the first match in order wins."""
    auth: Auth = msgspec.field(default_factory=Auth)
    """Client keys and the admin key."""
    limits: Limits = msgspec.field(default_factory=Limits)
    """What a client request may be at most."""
    connections: Connections = msgspec.field(default_factory=Connections)
    """Client connection hygiene."""
    anthropic: Anthropic = msgspec.field(default_factory=Anthropic)
    """The Anthropic Messages surface."""
    responses: Responses = msgspec.field(default_factory=Responses)
    """The OpenAI Responses surface."""
    cluster: Cluster | None = None
    """Replicas sharing state through Redis; null: one gateway process."""
    usage: Usage = msgspec.field(default_factory=Usage)
    """The usage ledger."""
    tracing: Tracing = msgspec.field(default_factory=Tracing)
    """OpenTelemetry traces."""
    completions: Completions = msgspec.field(default_factory=Completions)
    """Code completion."""
    resources: dict[str, NonNegative] = msgspec.field(default_factory=dict)
    """What managed backends share (e.g. `gpu0: 24` GB), against their `run.uses`."""
    lifecycle: Lifecycle = msgspec.field(default_factory=Lifecycle)
    """How managed backends are swapped."""
    shutdown_grace_s: NonNegative = 30.0
    """SIGTERM: how long in-flight requests may finish."""
    access_log: str | None = None
    """A file for the access log (one JSON line per request); null: stderr."""


class ConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# msgspec's validation errors become key paths and sentences here, read through the one parser of
# their text (schema_errors.py); the schema itself (the struct at the error's path) supplies what
# msgspec's text leaves out: the valid values of an enum, the nearest known key to a misspelt one,
# the offending value, the dict key msgspec writes as `[...]`.


def _alternatives(t: Any) -> tuple[Any, ...]:
    t = get_args(t)[0] if get_origin(t) is Annotated else t  # constraints: msgspec checks them itself
    alts = get_args(t) if get_origin(t) in (Union, UnionType) else (t,)
    return tuple(get_args(a)[0] if get_origin(a) is Annotated else a for a in alts)


def _fails(value: Any, typ: Any) -> bool:
    try:
        msgspec.convert(value, typ, strict=True)
    except msgspec.ValidationError:
        return True
    return False


def _locate(typ: Any, raw: Any, steps: list[str | int | None]) -> tuple[Any, list[str | int], bool, Any]:
    """Follow a msgspec error path through the schema and the raw document together: the type
    there, the path with the dict keys msgspec left out (`[...]`) filled in from the document (the
    first entry that does not convert), and the raw value there (when the document has one)."""
    t, found = typ, True
    path: list[str | int] = []
    for step in steps:
        nxt = None
        for alt in _alternatives(t):
            if isinstance(alt, type) and issubclass(alt, msgspec.Struct) and isinstance(step, str):
                field = next((f for f in msgspec.structs.fields(alt) if f.encode_name == step), None)
                if field is not None:
                    nxt = field.type
            elif get_origin(alt) is dict and not isinstance(step, int):
                nxt = get_args(alt)[1]
                if step is None and found and isinstance(raw, dict):
                    step = next((k for k, v in raw.items() if _fails(v, nxt)), None)
            elif get_origin(alt) is list and isinstance(step, int):
                nxt = get_args(alt)[0]
            if nxt is not None:
                break
        if nxt is None:
            return None, [*path, *(s for s in steps[len(path):] if s is not None)], False, None
        t = nxt
        path.append("?" if step is None else step)
        if found and isinstance(raw, (dict, list)) and step is not None:
            try:
                raw = raw[step]  # type: ignore[index]
            except (KeyError, IndexError, TypeError):
                found = False
        else:
            found = False
    return t, path, found, raw


def _key_path(prefix: str, steps: list[str | int]) -> str:
    out = prefix
    for step in steps:
        out += f"[{step}]" if isinstance(step, int) else f"{'.' if out else ''}{step}"
    return out


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() else f"{value:g}"


def _bound(op: str, bound: str) -> str:
    b = _number(bound)
    if op == ">=":
        return "must be 0 or more" if b == "0" else f"must be at least {b}"
    return {">": f"must be more than {b}", "<=": f"must be at most {b}", "<": f"must be less than {b}"}[op]


def _problem(prefix: str, e: schema_errors.SchemaError, here: Any, steps: list, found: bool, value: Any) -> str:
    where = _key_path(prefix, steps) or "(top)"
    if e.kind == "unknown":
        names = [f.encode_name for alt in _alternatives(here)
                 if isinstance(alt, type) and issubclass(alt, msgspec.Struct) for f in msgspec.structs.fields(alt)]
        near = difflib.get_close_matches(e.field, names, n=1, cutoff=0.6)
        return f"{_key_path(prefix, [*steps, e.field])}: unknown key" + (f" (did you mean {near[0]!r}?)" if near else "")
    if e.kind == "enum":
        values = [v for alt in _alternatives(here) if get_origin(alt) is Literal for v in get_args(alt)]
        valid = f" (valid: {', '.join(str(v) for v in values)})" if values else ""
        return f"{where}: invalid value {e.value}{valid}"
    if e.kind == "expected":
        shown = f" ({_show(value)})" if found else ""
        return f"{where}: expected `{e.want}`, got `{e.got}`{shown}"
    if e.kind == "bound":
        got = f", got {value:g}" if found and isinstance(value, (int, float)) else ""
        return f"{where}: {_bound(e.op, e.bound)}{got}"
    if e.kind == "missing":
        return f"{_key_path(prefix, [*steps, e.field])}: missing (required)"
    return f"{where}: {e.text[0].lower() + e.text[1:] if e.text else 'invalid'}"


def _without(raw: Any, steps: list) -> Any:
    """`raw` with the value at `steps` left out (copied along the path), or None when it cannot be:
    the top, a list item (leaving it out would renumber the ones after it), a key not found."""
    if not steps or not isinstance(steps[-1], str) or not isinstance(raw, dict):
        return None
    head, rest = steps[0], steps[1:]
    if head not in raw:
        return None
    if not rest:
        return {k: v for k, v in raw.items() if k != head}
    inner = raw[head]
    if isinstance(inner, list) and rest and isinstance(rest[0], int) and rest[0] < len(inner):
        item = _without(inner[rest[0]], rest[1:])
        return None if item is None else {**raw, head: [*inner[: rest[0]], item, *inner[rest[0] + 1:]]}
    changed = _without(inner, rest)
    return None if changed is None else {**raw, head: changed}


def _convert(prefix: str, raw: Any, typ: type, problems: list[str]) -> Any:
    """`raw` as `typ`, or None after adding its problems: every one, not only msgspec's first (each
    offending value is left out and the rest converted again, until it converts or nothing more
    can be left out)."""
    dropped: set[tuple] = set()
    found_any = False
    for _ in range(100):
        try:
            got: Any = msgspec.convert(raw, typ, strict=True)  # an instance of typ, whichever it is
            return None if found_any else got
        except msgspec.ValidationError as err:
            e = schema_errors.read(err)
            here, steps, found, value = _locate(typ, raw, e.steps)
            if e.kind == "missing" and tuple([*steps, e.field]) in dropped:
                return None  # a required value left out below: its problem is said already
            problems.append(_problem(prefix, e, here, steps, found, value))
            found_any = True
            target = [*steps, e.field] if e.kind == "unknown" else steps
            if "?" in target or (not found and e.kind != "unknown"):
                return None
            raw = _without(raw, target)
            if raw is None:
                return None
            dropped.add(tuple(target))
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


# Kinds whose OpenAI-compatible API is only under /v1, and whose own endpoints (Ollama's
# /api/show, vLLM's /tokenize and /metrics) the gateway finds by taking /v1 off the URL
# (upstream/client.py). llama.cpp's server answers without /v1 too; `openai` is anyone's.
_UNDER_V1 = {"ollama": "Ollama", "vllm": "vLLM"}


def _check(cfg: Config, raw_backends: dict) -> list[str]:
    problems: list[str] = []
    for name, b in cfg.backends.items():
        p = f"backends.{name}"
        parts = urlsplit(b.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(f"{p}.url: {b.url!r} is not an http(s) URL")
        elif b.kind in _UNDER_V1 and not parts.path.rstrip("/").endswith("/v1"):
            problems.append(f"{p}.url: {b.url!r}: {_UNDER_V1[b.kind]} serves its OpenAI-compatible API under /v1 "
                            f"(did you mean {b.url.rstrip('/')}/v1?)")
        if b.health_path is not None and not b.health_path.startswith("/"):
            problems.append(f"{p}.health_path: {b.health_path!r} must be a path from the server's root, "
                            "starting with /")
        for endpoint, path in b.paths.items():
            if endpoint not in MEDIA_ENDPOINTS:
                problems.append(f"{p}.paths.{endpoint}: no such endpoint (known: {', '.join(MEDIA_ENDPOINTS)})")
            elif not path.startswith("/"):
                problems.append(f"{p}.paths.{endpoint}: {path!r} must be a path from the server's root, starting with /")
        if b.run is not None:
            problems += _check_run(cfg, p, b)
        if b.kind == "peer" and b.run is not None:
            problems.append(f"{p}.run: a peer runs its own servers (leave run out, or the kind)")
    for name, m in cfg.models.items():
        p = f"models.{name}"
        if m.backend and m.backends:
            problems.append(f"{p}: give either backend or backends, not both")
        names = m.backend_names()
        if not names:
            problems.append(f"{p}.backend: missing (which backend serves this model?)")
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
    for i, ak in enumerate(cfg.auth.keys):
        if (ak.key is None) == (ak.key_env is None):
            problems.append(f"auth.keys[{i}]: give exactly one of key or key_env")
        elif ak.key is not None and not ak.key:
            problems.append(f"auth.keys[{i}].key: must not be empty")
        if ak.name in seen:
            problems.append(f"auth.keys[{i}].name: duplicate name {ak.name!r}")
        seen.add(ak.name)
    if cfg.cluster is not None:
        if not cfg.cluster.redis_url.startswith(("redis://", "rediss://", "unix://")):
            problems.append(f"cluster.redis_url: {cfg.cluster.redis_url!r} is not a redis URL")
    if cfg.tracing.otlp_endpoint is not None:
        if urlsplit(cfg.tracing.otlp_endpoint).scheme not in ("http", "https"):
            problems.append(f"tracing.otlp_endpoint: {cfg.tracing.otlp_endpoint!r} is not an http(s) URL")
    for i, entry in enumerate(cfg.connections.trusted_proxies):
        try:
            ipaddress.ip_network(entry.strip(), strict=True)
        except ValueError as err:
            problems.append(f"connections.trusted_proxies[{i}]: {err} (an address, or a network like 10.0.0.0/8)")
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
        elif amount > cfg.resources[rname]:
            problems.append(f"{p}.uses.{rname}: {amount:g} is more than all of it ({cfg.resources[rname]:g}): "
                            "this backend could never start")
    if r.kill_grace_s == float("inf"):  # the bound (0 or more) is the field's own
        problems.append(f"{p}.kill_grace_s: must be a finite number of seconds, 0 or more")
    if r.ready_url is not None:
        parts = urlsplit(r.ready_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(f"{p}.ready_url: {r.ready_url!r} is not an http(s) URL")
    if r.unload == "sleep" and b.kind != "vllm":
        problems.append(f"{p}.unload: sleep is vLLM's sleep mode: it needs `kind: vllm` on the backend "
                        f"(got {b.kind or 'no kind'})")
    if r.cwd is not None and not r.cwd:
        problems.append(f"{p}.cwd: empty (leave it out for the gateway's own)")
    return problems


def _duplicate_keys(node: yaml.Node, path: str, seen: set[int], problems: list[str]) -> None:
    """Every mapping key given twice, at any depth, with its key path and both lines: YAML's
    loader would keep the last one silently, so a setting written twice is a setting lost."""
    if id(node) in seen:  # an alias of an anchor already walked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is None or key == "<<":  # a complex key, or a merge: not a setting
                _duplicate_keys(value_node, path, seen, problems)
                continue
            here = f"{path}.{key}" if path else str(key)
            line = key_node.start_mark.line + 1
            if key in first:
                problems.append(f"{here}: given twice (lines {first[key]} and {line}): "
                                "YAML keeps only the last; remove one")
            else:
                first[key] = line
            _duplicate_keys(value_node, here, seen, problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _duplicate_keys(item, f"{path}[{i}]", seen, problems)


def read(path: str | os.PathLike) -> Any:
    """The YAML document at `path`, refusing a key given twice. Raises ConfigError."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError([f"{path}: cannot read: {err.strerror}"]) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError([f"{path}: not valid YAML{where}: {getattr(err, 'problem', err)}"]) from None
    problems: list[str] = []
    if node is not None:
        _duplicate_keys(node, "", set(), problems)
    if problems:
        raise ConfigError(problems)
    return raw


def environment_problems(cfg: Config, env: Mapping[str, str] | None = None) -> list[str]:
    """The environment variables the config names that are not set. `serve` (at start and on
    every reload) and `check` both ask this, so `check` passes exactly what `serve` runs."""
    env = os.environ if env is None else env
    problems = auth_environment_problems(cfg.auth, env)
    for name, b in cfg.backends.items():
        if b.api_key_env and not env.get(b.api_key_env):
            problems.append(f"backends.{name}.api_key_env: environment variable {b.api_key_env!r} is not set")
    sk = cfg.anthropic.signing_key_env
    if sk and not env.get(sk):
        problems.append(f"anthropic.signing_key_env: environment variable {sk!r} is not set "
                        "(leave the key out for a random secret per process)")
    return problems


def auth_environment_problems(auth: Auth, env: Mapping[str, str]) -> list[str]:
    problems = []
    for i, k in enumerate(auth.keys):
        if k.key is None and k.key_env and not env.get(k.key_env):
            problems.append(f"auth.keys[{i}].key_env: environment variable {k.key_env!r} is not set")
    if auth.admin_key_env and not env.get(auth.admin_key_env):
        problems.append(f"auth.admin_key_env: environment variable {auth.admin_key_env!r} is not set")
    return problems


def _port(parts: SplitResult) -> int | None:
    try:
        return parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # not a port number: the URL check says so
        return None


def _same_server(url: str) -> tuple[str, str, int | None, str]:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    host = "127.0.0.1" if host == "localhost" else host
    return parts.scheme, host, _port(parts), parts.path.rstrip("/")


def warnings(cfg: Config) -> list[str]:
    """What `serve` runs but is probably a mistake: `check` prints these (and exits 1), `serve`
    logs them at start and on reload. Two backends on one URL are one server whose slots the
    gateway counts twice, unless each is meant to hold a share of the server's slots. A backend of
    no stated kind on Ollama's port without /v1 is probably Ollama (with `kind: ollama` it is an error)."""
    found: list[str] = []
    first: dict[tuple, str] = {}
    for name, b in cfg.backends.items():
        key = _same_server(b.url)
        if key in first:
            other = cfg.backends[first[key]]
            found.append(f"backends.{name}.url: the same server as backends.{first[key]} ({b.url}): its slots are "
                         f"counted twice ({other.slots} + {b.slots}); fine only if the server runs "
                         f"{other.slots + b.slots} sequences at once")
        else:
            first[key] = name
        parts = urlsplit(b.url)
        if b.kind is None and _port(parts) == 11434 and not parts.path.rstrip("/").endswith("/v1"):
            found.append(f"backends.{name}.url: {b.url!r} is Ollama's port, and Ollama serves its OpenAI-compatible "
                         f"API under /v1 (did you mean {b.url.rstrip('/')}/v1?)")
    return found


def load(path: str | os.PathLike) -> Config:
    """The file's config, validated (not the environment: environment_problems). Raises ConfigError."""
    return parse(read(path))
