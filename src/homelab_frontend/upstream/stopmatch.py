"""Gateway-side stop sequences (sans-I/O), for upstreams that do not say which stop string fired.

vLLM reports the matched string itself (`choices[].stop_reason`, see `upstream/decode.py`);
Ollama and llama.cpp only say "stop". For those the caller does NOT pass the client's stop strings
upstream (the upstream would strip the string and we could not tell which one fired, or whether
one fired at all); instead it runs the canonical event stream through a `StopMatcher`:

    matcher = StopMatcher(request.stop)
    for event in decoder.feed(payload):
        for out in matcher.feed(event):
            ...encode out...
        if matcher.matched is not None:
            ...cancel the upstream; keep feeding only Usage events if any arrive...

Semantics
---------
* Matching is on the answer text (`TextDelta`) only, not on reasoning or tool arguments.
* The text is cut at the FIRST occurrence of any stop string (the smallest start position);
  when several stop strings start there (one is then a prefix of the other) the shortest wins.
  The result is independent of how the text was split into deltas.
* Hold-back: only a tail of the text that could still become (or precede) a match is held: at
  most `max(len(stop)) - 1` characters, usually none. Text that can no longer be part of a match
  is emitted at once.
* On a match: the text before it, then `Finish("stop_sequence", stop_sequence=s)`; `.matched = s`.
  From then on only `Usage` events pass (the upstream may still report counts); everything else
  is dropped.
* Any other event (reasoning, tool call start / arguments, finish, error) first flushes the held
  text (resolving it as if the text ended there: a complete stop string inside it still matches),
  so the order of events is preserved. A stop string cannot span such an event. `Usage` passes
  through without flushing (it carries no position).
* Empty stop strings are ignored; an empty TextDelta yields nothing; no empty TextDelta is ever
  emitted.
"""

from __future__ import annotations

from ..canonical import Event, Finish, TextDelta, Usage

__all__ = ["StopMatcher"]


class StopMatcher:
    __slots__ = ("matched", "_stops", "_max", "_held")

    def __init__(self, stops: list[str]) -> None:
        self._stops = sorted({s for s in stops if s}, key=len)  # shortest first: ties go to it
        self._max = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.matched: str | None = None

    @property
    def held(self) -> str:
        """The text currently held back (for tests and diagnostics)."""
        return self._held

    def feed(self, event: Event) -> list[Event]:
        if self.matched is not None:
            return [event] if type(event) is Usage else []
        if type(event) is TextDelta:
            if not self._stops:
                return [event] if event.text else []
            return self._text(self._held + event.text, final=False)
        if type(event) is Usage:
            return [event]
        if not self._held:
            return [event]
        out = self._text(self._held, final=True)
        if self.matched is None:
            out.append(event)
        return out

    # -- internals ---------------------------------------------------------------------------

    def _text(self, buf: str, *, final: bool) -> list[Event]:
        """Emit what is decided in `buf`; hold the undecided tail (nothing if `final`)."""
        best_pos = -1
        best: str | None = None
        for s in self._stops:  # shortest first, so `<` keeps the shortest at a tie
            p = buf.find(s)
            if p != -1 and (best_pos == -1 or p < best_pos):
                best_pos, best = p, s
        hold_from = len(buf)
        if not final:
            # The earliest position where a stop string could still start (its beginning is the
            # end of `buf`). A candidate before a complete match must be resolved first.
            limit = best_pos if best_pos != -1 else len(buf)
            for q in range(max(0, len(buf) - self._max + 1), limit):
                tail = buf[q:]
                n = len(tail)
                if any(len(s) > n and s.startswith(tail) for s in self._stops):
                    hold_from = q
                    break
        if best is not None and hold_from >= best_pos:
            self.matched = best
            self._held = ""
            head = buf[:best_pos]
            out: list[Event] = [TextDelta(head)] if head else []
            out.append(Finish("stop_sequence", best))
            return out
        self._held = buf[hold_from:]
        head = buf[:hold_from]
        return [TextDelta(head)] if head else []
