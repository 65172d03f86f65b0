"""Mid-conversation system turns through a real gateway: merged into the neighbouring user or
tool message by default, kept native for a model configured with `system_turns: native`."""

from __future__ import annotations

import json

from conftest import R1
from gwproc import Gateway, config_for
from rawhttp import post_raw

CONVERSATION = [
    {"role": "user", "content": "run it"},
    {"role": "system", "content": "# Environment"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]},
    {"role": "system", "content": "The user is waiting: keep it short."},
]
BODY = {"max_tokens": 32, "system": "You are an agent.", "messages": CONVERSATION,
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}


def test_merged_by_default_native_when_configured(vllm_stub):
    cfg = config_for({"gpu0": {"url": vllm_stub.base, "kind": "vllm"}},
                     {"merged": {"backend": "gpu0", "upstream_model": R1},
                      "native": {"backend": "gpu0", "upstream_model": R1, "system_turns": "native"}})
    with Gateway(cfg) as gw:
        vllm_stub.reset()
        for model in ("merged", "native"):
            status, _, raw = post_raw(gw.base + "/messages", {"model": model, **BODY})
            assert status == 200, raw
        merged, native = (r["body"]["messages"] for r in vllm_stub.requests())
    assert [m["role"] for m in merged] == ["system", "user", "assistant", "tool"]
    assert merged[0]["content"] == "You are an agent."  # the start of the prompt never moves
    assert merged[1]["content"] == "run it\n\n<system>\n# Environment\n</system>"
    assert merged[3]["content"] == "a.txt\n\n<system>\nThe user is waiting: keep it short.\n</system>"
    assert [m["role"] for m in native] == ["system", "user", "system", "assistant", "tool", "system"]
    assert native[5]["content"] == "The user is waiting: keep it short."
    assert json.dumps(merged[2]) == json.dumps(native[3])  # nothing else differs
