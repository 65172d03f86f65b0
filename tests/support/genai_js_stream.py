"""The stream reader of Google's JavaScript GenAI SDK (@google/genai 1.30.0, the one Gemini CLI
0.61.0 bundles: `ApiClient.processStreamResponse`), ported line for line so that unit tests can
feed it a body cut into reads of any shape. What it does with each read:

    JSON.parse(the read) -> an object with `error` (code 400..599): throw ApiError(its JSON)
    else append it to a buffer, and take every `data: ...` event off the buffer's front
    at the end: a buffer with anything but white space left -> "Incomplete JSON segment at the end"

Reads are what Node's fetch hands the reader: everything buffered when it asks, but no more than
its stream buffer's high-water mark plus one socket read (Node 22+: 64 KiB + 64 KiB).
"""

from __future__ import annotations

import codecs
import json
import re

NODE_MAX_READ = 128 * 1024

# JavaScript's `.` excludes \n, \r, U+2028 and U+2029; `^` without the m flag is the string's start
_RESPONSE_LINE = re.compile("^\\s*data: ([^\\n\\r\\u2028\\u2029]*)(?:\\n\\n|\\r\\r|\\r\\n\\r\\n)")
_JSON_SPACE = " \t\n\r"  # JSON.parse's white space


class ApiError(Exception):
    pass


class IncompleteJson(Exception):
    pass


def read_stream(reads: list[bytes]) -> list[str]:
    """The `data:` payloads the SDK yields; raises ApiError or IncompleteJson as it would."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    buffer = ""
    out: list[str] = []
    for value in reads:
        chunk = decoder.decode(value)
        try:
            doc = json.loads(chunk.strip(_JSON_SPACE))
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "error" in doc:
            code = doc["error"].get("code") if isinstance(doc["error"], dict) else None
            if isinstance(code, int) and 400 <= code < 600:
                raise ApiError(f"got status: {doc['error'].get('status')}. {json.dumps(doc)}")
        buffer += chunk
        while (m := _RESPONSE_LINE.match(buffer)) is not None:
            out.append(m.group(1))
            buffer = buffer[m.end():]
    if buffer.strip():
        raise IncompleteJson("Incomplete JSON segment at the end")
    return out
