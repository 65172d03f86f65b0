"""The Anthropic Messages SSE encoder: canonical events in, SSE frames out. One state machine, no I/O.

Theory of operation
===================
Modelled on h11: this module owns the whole grammar of an Anthropic streaming answer and nothing
else. The caller (the I/O layer) feeds it canonical events as they arrive and writes the bytes it
returns straight to the client; the encoder never touches a socket, a clock or a task.

    enc = AnthropicStreamEncoder(message_id="msg_...", model=request.model, signer=signer)
    for event in events:                  # from ChunkDecoder (optionally through a StopMatcher)
        write(enc.feed(event))            # zero or more complete frames, at once (unbuffered)
    write(enc.finish())                   # upstream ended normally
    # or, on failure after the headers were sent:  write(enc.fail("api_error", "..."))
    # and while waiting for the upstream:          write(enc.ping())

A frame is `event: <name>\\ndata: <json>\\n\\n`, the JSON's `type` equal to `<name>`, one msgspec
encode per frame. The grammar of a whole answer is

    message_start (content_block_start content_block_delta+ content_block_stop)* message_delta message_stop

or, after a failure, `... error` and nothing more; `ping` may appear anywhere after message_start.

States and transitions
----------------------
States: IDLE (nothing sent), MESSAGE (message_start sent, no block open), THINKING / TEXT / TOOL
(that kind of block open), ENDED (message_stop or error sent). Only one block is ever open.

Content events, per state (`_TRANSITIONS` below is this table, and the code dispatches on it):

    state \\ event   ReasoningDelta     TextDelta           ToolCallStart      ToolArgsDelta(i)
    MESSAGE         open thinking      open text           open tool_use      drop
    THINKING        delta              close, open text    close, open tool   drop
    TEXT            close, open think  delta               close, open tool   drop
    TOOL(j)         close, open think  close, open text    close, open tool   delta if i == j, else drop

    open X  = content_block_start at the next index (0, 1, 2, ... in emission order, no gaps),
              then the first delta.
    close   = content_block_stop of the open block; a thinking block is first given its
              signature_delta, a tool_use block that got no arguments at all an empty
              input_json_delta (as Anthropic itself sends), so every block has >= 1 delta.

Every other event:

    any event in IDLE     -> message_start first (lazily: a leading Usage event's input_tokens is
                             in it), then as above. (UpstreamError in IDLE: see fail().)
    Usage                 -> remember the counts; no frame.
    Finish                -> remember stop_reason / stop_sequence (the first Finish wins); no frame.
    UpstreamError(kind,m) -> fail(kind, m).
    finish()              -> [message_start if IDLE], close the open block, message_delta,
                             message_stop; ENDED.
    fail(type, message)   -> one `error` frame (no block is closed, no message_stop); ENDED.
    ping()                -> [message_start if IDLE], ping.
    anything in ENDED     -> b"" (nothing is ever emitted after message_stop or error).

Choices (and why)
-----------------
* Empty deltas ("" text, reasoning or arguments) never open a block and emit nothing.
* Reasoning after text or a tool opens a NEW thinking block; text after a tool a new text block;
  each ToolCallStart a new tool_use block (closing the previous one).
* Whitespace after a tool call that vLLM streams before the call's last argument bytes (vllm PR
  #45287) is the chunk decoder's to hold (upstream/decode.py): here text after a tool_use block
  closes it like any other.
* Arguments for a tool call whose block is no longer open (true interleaving of two calls'
  arguments, which none of vLLM / Ollama / llama.cpp send: they stream calls one after another)
  cannot be expressed in the Anthropic grammar: they are dropped and counted in
  `dropped_tool_args` so the I/O layer can log it. Arguments for an index never started likewise.
* Thinking signatures: `signer.begin()` at block open, `mac.update()` with each thinking delta
  (the text is never accumulated), `signature_delta` with `signer.finish(mac)` right before the
  block's content_block_stop. With `hide_reasoning` (the client sent thinking.display "omitted")
  a thinking block gets no thinking_delta at all: its text is kept (one generation's worth) and
  sealed into the signature (`signer.seal`), which is how it goes back upstream next turn.
* Tool ids: the upstream id is passed through when it is a valid Anthropic id
  (`^[A-Za-z0-9_-]{1,128}$`: vLLM's `chatcmpl-tool-...`, Ollama's `call_...` are), because the
  upstream model's chat template may check the ids it generated when the history comes back
  (Mistral templates require their own 9-char ids); clients only echo ids back. Otherwise (none,
  invalid characters, or an id already used in this message: tool_result pairing needs unique
  ids) a fresh `toolu_<24 base62>` is generated (rules.py, shared with assemble.py).
* input_tokens (Anthropic meaning: uncached prompt tokens) = prompt_tokens - cached tokens when the
  upstream reported cached tokens, else prompt_tokens. `cache_read_input_tokens` is sent only
  when the upstream reported a cached count; `cache_creation_input_tokens` never (we would have to
  invent it). When the prompt count is unknown at message_start (Ollama reports usage only at the
  end; vLLM with continuous_usage_stats reports it on the first chunk, which is why message_start
  is lazy), message_start carries the constructor's `input_tokens` (a figure the caller may
  have, e.g. from a tokenizer; or a function giving it, asked at message_start: a count that
  runs beside the upstream call) or else 0, since the field is required by the schema; the real
  value then goes into message_delta.usage.input_tokens, which the SDK accumulator takes
  (it overwrites input_tokens when present).
* message_delta.usage always has output_tokens (0 if the upstream never reported it: the field is
  required), plus input_tokens / cache_read_input_tokens when known.
* stop_reason: stop -> end_turn, length -> max_tokens, tool_calls -> tool_use,
  stop_sequence -> stop_sequence (+ the string), content_filter -> refusal. finish() without any
  Finish event -> end_turn (the upstream ended its stream cleanly; the I/O layer calls fail()
  when it did not).
* ping() before message_start emits message_start first: Anthropic's own streams begin with
  message_start and strict clients assume it. (So an I/O layer that pings while waiting for the
  first chunk gives up the lazy input_tokens; pass an estimate to the constructor.)
* fail() before anything was sent emits only the `error` frame (no message_start): the client
  SDKs raise on it as on an HTTP error. The I/O layer should prefer a real HTTP error status when
  it has not sent the response headers yet (see `started`).
* An answer with no content at all (upstream sent only [DONE]) is message_start, message_delta,
  message_stop, with no block (content: []), which the Anthropic API itself sometimes returns.
"""

from __future__ import annotations

import hmac
from typing import Callable, Union

import msgspec

from ...canonical import (
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolArgsDelta,
    ToolCallStart,
    UpstreamError,
    Usage,
    NO_USAGE,
)
from ..signature import ThinkingSigner
from .rules import STOP_REASONS, new_tool_use_id, tool_use_id

__all__ = ["AnthropicStreamEncoder", "STOP_REASONS"]

# ---------------------------------------------------------------------------------------------
# Wire shapes of the frames (encoded with msgspec; the `type` tag is written first)
# ---------------------------------------------------------------------------------------------


class _StartUsage(msgspec.Struct, omit_defaults=True):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: Union[int, None] = None


class _Message(msgspec.Struct, kw_only=True):  # fields in Anthropic's order
    id: str
    type: str = "message"
    role: str = "assistant"
    content: list = []
    model: str
    stop_reason: None = None
    stop_sequence: None = None
    usage: _StartUsage


class _MessageStart(msgspec.Struct, tag="message_start"):
    message: _Message


class _TextBlock(msgspec.Struct, tag="text"):
    text: str = ""


class _ThinkingBlock(msgspec.Struct, tag="thinking"):
    thinking: str = ""
    signature: str = ""


class _ToolUseBlock(msgspec.Struct, tag="tool_use"):
    id: str
    name: str
    input: dict = {}


class _BlockStart(msgspec.Struct, tag="content_block_start"):
    index: int
    content_block: Union[_TextBlock, _ThinkingBlock, _ToolUseBlock]


class _TextDelta(msgspec.Struct, tag="text_delta"):
    text: str


class _ThinkingDelta(msgspec.Struct, tag="thinking_delta"):
    thinking: str


class _SignatureDelta(msgspec.Struct, tag="signature_delta"):
    signature: str


class _InputJsonDelta(msgspec.Struct, tag="input_json_delta"):
    partial_json: str


class _BlockDelta(msgspec.Struct, tag="content_block_delta"):
    index: int
    delta: Union[_TextDelta, _ThinkingDelta, _SignatureDelta, _InputJsonDelta]


class _BlockStop(msgspec.Struct, tag="content_block_stop"):
    index: int


class _StopInfo(msgspec.Struct):
    stop_reason: str
    stop_sequence: Union[str, None] = None


class _DeltaUsage(msgspec.Struct, omit_defaults=True):
    output_tokens: int
    input_tokens: Union[int, None] = None
    cache_read_input_tokens: Union[int, None] = None


class _MessageDelta(msgspec.Struct, tag="message_delta"):
    delta: _StopInfo
    usage: _DeltaUsage


class _ErrorBody(msgspec.Struct):
    type: str
    message: str


class _Error(msgspec.Struct, tag="error"):
    error: _ErrorBody


_encode = msgspec.json.Encoder().encode

_MESSAGE_START = b"event: message_start\ndata: "
_BLOCK_START = b"event: content_block_start\ndata: "
_BLOCK_DELTA = b"event: content_block_delta\ndata: "
_BLOCK_STOP = b"event: content_block_stop\ndata: "
_MESSAGE_DELTA = b"event: message_delta\ndata: "
_ERROR = b"event: error\ndata: "
_END = b"\n\n"
_MESSAGE_STOP_FRAME = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
_PING_FRAME = b'event: ping\ndata: {"type":"ping"}\n\n'

_TEXT_BLOCK = _TextBlock()
# content_block_delta frames spelled out (see `_delta`); tests/unit/surfaces/anthropic/test_hot_path.py holds them
# byte for byte to what encoding a _BlockDelta gives
_DELTA_HEAD = _BLOCK_DELTA + b'{"type":"content_block_delta","index":'
_DELTA_TAIL = b"}}" + _END
_THINKING_BLOCK = _ThinkingBlock()

# ---------------------------------------------------------------------------------------------
# The state machine
# ---------------------------------------------------------------------------------------------

# States (compared by identity: `state` only ever holds these objects)
IDLE = "IDLE"
MESSAGE = "MESSAGE"
THINKING = "THINKING"
TEXT = "TEXT"
TOOL = "TOOL"
ENDED = "ENDED"

_DELTA_KIND = {
    TEXT: b',"delta":{"type":"text_delta","text":',
    THINKING: b',"delta":{"type":"thinking_delta","thinking":',
    TOOL: b',"delta":{"type":"input_json_delta","partial_json":',
}

# Actions for content events
OPEN = "open"  # no block open: open one for this event
DELTA = "delta"  # the open block takes this event
SWITCH = "switch"  # close the open block, open one for this event
DROP = "drop"  # not expressible: dropped (ToolArgsDelta only)
ARGS = "args"  # ToolArgsDelta in a tool block: delta if it is the open call's, else drop

_TRANSITIONS: dict[tuple[str, type], str] = {
    # state      event              action
    (MESSAGE, ReasoningDelta): OPEN,
    (MESSAGE, TextDelta): OPEN,
    (MESSAGE, ToolCallStart): OPEN,
    (MESSAGE, ToolArgsDelta): DROP,
    (THINKING, ReasoningDelta): DELTA,
    (THINKING, TextDelta): SWITCH,
    (THINKING, ToolCallStart): SWITCH,
    (THINKING, ToolArgsDelta): DROP,
    (TEXT, ReasoningDelta): SWITCH,
    (TEXT, TextDelta): DELTA,
    (TEXT, ToolCallStart): SWITCH,
    (TEXT, ToolArgsDelta): DROP,
    (TOOL, ReasoningDelta): SWITCH,
    (TOOL, TextDelta): SWITCH,
    (TOOL, ToolCallStart): SWITCH,
    (TOOL, ToolArgsDelta): ARGS,
}

# The block each content event lives in
_BLOCK_FOR = {ReasoningDelta: THINKING, TextDelta: TEXT, ToolCallStart: TOOL, ToolArgsDelta: TOOL}


def _uncached(prompt: int, cached: int | None) -> int:
    """Anthropic's input_tokens: the prompt tokens the cache did not serve."""
    return prompt - cached if cached is not None and cached <= prompt else prompt


class AnthropicStreamEncoder:
    """Encodes one answer as Anthropic SSE. See the module docstring for the grammar and choices.

    Constructor: `message_id` (`msg_...`), `model` (the name the client sent, echoed),
    `signer` (thinking signatures), `input_tokens` (optional prompt-token figure for
    message_start when no Usage event precedes the first content, or a function that gives it
    when message_start is written), `new_tool_id` (optional
    factory for generated tool ids, for tests).
    Readable state: `state`, `started`, `ended`, `failed`, `stop_reason` / `stop_sequence`
    (Anthropic values; None until a Finish or finish()), `prompt_tokens` / `output_tokens` /
    `cached_input_tokens` (as reported upstream, None if never), `input_tokens` (Anthropic
    meaning), `block_count`, `dropped_tool_args`.
    """

    __slots__ = (
        "message_id",
        "model",
        "state",
        "stop_reason",
        "stop_sequence",
        "usage",
        "failed",
        "dropped_tool_args",
        "_signer",
        "_new_tool_id",
        "_estimated_input",
        "_finish_seen",
        "_index",
        "_mac",
        "_hide",
        "_hidden",
        "_tool_index",
        "_tool_has_args",
        "_tool_ids",
        "_delta_head",
    )

    def __init__(
        self,
        *,
        message_id: str,
        model: str,
        signer: ThinkingSigner,
        input_tokens: int | Callable[[], int] | None = None,
        new_tool_id: Callable[[], str] = new_tool_use_id,
        hide_reasoning: bool = False,
    ) -> None:
        self.message_id = message_id
        self.model = model
        self.state = IDLE
        self.stop_reason: str | None = None  # Anthropic stop_reason once a Finish arrived
        self.stop_sequence: str | None = None
        self.usage = NO_USAGE
        self.failed = False
        self.dropped_tool_args = 0
        self._signer = signer
        self._new_tool_id = new_tool_id
        self._estimated_input = input_tokens
        self._finish_seen = False
        self._index = -1  # index of the last block opened
        self._mac: hmac.HMAC | None = None  # the open thinking block's MAC
        self._hide = hide_reasoning
        self._hidden: list[str] = []  # the open thinking block's text, when it is not shown
        self._tool_index = -1  # canonical index of the open tool call
        self._tool_has_args = False
        self._tool_ids: set[str] = set()  # ids used in this message (they must be unique)
        self._delta_head = b""  # the open block's delta frame up to its payload string

    # -- public state ------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Something was emitted (message_start or an error frame)."""
        return self.state is not IDLE

    @property
    def ended(self) -> bool:
        return self.state is ENDED

    @property
    def input_tokens(self) -> int | None:
        """Anthropic's input_tokens: uncached prompt tokens; None if unknown."""
        p = self.prompt_tokens
        return None if p is None else _uncached(p, self.cached_input_tokens)

    # the upstream's counts so far (canonical.Usage.over folds each report in)
    @property
    def prompt_tokens(self) -> int | None:  # as the upstream reported (cached included)
        return self.usage.input_tokens

    @property
    def output_tokens(self) -> int | None:
        return self.usage.output_tokens

    @property
    def cached_input_tokens(self) -> int | None:
        return self.usage.cached_input_tokens

    @property
    def block_count(self) -> int:
        return self._index + 1

    # -- the API -----------------------------------------------------------------------------

    def feed(self, event: Event) -> bytes:
        state = self.state
        if type(event) is TextDelta and state is TEXT:  # the hot path: the open text block's delta
            return self._delta(event.text) if event.text else b""
        if state is ENDED:
            return b""
        kind = type(event)
        if type(event) is Usage:
            self.usage = event.over(self.usage)
            return self._message_start() if state is IDLE else b""
        if type(event) is UpstreamError:
            return self.fail(event.kind, event.message)
        head = b""
        if state is IDLE:
            head = self._message_start()
            state = MESSAGE
        if type(event) is Finish:
            if not self._finish_seen:
                self._finish_seen = True
                self.stop_reason = STOP_REASONS.get(event.reason, "end_turn")
                self.stop_sequence = event.stop_sequence if event.reason == "stop_sequence" else None
            return head
        # a content event
        call = None
        if type(event) is ToolCallStart:
            call = event
            payload = ""
        else:
            payload = event.fragment if type(event) is ToolArgsDelta else event.text
            if not payload:
                return head
        action = _TRANSITIONS[(state, kind)]
        if action is DELTA:
            return head + self._delta(payload)
        if action is ARGS:
            if type(event) is ToolArgsDelta and event.index == self._tool_index:
                self._tool_has_args = True
                return head + self._delta(payload)
            self.dropped_tool_args += 1
            return head
        if action is DROP:
            self.dropped_tool_args += 1
            return head
        # OPEN or SWITCH
        out = head + self._close() if action is not OPEN else head
        return out + self._open(_BLOCK_FOR[kind], call, payload)

    def finish(self) -> bytes:
        """The upstream ended normally: close the open block, message_delta, message_stop."""
        if self.state is ENDED:
            return b""
        out = self._message_start() if self.state is IDLE else b""
        out += self._close()
        if self.stop_reason is None:
            self.stop_reason = "end_turn"
        usage = _DeltaUsage(self.output_tokens or 0, self.input_tokens, self.cached_input_tokens)
        out += (
            _MESSAGE_DELTA
            + _encode(_MessageDelta(_StopInfo(self.stop_reason, self.stop_sequence), usage))
            + _END
            + _MESSAGE_STOP_FRAME
        )
        self.state = ENDED
        return out

    def fail(self, error_type: str, message: str) -> bytes:
        """The answer failed: one `error` frame, then the stream is over (no message_stop)."""
        if self.state is ENDED:
            return b""
        self.state = ENDED
        self.failed = True
        return _ERROR + _encode(_Error(_ErrorBody(error_type, message))) + _END

    def ping(self) -> bytes:
        if self.state is ENDED:
            return b""
        out = self._message_start() if self.state is IDLE else b""
        return out + _PING_FRAME

    # -- internals ---------------------------------------------------------------------------

    def _message_start(self) -> bytes:
        self.state = MESSAGE
        prompt = self.prompt_tokens
        cached = self.cached_input_tokens
        if prompt is None:
            est = self._estimated_input
            if callable(est):
                est = est()
            input_tokens = est if est is not None else 0
        else:
            input_tokens = _uncached(prompt, cached)
        usage = _StartUsage(input_tokens, self.output_tokens or 0, cached)
        message = _Message(id=self.message_id, model=self.model, usage=usage)
        return _MESSAGE_START + _encode(_MessageStart(message)) + _END

    def _delta(self, payload: str) -> bytes:
        # The hot path (one call per streamed token): the frame is the open block's fixed head,
        # the payload as a JSON string, and a fixed tail; the same bytes as encoding a
        # _BlockDelta, without building two structs per token.
        if self.state is THINKING:
            if self._hide:
                self._hidden.append(payload)
                return b""
            assert self._mac is not None  # opened with the block (_open), unless hidden
            self._mac.update(payload.encode())
        return self._delta_head + _encode(payload) + _DELTA_TAIL

    def _open(self, block: str, call: ToolCallStart | None, payload: str) -> bytes:
        """Open a block of kind `block` (a TOOL block for `call`), with `payload` ("" for a
        tool call: its arguments follow as deltas) as its first delta."""
        self._index += 1
        self.state = block
        self._delta_head = b"%s%d%s" % (_DELTA_HEAD, self._index, _DELTA_KIND[block])
        cb: _TextBlock | _ThinkingBlock | _ToolUseBlock
        if call is not None:
            tool_id = tool_use_id(call.id, self._tool_ids, self._new_tool_id)
            cb = _ToolUseBlock(tool_id, call.name)
            self._tool_index = call.index
            self._tool_has_args = False
        elif block is TEXT:
            cb = _TEXT_BLOCK
        else:
            cb = _THINKING_BLOCK
            self._mac = self._signer.begin()
        out = _BLOCK_START + _encode(_BlockStart(self._index, cb)) + _END
        if call is None:
            out += self._delta(payload)
        return out

    def _close(self) -> bytes:
        state = self.state
        if state is MESSAGE:
            return b""
        out = b""
        if state is THINKING:
            if self._hide:
                sig = _SignatureDelta(self._signer.seal("".join(self._hidden)))
                self._hidden = []
            else:
                assert self._mac is not None  # opened with the block (_open)
                sig = _SignatureDelta(self._signer.finish(self._mac))
            self._mac = None
            out = _BLOCK_DELTA + _encode(_BlockDelta(self._index, sig)) + _END
        elif state is TOOL:
            self._tool_index = -1
            if not self._tool_has_args:
                out = _BLOCK_DELTA + _encode(_BlockDelta(self._index, _InputJsonDelta(""))) + _END
        self.state = MESSAGE
        return out + _BLOCK_STOP + _encode(_BlockStop(self._index)) + _END
