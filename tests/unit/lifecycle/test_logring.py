"""The child log ring: bounded in lines and in line length, partial lines included."""

from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.lifecycle.logring import LogRing


def test_lines_split_across_reads_and_marks_between_them():
    ring = LogRing()
    ring.feed(b"loading mo")
    ring.feed(b"del\nready\r\npartial")
    ring.mark("-- gateway: ready")
    assert ring.tail(10) == ["loading model", "ready", "partial", "-- gateway: ready"]


def test_bounded_in_lines_and_line_length():
    ring = LogRing(max_lines=3, max_line_bytes=8)
    ring.feed(b"0123456789abcdef\n" * 5 + b"x" * 100)
    assert ring.tail(10) == ["01234567"] * 3 + ["x" * 8]
    assert len(ring._partial) == 8


@given(st.lists(st.binary(max_size=300), max_size=30))
def test_never_holds_more_than_its_bounds(chunks):
    ring = LogRing(max_lines=5, max_line_bytes=16)
    for c in chunks:
        ring.feed(c)
    assert len(ring.lines) <= 5 and all(len(line.encode()) <= 16 * 3 for line in ring.lines)
    assert len(ring._partial) <= 16
    joined = b"".join(chunks)
    if b"\n" not in joined:
        assert not ring.lines
