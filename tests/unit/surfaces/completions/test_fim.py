"""FIM rendering (surfaces/completions/fim.py): pure."""

from __future__ import annotations

from hypothesis import given, strategies as st

from homelab_frontend.config import FIM_PRESETS, Fim
from homelab_frontend.surfaces.completions.fim import extra_text, render


def test_presets_render_each_familys_format():
    assert render(FIM_PRESETS["qwen2.5-coder"], "P", "S") == "<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>"
    assert render(FIM_PRESETS["deepseek-coder"], "P", "S") == "<\uff5cfim\u2581begin\uff5c>P<\uff5cfim\u2581hole\uff5c>S<\uff5cfim\u2581end\uff5c>"
    assert render(FIM_PRESETS["codellama"], "P", "S") == "<PRE> P <SUF>S <MID>"
    assert render(FIM_PRESETS["starcoder2"], "P", "S") == "<fim_prefix>P<fim_suffix>S<fim_middle>"
    assert render(FIM_PRESETS["codestral"], "P", "S") == "[SUFFIX]S[PREFIX]P"


@given(st.text(), st.text(), st.text(max_size=20))
def test_render_keeps_prefix_and_suffix_verbatim_and_extra_first(p, s, extra):
    out = render(Fim("<a>", "<b>", "<c>"), p, s, extra)
    assert out == f"{extra}<a>{p}<b>{s}<c>"


def test_extra_chunks_each_file_then_its_text():
    assert extra_text([{"filename": "a.py", "text": "x = 1"}, {"text": "y\n"}]) == "a.py\nx = 1\ny\n"
