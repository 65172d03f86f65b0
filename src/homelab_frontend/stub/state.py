"""One stub process's configuration and what it has seen: counters, recent requests, event log.

The event log is plain text, one line per event, flushed at once, because tests read it while
the stub runs (`grep -c cancelled` must count exactly the client disconnects, so the word
`cancelled` appears on those lines and nowhere else).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any

from .prefix_cache import PrefixCache
RECENT_REQUESTS = 100


@dataclass(frozen=True)
class StubConfig:
    flavour: str = "vllm"
    host: str = "127.0.0.1"
    port: int = 0
    models: tuple[str, ...] = ()
    reasoning: bool = False
    reasoning_field: str = "reasoning"
    token_delay_ms: int = 0
    max_model_len: int = 4096
    log: str | None = None
    api_key: str | None = None
    agent: bool = False
    # Prefix-cache model (prefix_cache.py): tokens the "GPU" keeps (0: no cache), its block size,
    # and the prefill cost of each uncached prompt token, added to the time to first token.
    prefix_cache_tokens: int = 0
    prefix_block: int = 16
    prefill_us_per_token: int = 0
    # Model lifecycle (a managed backend, lifecycle/): time to "load the model" before serving,
    # and vLLM's sleep mode (POST /sleep, /wake_up; a wake is faster than a cold start).
    start_delay_s: float = 0.0
    sleep_delay_s: float = 0.1
    wake_delay_s: float = 0.3
    # vLLM: the token id reported as `stop_reason` when an answer ends on its own (a stop token of
    # the model's generation config, as Gemma's end of turn 106); None: the tokenizer's own EOS
    # ends it, reported as null (DeepSeek-R1's).
    end_of_turn_id: int | None = None
    # vLLM before 0.17 refused prompt + max_tokens over the context ("'max_tokens' ... is too
    # large"); 0.32 fits max_tokens to the room left and refuses only what can never fit.
    legacy_context_errors: bool = False
    fim: bool = True  # llama.cpp flavour: the model has FIM tokens (/infill); False: Gemma 3's 501
    # llama.cpp flavour: started with --reranking (/rerank answers); False: its 501
    reranking: bool = True
    # whisper.cpp flavour: its --request-path prefix and --inference-path
    request_path: str = ""
    inference_path: str = "/inference"
    # every multipart upload read this slowly: ms waited after each 64 KiB (media.py)
    upload_read_ms: int = 0

    @property
    def reasoning_fields(self) -> tuple[str, ...]:
        if self.reasoning_field == "both":
            return ("reasoning", "reasoning_content")
        return (self.reasoning_field,)


@dataclass
class Stats:
    in_flight: int = 0
    max_in_flight: int = 0
    total: int = 0
    cancelled: int = 0
    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0  # summed over accepted requests
    cached_tokens: int = 0  # of those, served from the prefix cache
    upload_bytes: int = 0  # multipart upload bytes received so far (media.py), counted per read

    def begin(self) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def end(self) -> None:
        self.in_flight -= 1

    def reset(self) -> None:
        # in_flight is a fact about the present, not history: it survives a reset.
        self.max_in_flight = self.in_flight
        self.total = self.cancelled = self.completed = self.failed = 0
        self.prompt_tokens = self.cached_tokens = 0
        self.upload_bytes = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "total": self.total,
            "cancelled": self.cancelled,
            "completed": self.completed,
            "failed": self.failed,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "upload_bytes": self.upload_bytes,
        }


class EventLog:
    def __init__(self, path: str | None) -> None:
        self._file: IO[str] | None = open(path, "w", encoding="utf-8") if path else None

    def write(self, line: str) -> None:
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass
class StubState:
    config: StubConfig
    log: EventLog
    stats: Stats = field(default_factory=Stats)
    requests: deque = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))
    sequence: int = 0
    cache: PrefixCache | None = None  # set by build_app when the config asks for one
    # POST /stub/fail: every chat request fails this way until cleared (the stub's other
    # endpoints, its health probe among them, keep answering): {"status": CODE, "message": TEXT}
    # answers that status; {"reset": true} closes the connection without an answer.
    failing: dict | None = None
    loading: bool = False  # llama.cpp flavour: bound, but the model is still loading (503)
    sleeping: int = 0  # vLLM sleep level, 0: awake

    def record(self, body: Any, headers: Any) -> int:
        self.sequence += 1
        self.stats.total += 1
        flat: dict[str, str] = {}
        for key, value in headers.items():
            key = key.lower()
            flat[key] = f"{flat[key]}, {value}" if key in flat else value
        self.requests.append({"body": body, "headers": flat})
        return self.sequence

    def reset(self) -> None:
        self.stats.reset()
        self.requests.clear()
        if self.cache is not None:
            self.cache.clear()  # a reset starts cold: benches compare runs from the same state
