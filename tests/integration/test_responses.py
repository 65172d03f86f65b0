"""The Responses surface through a real gateway in front of the stub upstreams: the official
openai SDK as the client (create, stream, tools, previous_response_id, retrieve, delete), raw HTTP
for the wire, the strict grammar checker on every stream, the stub's own record for what reached
the upstream."""

from __future__ import annotations

import json

import openai
import pytest

from conftest import QWEN, standard_config
from gwproc import Gateway
from support.responses_sse_grammar import check_stream
from rawhttp import post_raw
from stubproc import wait_for

SHELL = {"type": "function", "name": "run", "description": "Run a command",
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=gateway.base, api_key="unused", max_retries=0)


def _comparable(resp) -> dict:
    """A Response without what differs between two answers to the same request."""
    d = resp if isinstance(resp, dict) else resp.model_dump(exclude_none=True)
    d = json.loads(json.dumps(d))
    d.pop("id"), d.pop("created_at")
    for item in d["output"]:
        item.pop("id", None)
    return d


def test_create_plain(client, stubs):
    r = client.responses.create(model="reasoning", input="hi [stub reasoning=3 content=4]")
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.model == "reasoning"
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].type == "reasoning_text"
    assert r.output[0].content[0].text == "Let me think "
    assert r.output_text == "Hello from the homelab "
    assert r.usage.output_tokens == 7 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_stream_final_equals_plain(client, stubs):
    prompt = "hi [stub reasoning=2 content=5]"
    plain = client.responses.create(model="reasoning", input=prompt, store=False)
    with client.responses.stream(model="reasoning", input=prompt, store=False) as s:
        types = [ev.type for ev in s]
        final = s.get_final_response()
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert "response.reasoning_text.delta" in types and "response.output_text.delta" in types
    # reasoning tokens: vLLM's own count (usage.completion_tokens_details), streamed or whole
    assert final.usage.output_tokens_details.reasoning_tokens == 2
    assert plain.usage.output_tokens_details.reasoning_tokens == 2
    assert _comparable(final) == _comparable(plain)


@pytest.mark.parametrize("model", ["reasoning", QWEN])
def test_wire_grammar_and_headers(gateway, stubs, model):
    status, hdrs, raw = post_raw(gateway.base + "/responses", {
        "model": model, "stream": True, "input": "hi [stub reasoning=2 content=3]"})
    assert status == 200 and hdrs["content-type"].startswith("text/event-stream") and "request-id" in hdrs
    events = check_stream(raw, model=model)
    assert events[-1]["type"] == "response.completed"
    assert b"data: [DONE]" not in raw
    final = events[-1]["response"]
    assert final["usage"]["output_tokens"] >= 3


def test_tool_round_trip_reaches_the_upstream(client, vllm_stub, stubs):
    prompt = "Run it. [stub agent]"
    r1 = client.responses.create(model="reasoning", input=prompt, tools=[SHELL], store=False)
    calls = [i for i in r1.output if i.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "run"
    assert json.loads(calls[0].arguments) == {"command": "hello"}
    history = [{"role": "user", "content": prompt}, *[i.model_dump(exclude_none=True) for i in r1.output],
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "tool-output-42"}]
    r2 = client.responses.create(model="reasoning", input=history, tools=[SHELL], store=False)
    assert r2.output_text == "The tool said: tool-output-42"
    sent = vllm_stub.requests()[-1]["body"]["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": calls[0].call_id, "content": "tool-output-42"}
    assert sent[-2]["tool_calls"][0]["function"]["name"] == "run"
    # the reasoning item without encrypted_content cannot be verified: not sent back
    assert "reasoning" not in sent[-2]


def test_encrypted_reasoning_goes_back_upstream(client, vllm_stub, stubs):
    prompt = "Run it. [stub agent]"
    r1 = client.responses.create(model="reasoning", input=prompt, tools=[SHELL], store=False,
                                 include=["reasoning.encrypted_content"])
    rs = [i for i in r1.output if i.type == "reasoning"][0]
    assert rs.encrypted_content and rs.content[0].text not in rs.encrypted_content
    call = [i for i in r1.output if i.type == "function_call"][0]
    history = [{"role": "user", "content": prompt}, *[i.model_dump(exclude_none=True) for i in r1.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "x"}]
    client.responses.create(model="reasoning", input=history, tools=[SHELL], store=False)
    assert vllm_stub.requests()[-1]["body"]["messages"][-2]["reasoning"] == rs.content[0].text
    # a forged blob is dropped, never an error
    history[1]["encrypted_content"] = rs.encrypted_content[:-4] + "AAAA"
    client.responses.create(model="reasoning", input=history, tools=[SHELL], store=False)
    assert "reasoning" not in vllm_stub.requests()[-1]["body"]["messages"][-2]


def test_previous_response_id_continues_the_conversation(client, vllm_stub, stubs):
    r1 = client.responses.create(model="reasoning", input="first [stub content=2]", instructions="be brief")
    r2 = client.responses.create(model="reasoning", input="second [stub content=2]", previous_response_id=r1.id)
    assert r2.previous_response_id == r1.id
    msgs = vllm_stub.requests()[-1]["body"]["messages"]
    # the earlier turn and its answer (with its reasoning), not the earlier instructions
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[0]["content"] == "first [stub content=2]" and msgs[1]["content"] == r1.output_text
    assert msgs[1]["reasoning"] == r1.output[0].content[0].text
    with client.responses.stream(model="reasoning", input="third", previous_response_id=r2.id) as s:
        s.get_final_response()
    assert len(vllm_stub.requests()[-1]["body"]["messages"]) == 5


def test_retrieve_and_delete(client, stubs):
    r = client.responses.create(model="reasoning", input="keep me [stub content=2]")
    got = client.responses.retrieve(r.id)
    assert _comparable(got) == _comparable(r) and got.id == r.id
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model="reasoning", input="x", previous_response_id=r.id)
    assert exc.value.body["param"] == "previous_response_id"


def test_store_false_is_not_kept(client, stubs):
    r = client.responses.create(model="reasoning", input="x [stub content=1]", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_errors_name_the_field(gateway, stubs):
    status, _, raw = post_raw(gateway.base + "/responses", {"model": "reasoning", "input": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"},
        {"role": "user", "content": [{"type": "input_video", "url": "x"}]}]})
    err = json.loads(raw)["error"]
    assert status == 400 and err["param"] == "input[3].content[0].type"
    assert err["message"].startswith("input[3].content[0].type: ") and err["type"] == "invalid_request_error"
    status, _, raw = post_raw(gateway.base + "/responses", {"model": "nope", "input": "x"})
    assert status == 404 and json.loads(raw)["error"]["param"] == "model"


def test_context_length_exceeded_code(gateway, stubs):
    status, _, raw = post_raw(gateway.base + "/responses", {"model": "reasoning", "stream": True,
                                                            "input": "word " * 40000})
    err = json.loads(raw)["error"]
    assert status == 400 and err["code"] == "context_length_exceeded" and err["param"] == "input"


def test_midstream_failure_is_response_failed(gateway, stubs):
    status, _, raw = post_raw(gateway.base + "/responses", {"model": "reasoning", "stream": True,
                                                            "input": "x [stub content=20 fail_after=5]"})
    events = check_stream(raw)
    assert status == 200 and events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert not any(e["type"] == "response.completed" for e in events)


def test_max_output_tokens_is_incomplete(client, stubs):
    r = client.responses.create(model="reasoning", input="count to 50", max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_access_log_and_metrics_say_responses(gateway, client, stubs):
    raw = client.responses.with_raw_response.create(model="reasoning", input="x [stub reasoning=0 content=1]", store=False)
    rid = raw.headers["request-id"]
    rec = wait_for(lambda: [r for r in gateway.access_log() if r["id"] == rid], 2)
    assert rec[-1]["dialect"] == "responses" and rec[-1]["outcome"] == "ok" and rec[-1]["tokens_out"] == 1
    status, text = gateway.get("/metrics")
    assert 'dialect="responses"' in text


def test_another_keys_response_is_404(vllm_stub, ollama_stub, tmp_path):
    cfg = standard_config(vllm_stub.base, ollama_stub.base,
                          auth={"keys": [{"name": "alice", "key": "sk-alice"}, {"name": "bob", "key": "sk-bob"}]})
    with Gateway(cfg) as gw:
        alice = openai.OpenAI(base_url=gw.base, api_key="sk-alice", max_retries=0)
        bob = openai.OpenAI(base_url=gw.base, api_key="sk-bob", max_retries=0)
        r = alice.responses.create(model="reasoning", input="mine [stub content=1]")
        assert alice.responses.retrieve(r.id).id == r.id
        for call in (lambda: bob.responses.retrieve(r.id), lambda: bob.responses.delete(r.id),
                     lambda: bob.responses.create(model="reasoning", input="x", previous_response_id=r.id)):
            with pytest.raises(openai.NotFoundError):
                call()
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=gw.base, api_key="sk-wrong", max_retries=0).responses.retrieve(r.id)
        assert alice.responses.retrieve(r.id).id == r.id  # bob's delete did nothing


def test_store_survives_a_restart_and_is_bounded(vllm_stub, ollama_stub, tmp_path):
    path = str(tmp_path / "store.sqlite3")
    cfg = standard_config(vllm_stub.base, ollama_stub.base,
                          responses={"store": {"path": path, "max_bytes": 6000}})
    with Gateway(cfg) as gw:
        c = openai.OpenAI(base_url=gw.base, api_key="x", max_retries=0)
        ids = [c.responses.create(model="reasoning", input=f"n{i} [stub content=3]").id for i in range(12)]
    with Gateway(cfg) as gw:
        c = openai.OpenAI(base_url=gw.base, api_key="x", max_retries=0)
        assert c.responses.retrieve(ids[-1]).id == ids[-1]
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(ids[0])  # the oldest went to keep the file under max_bytes
    cfg["responses"]["store"]["ttl_s"] = 0.001
    with Gateway(cfg) as gw:
        c = openai.OpenAI(base_url=gw.base, api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(ids[-1])  # older than the TTL


def test_too_many_input_items_is_a_400(vllm_stub, ollama_stub):
    cfg = standard_config(vllm_stub.base, ollama_stub.base, limits={"max_messages": 5, "max_tools": 2})
    with Gateway(cfg) as gw:
        status, _, raw = post_raw(gw.base + "/responses", {"model": "reasoning", "input": [
            {"role": "user", "content": "x"}] * 6})
        err = json.loads(raw)["error"]
        assert status == 400 and err["param"] == "input" and "limits.max_messages" in err["message"]
        status, _, raw = post_raw(gw.base + "/responses", {"model": "reasoning", "input": "x", "tools": [
            {"type": "function", "name": f"f{i}"} for i in range(3)]})
        assert status == 400 and json.loads(raw)["error"]["param"] == "tools"


def test_max_output_tokens_is_clamped_to_the_context(client, vllm_stub, stubs):
    r = client.responses.create(model="reasoning", input="x [stub content=2]", max_output_tokens=100000, store=False)
    assert r.status == "completed" and r.max_output_tokens == 100000
    sent = vllm_stub.requests()[-1]["body"]
    assert 1 <= sent["max_tokens"] < 4096  # the stub's max_model_len
    for absent in ("temperature", "top_p", "stop", "store", "include", "input"):
        assert absent not in sent


def test_tool_output_continues_a_stored_response(client, vllm_stub, stubs):
    r1 = client.responses.create(model="reasoning", input="Run it. [stub agent]", tools=[SHELL])
    call = [i for i in r1.output if i.type == "function_call"][0]
    r2 = client.responses.create(model="reasoning", previous_response_id=r1.id, tools=[SHELL],
                                 input=[{"type": "function_call_output", "call_id": call.call_id, "output": "out-7"}])
    assert r2.output_text == "The tool said: out-7"
    msgs = vllm_stub.requests()[-1]["body"]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool"]
    assert msgs[1]["tool_calls"][0]["id"] == call.call_id and msgs[1]["reasoning"]


def test_item_references_are_resolved_from_the_store(client, vllm_stub, stubs):
    # the Vercel AI SDK's second turn with store on: the earlier answer's items by reference
    prompt = "Run it. [stub agent]"
    r1 = client.responses.create(model="reasoning", input=prompt, tools=[SHELL])
    call = [i for i in r1.output if i.type == "function_call"][0]
    reasoning = [i for i in r1.output if i.type == "reasoning"][0]
    history = [{"role": "user", "content": prompt}, *[{"type": "item_reference", "id": i.id} for i in r1.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "tool-output-9"}]
    r2 = client.responses.create(model="reasoning", input=history, tools=[SHELL])
    assert r2.output_text == "The tool said: tool-output-9"
    sent = vllm_stub.requests()[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["id"] == call.call_id and sent[1]["tool_calls"][0]["function"]["name"] == "run"
    # the stored reasoning is the gateway's own: it goes back upstream
    assert sent[1]["reasoning"] == reasoning.content[0].text
    # an id that is not stored (or not ours) is a 404 naming the item
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model="reasoning", input=[{"type": "item_reference", "id": "rs_" + "0" * 28}])
    assert exc.value.body["param"] == "input[0].id" and "rs_" + "0" * 28 in exc.value.body["message"]


def test_input_items_lists_a_responses_input_newest_first(client, stubs):
    items = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
             {"role": "user", "content": [{"type": "input_text", "text": "three [stub content=1]"}]}]
    r = client.responses.create(model="reasoning", input=items)
    page = client.responses.input_items.list(r.id)
    texts = [i.content[0].text for i in page.data]
    assert texts == ["three [stub content=1]", "two", "one"]  # desc by default
    assert [i.type for i in page.data] == ["message"] * 3 and all(i.id for i in page.data)
    assert page.first_id == page.data[0].id and page.last_id == page.data[-1].id and not page.has_more
    asc = client.responses.input_items.list(r.id, order="asc", limit=2)
    assert [i.content[0].text for i in asc.data] == ["one", "two"] and asc.has_more
    rest = client.responses.input_items.list(r.id, order="asc", after=asc.last_id)
    assert [i.content[0].text for i in rest.data] == ["three [stub content=1]"] and not rest.has_more
    # the SDK's auto-pager walks every page with `after`
    assert [i.content[0].text for i in client.responses.input_items.list(r.id, limit=1)] == texts
    # a string input is one user message
    r2 = client.responses.create(model="reasoning", input="just this [stub content=1]")
    only = client.responses.input_items.list(r2.id).data
    assert len(only) == 1 and only[0].role == "user" and only[0].content[0].text == "just this [stub content=1]"
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.input_items.list(r.id, limit=500)
    assert exc.value.body["param"] == "limit"
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_" + "0" * 24)


def test_a_requested_reasoning_summary_gets_the_raw_reasoning_as_vllm_answers(client, stubs):
    """vLLM's own Responses server ignores `reasoning.summary`: the raw reasoning is the item's
    `content` (`reasoning_text`), `summary` is empty, streamed as `reasoning_text` deltas."""
    r = client.responses.create(model="reasoning", input="hi [stub reasoning=3 content=2]",
                                reasoning={"effort": "high", "summary": "auto"}, store=False)
    rs = r.output[0]
    assert rs.type == "reasoning" and rs.summary == [] and rs.content[0].type == "reasoning_text"
    assert rs.content[0].text == "Let me think "
    with client.responses.stream(model="reasoning", input="hi [stub reasoning=3 content=2]",
                                 reasoning={"effort": "high", "summary": "detailed"}, store=False) as s:
        kinds = []
        deltas = ""
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "response.reasoning_text.delta":
                deltas += ev.delta
        final = s.get_final_response()
    assert not any(k.startswith("response.reasoning_summary") for k in kinds), kinds
    assert deltas == "Let me think " and final.output[0].content[0].text == deltas and final.output[0].summary == []
    assert final.output_text
    assert final.usage.output_tokens_details.reasoning_tokens == 3
    assert final.usage.input_tokens_details.cached_tokens is not None


def test_reasoning_as_summary_when_the_operator_says_so(vllm_stub, ollama_stub):
    """`responses.reasoning_as_summary: true`: the raw reasoning is the summary a client asked
    for (one `summary_text` part, `content` empty); a request that asks none still gets `content`."""
    cfg = standard_config(vllm_stub.base, ollama_stub.base, responses={"reasoning_as_summary": True})
    with Gateway(cfg) as gw:
        client = openai.OpenAI(base_url=gw.base, api_key="unused", max_retries=0)
        r = client.responses.create(model="reasoning", input="hi [stub reasoning=3 content=2]",
                                    reasoning={"effort": "high", "summary": "auto"}, store=False)
        rs = r.output[0]
        assert rs.summary[0].type == "summary_text" and rs.summary[0].text == "Let me think " and rs.content == []
        with client.responses.stream(model="reasoning", input="hi [stub reasoning=3 content=2]",
                                     reasoning={"effort": "high", "summary": "auto"}, store=False) as s:
            deltas = "".join(ev.delta for ev in s if ev.type == "response.reasoning_summary_text.delta")
            final = s.get_final_response()
        assert deltas == "Let me think " and final.output[0].summary[0].text == deltas
        plain = client.responses.create(model="reasoning", input="hi [stub reasoning=3 content=2]", store=False)
        assert plain.output[0].summary == [] and plain.output[0].content[0].text == "Let me think "


def test_another_keys_items_are_404(vllm_stub, ollama_stub):
    cfg = standard_config(vllm_stub.base, ollama_stub.base,
                          auth={"keys": [{"name": "alice", "key": "sk-alice"}, {"name": "bob", "key": "sk-bob"}]})
    with Gateway(cfg) as gw:
        alice = openai.OpenAI(base_url=gw.base, api_key="sk-alice", max_retries=0)
        bob = openai.OpenAI(base_url=gw.base, api_key="sk-bob", max_retries=0)
        r = alice.responses.create(model="reasoning", input="mine [stub content=1]")
        assert len(alice.responses.input_items.list(r.id).data) == 1
        with pytest.raises(openai.NotFoundError):
            bob.responses.input_items.list(r.id)
        ref = r.output[-1].id
        with pytest.raises(openai.NotFoundError) as exc:
            bob.responses.create(model="reasoning", input=[{"type": "item_reference", "id": ref}])
        assert ref in exc.value.body["message"]
        got = alice.responses.create(model="reasoning", store=False,
                                     input=[{"type": "item_reference", "id": ref}, {"role": "user", "content": "on"}])
        assert got.status == "completed"
