"""The stub's stop filter (stub/timeline.py) keeps only a bounded tail of the generation; what it
sends and the stop it reports are those of matching against the whole text at once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.stub.timeline import _StopFilter

_text = st.text(alphabet="abc", max_size=6)


def _whole(pieces: list[str], stops: tuple[str, ...], include: bool) -> tuple[str, str | None]:
    text = "".join(pieces)
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return text, None
    at, stop = min(hits)
    return text[: at + len(stop) if include else at], stop


@given(st.lists(_text, max_size=12), st.lists(st.text(alphabet="abc", min_size=1, max_size=3), max_size=3),
       st.booleans())
def test_streamed_filter_matches_the_whole_text(pieces, stops, include):
    f = _StopFilter(tuple(stops), include)
    sent, matched = "", None
    for p in pieces:
        out, matched = f.feed(p)
        sent += out
        if matched is not None:
            break
    if matched is None:
        sent += f.flush()
    want_text, want_stop = _whole(pieces, tuple(stops), include)
    if matched is None:
        assert (sent, matched) == (want_text, want_stop)
    else:
        whole = "".join(pieces)
        assert want_stop is not None and whole.startswith(sent)
        # the stop string ends what was sent (included), or directly follows it (left out)
        assert sent.endswith(matched) if include else whole.startswith(sent + matched)


def test_a_long_generation_keeps_a_bounded_buffer():
    f = _StopFilter(("STOP",), False)
    for _ in range(2000):
        f.feed("x" * 4000)
    assert len(f.text) <= 4000 + len("STOP")
