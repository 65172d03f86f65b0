"""The media servers' flavours (stub/media_flavours.py): registered under their names, each
with its server's error shape. (The servers themselves over a loopback socket: test_media.py.)"""

from __future__ import annotations

from homelab_frontend.stub.media_flavours import Kokoro, SdCpp, Speaches, WhisperCpp
from homelab_frontend.stub.server import FLAVOURS


def test_the_media_flavours_are_registered_with_their_error_shapes():
    assert FLAVOURS["whispercpp"] is WhisperCpp and FLAVOURS["sdcpp"] is SdCpp
    assert WhisperCpp().error(400, "x").body == {"error": "x"}
    assert SdCpp().error(400, "x").body == {"error": "x"}
    assert Speaches().error(404, "x").body == {"detail": "x"}
    assert Kokoro().model_not_found("m").body["detail"]["error"] == "invalid_model"
