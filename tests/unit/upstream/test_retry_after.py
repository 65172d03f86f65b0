"""An upstream's Retry-After header read as seconds (upstream/retry_after.py): pure."""

from __future__ import annotations

import time
from email.utils import formatdate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.upstream.retry_after import MAX_S, retry_after_seconds


@given(st.integers(min_value=0, max_value=10**9))
def test_retry_after_delay_seconds(n):
    assert retry_after_seconds(str(n)) == min(float(n), MAX_S)


@given(st.integers(min_value=-3600, max_value=80_000))
def test_retry_after_http_date(delta):
    now = 1_800_000_000.0
    got = retry_after_seconds(formatdate(now + delta, usegmt=True), now=now)
    assert got == max(0.0, float(delta))


@pytest.mark.parametrize("value", [None, "", "-5", "1.5", "soon", "Mon, 99 Foo 2026", "٣", "1" * 100,
                                   "Fri, 31 Dec 1999 23:59:59"])  # no zone: not an HTTP-date
def test_retry_after_that_cannot_be_read_is_none(value):
    assert retry_after_seconds(value) is None


def test_retry_after_obsolete_date_forms():
    now = time.time()
    assert 0 <= retry_after_seconds(time.strftime("%A, %d-%b-%y %H:%M:%S GMT", time.gmtime(now + 30)), now=now) <= 30
