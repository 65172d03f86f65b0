"""Convert the Gemma 3 270M GGUF (the one llama.cpp's tests run) into a model directory vLLM loads:
bf16 safetensors and a tokenizer. Run by vllm.sh with the vLLM venv's Python:

    python vllm_convert.py MODEL.gguf OUT_DIR

Why each step (issue 28's "Facts from trying it"):
- vLLM 0.32 loads no GGUF, and no model hub is reachable here: transformers reads the GGUF,
  dequantizing its Q4_K_M blocks (GgufConfig(dequantize=True)).
- transformers 5 refuses to save a model loaded from GGUF-packed weights, so the model is built
  again from its config without `quantization_config` and given the dequantized state dict.
- The tokenizer that comes out of the GGUF adds no `<bos>`, and Gemma without it answers junk.
- vLLM's deepseek_r1 reasoning parser (the one the seeds' `reasoning` model runs under) refuses to
  start unless `<think>` and `</think>` are single tokens: Gemma's reserved, never-trained
  `<unused0>` and `<unused1>` (ids 6 and 7) take those names. No weight changes: the test logits
  processor (tests/support/vllm_script.py) is what makes the model write them.
- End of turn: `<eos>` (1) and `<end_of_turn>` (106), as Gemma 3's own generation config says.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

THINK = {6: "<think>", 7: "</think>"}
BOS_ID = 2
EOS_IDS = [1, 106]


def convert_weights(gguf: Path, out: Path) -> None:
    packed = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True),
        dtype=torch.bfloat16)
    state = {k: v.to(torch.bfloat16) for k, v in packed.state_dict().items()}
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.bos_token_id, config.eos_token_id = BOS_ID, EOS_IDS
    del packed
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # the output head is tied to the embeddings (Gemma): absent from the state dict by design
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise SystemExit(f"state dict does not fit the model: missing {missing}, unexpected {unexpected}")
    model.generation_config.bos_token_id, model.generation_config.eos_token_id = BOS_ID, EOS_IDS
    model.save_pretrained(str(out), safe_serialization=True)


def convert_tokenizer(gguf: Path, out: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(str(out))
    path = out / "tokenizer.json"
    doc = json.loads(path.read_text())
    _rename(doc, THINK)
    doc["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<bos>": {"id": "<bos>", "ids": [BOS_ID], "tokens": ["<bos>"]}},
    }
    path.write_text(json.dumps(doc, ensure_ascii=False))
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["add_bos_token"] = True
    cfg["bos_token"], cfg["eos_token"] = "<bos>", "<eos>"
    for tid, name in THINK.items():
        entry = cfg.get("added_tokens_decoder", {}).get(str(tid))
        if entry is not None:
            entry["content"], entry["special"] = name, False
    cfg.pop("chat_template", None)  # the tests give the server theirs (tests/support/templates)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


def _rename(doc: dict, names: dict[int, str]) -> None:
    """Rename tokens by id in tokenizer.json: the vocabulary and the added-token list, and make them
    ordinary (not special) so that the detokenized text keeps them for the reasoning parser."""
    vocab = doc["model"]["vocab"]
    if isinstance(vocab, dict):  # BPE: token -> id
        for tid, name in names.items():
            old = next(t for t, i in vocab.items() if i == tid)
            vocab[name] = vocab.pop(old)
    else:  # Unigram: [token, score] by id
        for tid, name in names.items():
            vocab[tid][0] = name
    for entry in doc.get("added_tokens", []):
        if entry["id"] in names:
            entry["content"], entry["special"] = names[entry["id"]], False


def check(out: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok("hi")["input_ids"]
    assert ids[0] == BOS_ID, ids
    for tid, name in THINK.items():
        assert tok.convert_tokens_to_ids(name) == tid, (name, tok.convert_tokens_to_ids(name))
        assert tok.encode(name, add_special_tokens=False) == [tid], (name, tok.encode(name, add_special_tokens=False))
    text = tok.decode([6, *tok.encode("so", add_special_tokens=False), 7], skip_special_tokens=True)
    assert text == "<think>so</think>", text


def main() -> None:
    gguf, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    convert_tokenizer(gguf, out)
    check(out)
    convert_weights(gguf, out)
    print(f"vllm_convert: {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))


if __name__ == "__main__":
    main()
