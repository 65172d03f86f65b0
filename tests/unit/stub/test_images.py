"""The stub's image sizes and PNGs (stub/images.py): pure. (Its endpoints over a loopback
socket: test_media.py.)"""

from __future__ import annotations

import struct
import zlib

from homelab_frontend.stub import images


def test_image_sizes_are_parsed_bounded_and_the_png_is_well_formed():
    assert images._size(None) == (512, 512) and images._size("64x32") == (64, 32)
    assert images._size("64") is None and images._size("0x5") is None and images._size("9999x1") is None
    data = images.png(3, 2, "seed")
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (3, 2)


def test_the_png_is_one_colour_from_its_seed_and_its_chunks_check():
    data = images.png(4, 3, "a cat")
    assert data == images.png(4, 3, "a cat") and data != images.png(4, 3, "a dog")
    pos, chunks = 8, {}
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks[kind] = body
        pos += 12 + n
    assert list(chunks) == [b"IHDR", b"IDAT", b"IEND"]
    rows = zlib.decompress(chunks[b"IDAT"])
    assert len(rows) == 3 * (1 + 4 * 3) and len({rows[i:i + 13] for i in range(0, len(rows), 13)}) == 1


def test_sizes_at_the_bound():
    assert images._size(f"{images.MAX_SIDE}x1") == (images.MAX_SIDE, 1)
    assert images._size(f"{images.MAX_SIDE + 1}x1") is None and images._size("axb") is None
