"""The Gemini API through a real gateway, driven by the official google-genai SDK (and raw HTTP
for wire details), in front of a vLLM-flavoured reasoning stub and a llama.cpp-flavoured one."""

from __future__ import annotations

import json
import threading

import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from gwproc import Gateway, config_for
from rawhttp import post_raw
from stubproc import start_stub, wait_for

R1 = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
KEY = "sk-gemini-test"
WEATHER = types.Tool(function_declarations=[types.FunctionDeclaration(
    name="get_weather", description="The weather in a city",
    parameters=types.Schema(type="OBJECT", properties={"city": types.Schema(type="STRING")}, required=["city"]))])


@pytest.fixture(scope="module")
def stack():
    with start_stub("vllm", "--reasoning", "--model", R1, "--max-model-len", "4096") as vllm, \
         start_stub("llamacpp", "--max-model-len", "4096") as llama:
        cfg = config_for(
            {"gpu0": {"url": vllm.base, "kind": "vllm", "slots": 4},
             "llama": {"url": llama.base, "kind": "llamacpp", "slots": 2}},
            {"reasoning": {"backend": "gpu0", "upstream_model": R1},
             "gemma": {"backend": "llama", "upstream_model": "gemma-3-270m"}},
            aliases={"gemini-*flash*": "gemma", "gemini-*pro*": "reasoning"},
            auth={"keys": [{"name": "gem", "key_env": "GEM_KEY"}]},
        )
        with Gateway(cfg, env={"GEM_KEY": KEY}) as gw:
            yield {"gw": gw, "reasoning": vllm, "gemma": llama}


def sdk(gw, *, key: str = KEY, version: str | None = None) -> genai.Client:
    opts = types.HttpOptions(base_url=gw.llm, retry_options=types.HttpRetryOptions(attempts=1),
                             **({"api_version": version} if version else {}))
    return genai.Client(api_key=key, http_options=opts)


def last_upstream(stub) -> dict:
    return stub.requests()[-1]["body"]


def log_of(gw, path_part: str) -> list[dict]:
    return [r for r in gw.access_log() if path_part in r["path"]]


@pytest.mark.parametrize("model", ["reasoning", "gemma"])
@pytest.mark.parametrize("version", ["v1", "v1beta"])
def test_generate_content_and_the_stream_say_the_same(stack, model, version):
    gw, stub = stack["gw"], stack[model]
    stub.reset()
    client = sdk(gw, version=version)
    whole = client.models.generate_content(model=model, contents="hi [stub content=6]")
    chunks = list(client.models.generate_content_stream(model=model, contents="hi [stub content=6]"))
    streamed = "".join(ch.text or "" for ch in chunks)
    assert whole.text == streamed == "Hello from the homelab demo backend. "
    assert len(chunks) >= 6  # one chunk per upstream token, not one at the end
    assert whole.model_version == model and whole.response_id
    assert whole.candidates[0].finish_reason == types.FinishReason.STOP
    u = whole.usage_metadata
    assert u.candidates_token_count >= 6 and u.prompt_token_count > 0
    # the thoughts apart from the candidates, as Google counts them (vLLM's reasoning_tokens)
    assert u.total_token_count == u.prompt_token_count + u.candidates_token_count + (u.thoughts_token_count or 0)
    assert chunks[-1].usage_metadata.candidates_token_count == u.candidates_token_count
    assert all(ch.usage_metadata is None for ch in chunks[:-1])
    assert [bool(r["body"].get("stream")) for r in stub.requests()[-2:]] == [model == "gemma", True]
    recs = wait_for(lambda: log_of(gw, ":") if len(log_of(gw, f"/{version}/models/{model}:")) >= 2 else None, 5)
    mine = [r for r in recs if f"/{version}/models/{model}:" in r["path"]][-2:]
    assert [r["dialect"] for r in mine] == ["gemini", "gemini"] and all(r["outcome"] == "ok" for r in mine)
    assert all(r["key"] == "gem" for r in mine)


def test_thoughts_only_when_asked_and_the_reasoning_goes_back_upstream(stack):
    gw, vllm = stack["gw"], stack["reasoning"]
    vllm.reset()
    client = sdk(gw)
    shown = client.models.generate_content(
        model="reasoning", contents="hi [stub reasoning=3 content=2]",
        config=types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True)))
    parts = shown.candidates[0].content.parts
    assert [(p.thought, p.text) for p in parts] == [(True, "Let me think "), (None, "Hello from ")]
    assert parts[1].thought_signature
    hidden = client.models.generate_content(model="reasoning", contents="hi [stub reasoning=3 content=2]")
    hparts = hidden.candidates[0].content.parts
    assert [p.text for p in hparts] == ["Hello from "] and hparts[0].thought_signature
    # the next turn carries the answer back, signature included: the upstream gets the reasoning
    client.models.generate_content(model="reasoning", contents=[
        types.Content(role="user", parts=[types.Part(text="hi")]), hidden.candidates[0].content,
        types.Content(role="user", parts=[types.Part(text="again [stub content=1]")])])
    assistant = last_upstream(vllm)["messages"][1]
    assert assistant["role"] == "assistant" and assistant["content"] == "Hello from "
    assert assistant["reasoning"] == "Let me think "
    # a forged signature is dropped, never replayed as the model's reasoning
    forged = types.Content(role="model", parts=[types.Part(text="Hello", thought_signature=b"hlf2.forged")])
    client.models.generate_content(model="reasoning", contents=[
        types.Content(role="user", parts=[types.Part(text="hi")]), forged,
        types.Content(role="user", parts=[types.Part(text="again [stub content=1]")])])
    assert "reasoning" not in last_upstream(vllm)["messages"][1]


@pytest.mark.parametrize("model", ["reasoning", "gemma"])
def test_function_calling_round_trip(stack, model):
    gw, stub = stack["gw"], stack[model]
    stub.reset()
    client = sdk(gw)
    config = types.GenerateContentConfig(tools=[WEATHER])
    history = [types.Content(role="user", parts=[types.Part(text="Weather in Paris? [stub agent]")])]
    first = client.models.generate_content(model=model, contents=history, config=config)
    (call,) = first.function_calls
    assert call.name == "get_weather" and call.args == {"city": "hello"} and call.id
    up = last_upstream(stub)
    assert up["tools"][0]["function"]["parameters"] == {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    history += [first.candidates[0].content, types.Content(role="user", parts=[types.Part.from_function_response(
        name="get_weather", response={"output": "sunny, 21 C"})])]  # no id: matched by name
    second = client.models.generate_content(model=model, contents=history, config=config)
    assert second.text.startswith("The tool said: sunny, 21 C")
    msgs = last_upstream(stub)["messages"]
    asst = next(m for m in msgs if m.get("tool_calls"))
    tool = next(m for m in msgs if m["role"] == "tool")
    assert tool["tool_call_id"] == asst["tool_calls"][0]["id"] == call.id and tool["content"] == "sunny, 21 C"
    # streamed, the call arrives whole in one part
    chunks = list(client.models.generate_content_stream(model=model, contents=history[:1], config=config))
    calls = [fc for ch in chunks for fc in (ch.function_calls or [])]
    assert [(fc.name, fc.args) for fc in calls] == [("get_weather", {"city": "hello"})]


def test_json_schema_output_reaches_the_backend_as_a_constraint(stack):
    gw, vllm = stack["gw"], stack["reasoning"]
    vllm.reset()
    schema = types.Schema(type="OBJECT", properties={"complexity_reasoning": types.Schema(type="STRING"),
                                                     "complexity_score": types.Schema(type="INTEGER")},
                          required=["complexity_reasoning", "complexity_score"])
    client = sdk(gw)  # held: a Client closes its HTTP client when collected
    r = client.models.generate_content(model="gemini-3.5-flash-lite", contents="how hard?",
                                        config=types.GenerateContentConfig(response_mime_type="application/json",
                                                                           response_schema=schema))
    assert json.loads(r.text) == {"complexity_reasoning": "hello", "complexity_score": 1}
    fmt = last_upstream(stack["gemma"])["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"]["properties"]["complexity_score"] == {"type": "integer"}
    r = client.models.generate_content(model="reasoning", contents="x", config=types.GenerateContentConfig(
        response_mime_type="application/json", response_json_schema={"type": "OBJECT", "properties": {"a": {"type": "BOOLEAN"}},
                                                                     "required": ["a"]}))
    assert json.loads(r.text) == {"a": True}


def test_count_tokens_is_the_backends_count(stack):
    gw, vllm = stack["gw"], stack["reasoning"]
    client = sdk(gw)
    contents = "one two three four five [stub content=1]"
    counted = client.models.count_tokens(model="reasoning", contents=contents).total_tokens
    used = client.models.generate_content(model="reasoning", contents=contents).usage_metadata.prompt_token_count
    assert counted == used > 5
    rec = wait_for(lambda: log_of(gw, ":countTokens"), 5)[-1]
    assert rec["dialect"] == "gemini" and rec["outcome"] == "ok"


def test_models_list_and_get_in_googles_shape_and_openais_list_unbroken(stack):
    gw = stack["gw"]
    client = sdk(gw)
    listed = {m.name: m for m in client.models.list()}
    assert set(listed) == {"models/reasoning", "models/gemma"}
    assert listed["models/reasoning"].input_token_limit == 4096
    assert "generateContent" in listed["models/reasoning"].supported_actions
    got = client.models.get(model="gemini-2.5-flash")
    assert got.name == "models/gemini-2.5-flash" and got.input_token_limit == 4096 and "gemma" in got.display_name
    beta = sdk(gw, version="v1beta")
    assert {m.name for m in beta.models.list()} == set(listed)
    with pytest.raises(genai_errors.ClientError) as info:
        client.models.get(model="nope")
    assert info.value.code == 404 and info.value.status == "NOT_FOUND"
    # the same path for an OpenAI client: the OpenAI list
    oai = openai.OpenAI(base_url=gw.base, api_key=KEY, max_retries=0)
    assert {m.id for m in oai.models.list()} == {"reasoning", "gemma"}


def test_keys_as_google_sends_them(stack):
    gw = stack["gw"]
    wrong = sdk(gw, key="wrong")
    with pytest.raises(genai_errors.ClientError) as info:
        wrong.models.generate_content(model="reasoning", contents="hi")
    assert info.value.code == 401 and info.value.status == "UNAUTHENTICATED"
    body = {"contents": [{"parts": [{"text": "hi [stub content=1]"}]}]}
    url = gw.llm + "/v1beta/models/reasoning:generateContent"
    assert post_raw(url + f"?key={KEY}", body)[0] == 200
    assert post_raw(url, body, {"authorization": f"Bearer {KEY}"})[0] == 200
    status, _, raw = post_raw(url, body)
    assert status == 401 and json.loads(raw)["error"]["status"] == "UNAUTHENTICATED"
    assert KEY not in gw.stderr()  # ?key= never reaches the log


def test_bad_requests_are_400s_naming_the_field(stack):
    client = sdk(stack["gw"])
    with pytest.raises(genai_errors.ClientError) as info:
        client.models.generate_content(model="reasoning", contents="hi",
                                       config=types.GenerateContentConfig(candidate_count=2))
    assert info.value.code == 400 and info.value.status == "INVALID_ARGUMENT"
    assert info.value.message.startswith("generationConfig.candidateCount:")
    with pytest.raises(genai_errors.ClientError) as info:
        client.models.generate_content(model="nope-model", contents="hi")
    assert info.value.code == 404 and "nope-model" in info.value.message
    status, _, raw = post_raw(stack["gw"].llm + "/v1beta/models/reasoning:generateContent",
                              {"contents": [{"parts": [{"text": "x"}]}], "cachedContent": "cachedContents/1"},
                              {"x-goog-api-key": KEY})
    assert status == 400 and json.loads(raw)["error"]["message"].startswith("cachedContent:")
    status, _, raw = post_raw(stack["gw"].llm + "/v1beta/models/reasoning:predict", {}, {"x-goog-api-key": KEY})
    assert status == 404 and json.loads(raw)["error"]["status"] == "NOT_FOUND"
    # the limits hold for Gemini's shapes: declarations sit inside tools[i], messages are contents
    decls = [{"name": f"f{i}"} for i in range(513)]
    status, _, raw = post_raw(stack["gw"].llm + "/v1beta/models/reasoning:generateContent",
                              {"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": decls}]},
                              {"x-goog-api-key": KEY})
    assert status == 400 and "limits.max_tools" in json.loads(raw)["error"]["message"]
    status, _, raw = post_raw(stack["gw"].llm + "/v1beta/models/reasoning:generateContent",
                              {"contents": [{"parts": [{"text": "x"}]}] * 10001}, {"x-goog-api-key": KEY})
    assert status == 400 and json.loads(raw)["error"]["message"].startswith("contents: 10001 contents")


def test_a_stream_that_breaks_is_an_error_the_sdk_raises(stack):
    gw, vllm = stack["gw"], stack["reasoning"]
    got, client = [], sdk(gw)
    with pytest.raises(genai_errors.ServerError) as info:
        for ch in client.models.generate_content_stream(model="reasoning", contents="long [stub reasoning=0 content=50 fail_after=3]"):
            got.append(ch)
    assert got and info.value.code == 500 and "mid-stream" in info.value.message
    rec = wait_for(lambda: [r for r in log_of(gw, ":streamGenerateContent") if r["outcome"] != "ok"], 5)[-1]
    assert rec["outcome"] == "error_upstream_midstream"


def test_without_alt_sse_the_stream_is_one_json_array(stack):
    status, headers, raw = post_raw(stack["gw"].llm + "/v1beta/models/reasoning:streamGenerateContent",
                                    {"contents": [{"parts": [{"text": "hi [stub reasoning=0 content=3]"}]}]},
                                    {"x-goog-api-key": KEY})
    assert status == 200 and headers["content-type"].startswith("application/json")
    doc = json.loads(raw)
    assert "".join(p.get("text", "") for ch in doc for p in ch["candidates"][0]["content"].get("parts", [])) == "Hello from the "
    assert doc[-1]["candidates"][0]["finishReason"] == "STOP"


def test_a_client_leaving_a_stream_cancels_the_generation(stack):
    gw, vllm = stack["gw"], stack["reasoning"]
    vllm.reset()
    before = vllm.log_text().count("cancelled")
    client = sdk(gw)
    stream = client.models.generate_content_stream(model="reasoning", contents="long [stub content=400 delay_ms=20]")
    next(stream)
    stream.close()  # the SDK closes the response: the connection goes away
    wait_for(lambda: vllm.log_text().count("cancelled") == before + 1, 5)
    wait_for(lambda: vllm.stats()["in_flight"] == 0, 5)
    rec = wait_for(lambda: [r for r in log_of(gw, ":streamGenerateContent") if r["outcome"].startswith("cancelled")], 5)
    assert rec[-1]["outcome"] == "cancelled_streaming" and rec[-1]["dialect"] == "gemini"


def test_embeddings_from_the_backend(stack):
    client = sdk(stack["gw"])
    r = client.models.embed_content(model="gemma", contents=["one", "two words"])
    assert len(r.embeddings) == 2 and all(len(e.values) > 0 for e in r.embeddings)
    status, _, raw = post_raw(stack["gw"].llm + "/v1beta/models/gemma:embedContent",
                              {"content": {"parts": [{"text": "one"}]}}, {"x-goog-api-key": KEY})
    assert status == 200 and json.loads(raw)["embedding"]["values"] == r.embeddings[0].values


def test_a_full_queue_is_resource_exhausted_with_a_retry_delay():
    with start_stub("vllm", "--model", "m") as stub:
        cfg = config_for({"b": {"url": stub.base, "slots": 1, "queue": {"depth": 0, "timeout_s": 5}}}, {"m": {"backend": "b"}})
        with Gateway(cfg) as gw:
            url = gw.llm + "/v1beta/models/m:generateContent"
            body = {"contents": [{"parts": [{"text": "[stub content=100 delay_ms=20]"}]}]}
            hold = threading.Thread(target=post_raw, args=(url, body))
            hold.start()
            wait_for(lambda: gw.admin()["backends"]["b"]["in_use"] == 1, 5)
            status, headers, raw = post_raw(url, {"contents": [{"parts": [{"text": "x"}]}]})
            hold.join()
            err = json.loads(raw)["error"]
            assert status == 429 and err["status"] == "RESOURCE_EXHAUSTED" and int(headers["retry-after"]) >= 1
            assert {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": headers["retry-after"] + "s"} in err["details"]
