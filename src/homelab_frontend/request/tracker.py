"""Every request the gateway is working on, queued or in flight: for the admin API, the
dashboard, the access log and graceful shutdown.

The record owns its phase and its outcome. The phase moves only through its methods, each one a
move of phase.py's table (an illegal one raises); how the request ended is recorded by `end`
as a typed `Ending`, and the outcome string is made of that alone (outcome.py)."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any, Iterator

from ..errors import GatewayError
from .outcome import FAILED, OK, STALLED, SUPERSEDED, Cause, Ending
from .phase import Phase, next_phase

# The phases by name, for whoever reads them (phase.py has the table). A request that is
# cancelled records the phase it was in.
QUEUED, LOADING, CONNECTING = Phase.QUEUED, Phase.LOADING, Phase.CONNECTING
FIRST_TOKEN, STREAMING, GENERATING = Phase.FIRST_TOKEN, Phase.STREAMING, Phase.GENERATING
DRAINING = Phase.DRAINING


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


class Tracked:
    __slots__ = (
        "id", "dialect", "model", "backend", "key_name", "_phase", "stream",
        "started", "started_wall", "tokens_out", "task", "cancel_reason",
        "cancel_message", "queue_wait", "ttft", "tokens_in", "status", "_ending", "_outcome", "upstream_headers",
        "clamp",
        "tokens_cached", "affinity", "served_model", "failovers",
        "slot_seconds", "upstream_model", "body_bytes", "trace", "load_wait", "answered", "units",
        "drain", "drained", "client", "endpoint",
    )

    def __init__(self, rid: str, dialect: str, model: str, key_name: str | None, stream: bool):
        self.id = rid
        self.dialect = dialect
        self.model = model
        self.backend: str | None = None
        self.key_name = key_name
        self._phase = Phase.QUEUED
        self.stream = stream
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.tokens_out = 0
        self.task: asyncio.Task[Any] | None = asyncio.current_task()
        self.cancel_reason: str | None = None  # "timeout", "admin", "shutdown", "slot_lost", "superseded": why we cancelled it
        self.cancel_message = ""
        self.queue_wait: float | None = None  # seconds spent waiting for a slot
        self.upstream_headers: float | None = None  # seconds from admission to upstream headers
        self.ttft: float | None = None  # seconds from arrival to the first token written
        self.tokens_in: int | None = None
        self.tokens_cached: int | None = None  # of tokens_in, what the backend's prefix cache held
        self.affinity: str | None = None  # "hit" | "spill" | None (routing.Route.place)
        self.served_model: str | None = None  # the configured model serving it (a fallback's, if one)
        # (backend, cause) of each backend that failed it before answering (request/failover.py)
        self.failovers: list[tuple[str, str]] | None = None
        self.status = 0
        self._ending: Ending | None = None  # set by end(): request/outcome.py has the table
        self._outcome = OK
        # the answer's last frame ([DONE], message_stop, ...) was handed to the client: a client
        # that hangs up after it (the OpenAI SDK closes at [DONE]) got everything, so the end of
        # the gateway's own work (the upstream's last bytes, EOF) is no cancel
        self.answered = False
        # how max_tokens was fitted to the context: None (not needed) | "tokenizer" | "estimate"
        # | "retry" (the backend refused the first try; request/context_clamp.py)
        self.clamp: str | None = None
        # for the usage ledger (usage/record.py) and traces (tracing/)
        self.slot_seconds = 0.0  # seconds a backend slot was held (summed, should it take several)
        self.upstream_model: str | None = None  # the name the backend was asked for
        self.body_bytes: int | None = None  # the request body's size: estimates an unreported prompt
        # tracing.RequestTrace when traces are on and this one is sampled (Any: request sits beside
        # tracing in the import layers and cannot name it; tracing.spans.SpanRecord types the reader)
        self.trace: Any = None
        self.load_wait = 0.0  # of queue_wait, seconds spent waiting for a managed server to start
        # on_client_gone: drain (request/drain.py): the task reading the upstream answer to its end
        # after the client went, and then how that ended ("completed" | "cut"; None: no drain)
        self.drain: asyncio.Task[None] | None = None
        self.drained: str | None = None
        # what a relayed call cost in its own units (surfaces/media/units.py): audio_seconds,
        # characters, documents, images; None for a text generation
        self.units: dict[str, float] | None = None
        # the client's address as believed: the peer's, or what a trusted proxy says (policy/forwarded.py)
        self.client = ""
        # the route it came in on, as the route is written (`/llm/v1/chat/completions`,
        # `/llm/v1beta/models/{model}:generateContent`): a bounded family, never the raw path
        self.endpoint = ""

    # -- the phase: one owner, moved only through phase.py's table ----------------------------

    @property
    def phase(self) -> Phase:
        return self._phase

    def _move(self, to: Phase) -> None:
        self._phase = next_phase(self.id, self._phase, to)

    def queued(self) -> None:
        """Waiting for a slot (again, after a failover), or no longer for a load."""
        self._move(Phase.QUEUED)

    def loading(self) -> None:
        """Waiting in the queue for its managed backend to start (admission/slots.py)."""
        self._move(Phase.LOADING)

    def connecting(self) -> None:
        """The slot is held; waiting for the upstream's response headers."""
        self._move(Phase.CONNECTING)

    def answering(self, stream: bool) -> None:
        """The upstream's headers are in: a stream waits for its first token, a whole answer
        is being generated."""
        self._move(Phase.FIRST_TOKEN if stream else Phase.GENERATING)

    def generating(self) -> None:
        """A whole answer, read from an upstream stream: no first token to report."""
        self._move(Phase.GENERATING)

    def streaming(self) -> None:
        """The first token was written."""
        self._move(Phase.STREAMING)

    def draining(self) -> None:
        """The client left; the upstream answer is read to its end (drain.py)."""
        self._move(Phase.DRAINING)

    # -- the outcome ------------------------------------------------------------------------------

    @property
    def ending(self) -> Ending | None:
        """The cause recorded (None: none yet), the phase it was in, the failure's kind."""
        return self._ending

    @property
    def outcome(self) -> str:
        """How it ended (outcome.py): `ok` until a cause says otherwise."""
        return self._outcome

    def tried(self) -> list[str]:
        """Every backend the request was sent to (or queued for), in order."""
        names = [name for name, _ in self.failovers] if self.failovers else []
        if self.backend is not None:
            names.append(self.backend)
        return names

    def end(self, cause: str, kind: str = "", *, begun: bool = True, override: bool = False) -> None:
        """Record how the request ended (request/outcome.py): the first cause wins, unless
        `override` (a cause that supersedes whatever was provisionally recorded)."""
        if override or self._outcome == OK:
            ending = Ending(Cause(cause), self._phase, kind, begun)
            self._outcome = ending.outcome  # raises for a failure without its kind, before it is kept
            self._ending = ending

    def fail(self, kind: str, *, override: bool = False) -> None:
        self.end(FAILED, kind, override=override)

    def cancel(self, reason: str, message: str = "") -> bool:
        """Cancel the request's task on the gateway's own account (not the client's)."""
        if self.task is None or self.task.done() or self.cancel_reason is not None:
            return False
        self.cancel_reason, self.cancel_message = reason, message
        self.task.cancel()
        return True

    def own_cancel_error(self) -> "GatewayError | None":
        """Inside `except CancelledError`: the error to report when the gateway itself cancelled
        (and the cancellation is then taken back), or None when the client went away."""
        if self.cancel_reason is None:
            return None
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            task.uncancel()
        if self.cancel_reason == "timeout":
            return GatewayError("timeout", self.cancel_message)
        if self.cancel_reason == "client_stalled":
            # the client's doing: counted as its cancel, not as a backend timeout
            self.end(STALLED, override=True)
            return GatewayError("timeout", self.cancel_message)
        if self.cancel_reason == "superseded":  # admission/supersede.py: a newer completion replaced it
            self.end(SUPERSEDED, override=True)
            return GatewayError("invalid_request", self.cancel_message)
        if self.cancel_reason == "shutdown":
            return GatewayError("overloaded", "the gateway is shutting down", status=503, retry_after=5)
        if self.cancel_reason == "slot_lost":  # slots_redis: the shared slot could not be vouched for
            return GatewayError("overloaded", self.cancel_message, status=503, retry_after=2)
        return GatewayError("api_error", "the request was cancelled by the gateway's operator", status=503)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "dialect": self.dialect,
            "model": self.model,
            "backend": self.backend,
            "backends_tried": self.tried(),
            "served_model": self.served_model,
            "key": self.key_name,
            "client": self.client,
            "endpoint": self.endpoint,
            "phase": self._phase.value,
            "stream": self.stream,
            "age_s": round(time.monotonic() - self.started, 3),
            "started": self.started_wall,
            "tokens_out": self.tokens_out,
        }


class Tracker:
    def __init__(self) -> None:
        self._live: dict[str, Tracked] = {}

    def add(self, t: Tracked) -> None:
        self._live[t.id] = t

    def remove(self, t: Tracked) -> None:
        self._live.pop(t.id, None)

    def __iter__(self) -> Iterator[Tracked]:
        return iter(list(self._live.values()))

    def __len__(self) -> int:
        return len(self._live)

    def get(self, rid: str) -> Tracked | None:
        return self._live.get(rid)

    def cancel(self, rid: str, reason: str) -> bool:
        t = self._live.get(rid)
        return t is not None and t.cancel(reason)
