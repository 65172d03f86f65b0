"""The one usage fold: how an answer's token counts reach the request record, in every dialect.

The record (`request.tracker.Tracked`: `tokens_in`, `tokens_out`, `tokens_cached`) is what the
access log, the metrics and /admin show, also for an answer that never ends normally (the client
leaving, a timeout, an upstream failing mid-stream), so it is kept current chunk by chunk, not
filled in at the end. The rules, per upstream chunk:

* a usage report sets each count it carries (a count it leaves out keeps its value: upstreams
  report more than once, vLLM's continuous usage on every chunk, then a usage-only last chunk);
* its output count covers the tokens of the chunk it rides on (vLLM counts the token before it
  sends the chunk): those are not counted again;
* a chunk with no output count adds one per generated delta (text, reasoning, tool arguments), the
  gateway's own running count until the upstream's next report replaces it;
* the first chunk that generates anything (a tool call's start included) is the first token
  (`Exchange.first_token`: phase `streaming`, time to first token), when one is awaited: a client
  waiting for a whole answer has none.

A whole answer read in one piece (`whole`) takes only its usage: there a delta is the whole
message, not a token.
"""

from __future__ import annotations

from .. import canonical as c
from ..request.exchange import Exchange
from ..request.tracker import Tracked

GENERATED = (c.TextDelta, c.ReasoningDelta, c.ToolArgsDelta)  # one token each, as the gateway counts
_Usage = c.Usage
_ToolCallStart = c.ToolCallStart


class UsageFold:
    """Folds one answer's counts into its record. `first`: whether a first token is awaited."""

    __slots__ = ("t", "ex", "first")

    def __init__(self, t: Tracked, ex: Exchange, *, first: bool = True) -> None:
        self.t = t
        self.ex = ex
        self.first = first

    def chunk(self, events: list[c.Event]) -> bool:
        """The canonical events of one upstream chunk. -> True if they hold the first token."""
        usage: c.Event | None = None
        n = 0
        started = False
        for ev in events:
            kind = type(ev)
            if kind in GENERATED:
                n += 1
            elif kind is _Usage:
                usage = ev
            elif kind is _ToolCallStart:
                started = True
        if type(usage) is _Usage:
            return self.add(usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, n, started)
        return self.add(None, None, None, n, started)

    def add(self, input_tokens: int | None, output_tokens: int | None, cached: int | None,
            generated: int, started: bool = False) -> bool:
        """One chunk in counts: the upstream's report (None: not reported) and the deltas it
        generated. -> True if it holds the first token. The one place the rules above are
        written: `chunk`, `whole` and the OpenAI relay (which decodes no events) all come here."""
        t = self.t
        if input_tokens is not None:
            t.tokens_in = input_tokens
        if cached is not None:
            t.tokens_cached = cached
        if output_tokens is not None:
            t.tokens_out = output_tokens  # this chunk's own tokens included
        elif generated:
            t.tokens_out += generated
        if self.first and (generated or started):
            self.first = False
            self.ex.first_token()
            return True
        return False

    def whole(self, events: list[c.Event]) -> None:
        """A whole answer's events: only its usage counts."""
        for ev in events:
            if type(ev) is _Usage:
                self.add(ev.input_tokens, ev.output_tokens, ev.cached_input_tokens, 0)
