"""canonical.Usage.over: how the encoders fold repeated usage reports (vLLM's continuous usage,
a final usage-only chunk) into the counts they report."""

from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.canonical import NO_USAGE, Usage

_count = st.one_of(st.none(), st.integers(min_value=0, max_value=10**6))
_usage = st.builds(Usage, _count, _count, _count, _count)


@given(st.lists(_usage, max_size=8))
def test_each_count_is_the_latest_reported_and_none_only_if_never_reported(reports):
    folded = NO_USAGE
    for u in reports:
        folded = u.over(folded)
    for field in ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens"):
        reported = [getattr(u, field) for u in reports if getattr(u, field) is not None]
        assert getattr(folded, field) == (reported[-1] if reported else None)


def test_a_report_missing_a_count_keeps_the_earlier_one():
    assert Usage(output_tokens=7).over(Usage(12, 3, 4)) == Usage(12, 7, 4)
    assert Usage(output_tokens=9).over(Usage(12, 7, 4, 5)) == Usage(12, 9, 4, 5)
