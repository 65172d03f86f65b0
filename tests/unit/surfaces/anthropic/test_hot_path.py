"""Hot-path shortcuts must say exactly what the slow, obvious code says."""

from __future__ import annotations

import re

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend import canonical as c
from homelab_frontend.surfaces.anthropic import stream as s
from homelab_frontend.surfaces.anthropic.assemble import new_message_id, new_tool_use_id
from homelab_frontend.surfaces.signature import ThinkingSigner

_encode = msgspec.json.Encoder().encode
_KINDS = {s.TEXT: s._TextDelta, s.THINKING: s._ThinkingDelta, s.TOOL: s._InputJsonDelta}


@given(index=st.integers(0, 10_000), block=st.sampled_from(sorted(_KINDS)), payload=st.text())
def test_spelled_out_delta_frames_equal_the_encoded_structs(index, block, payload):
    spelled = b"%s%d%s" % (s._DELTA_HEAD, index, s._DELTA_KIND[block]) + _encode(payload) + s._DELTA_TAIL
    assert spelled == s._BLOCK_DELTA + _encode(s._BlockDelta(index, _KINDS[block](payload))) + s._END


def test_an_encoded_answer_still_parses_frame_by_frame():
    enc = s.AnthropicStreamEncoder(message_id="msg_x", model="m", signer=ThinkingSigner(b"k"))
    out = b"".join(enc.feed(e) for e in [
        c.ReasoningDelta("hmm \"quoted\"\n"), c.TextDelta("hé 😀"), c.ToolCallStart(0, "", "Bash"),
        c.ToolArgsDelta(0, '{"command":'), c.ToolArgsDelta(0, '"ls"}'), c.Finish("tool_calls"),
    ]) + enc.finish()
    deltas = [msgspec.json.decode(f.split(b"data: ", 1)[1]) for f in out.split(b"\n\n")
              if f.startswith(b"event: content_block_delta")]
    assert [(d["index"], d["delta"]["type"]) for d in deltas] == [
        (0, "thinking_delta"), (0, "signature_delta"), (1, "text_delta"),
        (2, "input_json_delta"), (2, "input_json_delta")]
    assert deltas[0]["delta"]["thinking"] == "hmm \"quoted\"\n" and deltas[2]["delta"]["text"] == "hé 😀"


def test_generated_ids_are_base62_and_distinct():
    ids = {new_message_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"msg_[A-Za-z0-9]{24}", i) for i in ids)
    assert re.fullmatch(r"toolu_[A-Za-z0-9]{24}", new_tool_use_id())
    # every one of the 62 characters turns up (the byte -> character table is not lopsided)
    assert set("".join(i[4:] for i in ids)) == set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
