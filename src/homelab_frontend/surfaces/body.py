"""The JSON object a request body must be, or the 400 that says why it is not."""

from __future__ import annotations

import msgspec

from ..errors import GatewayError


def decode_object(body: bytes) -> dict:
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError as err:
        raise GatewayError("invalid_request", f"the body is not valid JSON: {err}") from None
    except RecursionError:
        raise GatewayError("invalid_request", "the body nests JSON too deeply to decode") from None
    if not isinstance(raw, dict):
        raise GatewayError("invalid_request", "the body must be a JSON object")
    return raw
