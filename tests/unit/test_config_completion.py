"""The completion keys of a model (fim, supersede, priority) and `completions.default_model`:
defaults, presets, and every problem named by its key path; the presets checked against the
special tokens of each family's own tokenizer (llama.cpp's vocabulary files, when present)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from homelab_frontend import config as cfgmod
from support.gguf_vocab import tokens

BASE = {"backends": {"b": {"url": "http://127.0.0.1:1/v1"}}}


def model(**kw) -> dict:
    return {**BASE, "models": {"m": {"backend": "b", **kw}}}


def test_defaults_and_a_preset_in_any_case():
    cfg = cfgmod.parse(model())
    m = cfg.models["m"]
    assert (m.fim, m.supersede, m.priority) == (None, False, 0) and m.fim_template() is None
    m = cfgmod.parse(model(fim="Qwen2.5-Coder", supersede=True, priority=5)).models["m"]
    assert m.fim_template() == cfgmod.FIM_PRESETS["qwen2.5-coder"] and m.supersede and m.priority == 5
    own = cfgmod.parse(model(fim={"prefix": "<p>", "suffix": "<s>", "middle": "<m>"})).models["m"]
    assert own.fim_template() == cfgmod.Fim("<p>", "<s>", "<m>")


@pytest.mark.parametrize("raw,expected", [
    (model(fim="gpt-5"), "models.m.fim: unknown preset 'gpt-5'"),
    (model(fim={"prefix": "", "suffix": "<s>", "middle": "<m>"}), "models.m.fim.prefix: must not be empty"),
    (model(fim={"prefix": "<p>", "suffix": "<s>"}), "models.m.fim.middle: must not be empty"),
    (model(fim={"prefix": "<p>", "suffix": "<s>", "middle": "<m>", "hole": "x"}), "models.m.fim.hole: unknown key"),
    (model(fim={"prefix": "<p>", "suffix": "<s>", "order": "mps"}), "models.m.fim.order"),
    (model(supersede="yes"), "models.m.supersede"),
    (model(priority=1.5), "models.m.priority"),
    ({**model(), "completions": {"default_model": "nope"}}, "completions.default_model: no model named 'nope'"),
])
def test_each_problem_names_its_key_path(raw, expected):
    with pytest.raises(cfgmod.ConfigError) as exc:
        cfgmod.parse(raw)
    assert any(p.startswith(expected) for p in exc.value.problems), exc.value.problems



# The FIM-looking tokens of llama.cpp's vocabulary files, read from them once with
# tests/support/gguf_vocab.py (tests/support/fim_vocab.json says which files). Only these two
# vocabularies hold their added tokens there (qwen2's has [PAD] in their place); the Qwen2.5-Coder,
# CodeLlama and Codestral tokens are from their model cards (docs/code-completion.md names them).
_VOCAB = json.loads((Path(__file__).parents[1] / "support" / "fim_vocab.json").read_text())["vocabularies"]


@pytest.mark.parametrize("preset,vocab", [("deepseek-coder", "deepseek-coder"), ("starcoder2", "starcoder")])
def test_preset_tokens_are_single_tokens_of_the_familys_tokenizer(preset, vocab):
    # StarCoder2 kept StarCoder's FIM tokens
    fim = cfgmod.FIM_PRESETS[preset]
    for tok in (fim.prefix, fim.suffix, fim.middle):
        assert tok in _VOCAB[vocab], f"{preset}: {tok!r} is not one token of {vocab}'s vocabulary"


def test_the_vocabulary_reader_reads_a_gguf_file(tmp_path):
    """tests/support/gguf_vocab.py on a GGUF file written here: the string array is found after
    keys of other types (a number, an array of numbers)."""
    import struct

    def s(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 3)
    body += s("general.alignment") + struct.pack("<II", 4, 32)
    body += s("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2) + struct.pack("<ff", 0.0, 1.0)
    body += s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + s("<fim_prefix>") + s("a")
    path = tmp_path / "v.gguf"
    path.write_bytes(body)
    assert tokens(str(path)) == ["<fim_prefix>", "a"]
