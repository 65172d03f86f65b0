"""Every dialect in front of the real vLLM, through the real SDKs: a reasoning answer (whole and
streamed), a tool call (vLLM's hermes parser) and its round trip, every figure equal to vLLM's own.

The figures are judged by vLLM itself: the prompt tokens it processed, those it read from its prefix
cache and the tokens it generated for each request are the deltas of its /metrics counters
(`vllm:prompt_tokens_total`, `vllm:prompt_tokens_cached_total`, `vllm:generation_tokens_total`),
and its reasoning-token count is what it reports (`completion_tokens_details.reasoning_tokens`)
for the same scripted answer asked directly. Each dialect reports them as it counts:
- OpenAI Chat: vLLM's usage as sent, reasoning tokens included;
- Anthropic: input_tokens the uncached part, cache_read_input_tokens the cached one, output_tokens
  every completion token (thinking included: Anthropic has no separate count);
- Responses: input_tokens (cached included, and in input_tokens_details), output_tokens, and
  output_tokens_details.reasoning_tokens;
- Gemini: promptTokenCount, candidatesTokenCount the answer and thoughtsTokenCount the reasoning
  (Google counts them apart), cachedContentTokenCount;
- Ollama: prompt_eval_count and eval_count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import anthropic
import ollama
import openai
import pytest
from google import genai
from google.genai import types as gt

from stubproc import wait_for
from support.vllm_script import SCRIPTS, WEATHER_TOOL, directive

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.timeout(900)]

MODEL = "gemma"
REASON, TOOL_ANSWER = SCRIPTS["reason"], SCRIPTS["after-weather"]
FN = WEATHER_TOOL["function"]
RESULT = "sunny, 21 degrees"


@dataclass
class Figures:
    prompt: int
    cached: int
    generated: int


def measured(vllm, call):
    """Run `call` (one request through the gateway) on an idle vLLM; -> (its result, what vLLM
    counted for it)."""
    wait_for(vllm.idle, timeout=60, interval=0.1)
    m0 = vllm.metrics()
    out = call()
    key = "vllm:request_success_total"
    m1 = wait_for(lambda: (m := vllm.metrics()).get(key, 0) > m0.get(key, 0) and m, timeout=30, interval=0.1)
    assert m1[key] - m0.get(key, 0) == 1, "one request reached vLLM"
    d = {k: int(m1.get(k, 0) - m0.get(k, 0)) for k in
         ("vllm:prompt_tokens_total", "vllm:prompt_tokens_cached_total", "vllm:generation_tokens_total")}
    return out, Figures(d["vllm:prompt_tokens_total"], d["vllm:prompt_tokens_cached_total"],
                        d["vllm:generation_tokens_total"])


_REASONING: dict[str, tuple[int, int]] = {}


def vllm_counts(vllm, script: str) -> tuple[int, int]:
    """(completion tokens, reasoning tokens) vLLM reports for script `script`, asked directly."""
    if script not in _REASONING:
        body = {"max_tokens": 300}
        if SCRIPTS[script].tool_calls:
            body["tools"] = [WEATHER_TOOL]
        u = vllm.chat([{"role": "user", "content": "Go. " + directive(script)}], **body)["usage"]
        _REASONING[script] = (u["completion_tokens"], u["completion_tokens_details"]["reasoning_tokens"])
    return _REASONING[script]


@pytest.fixture
def oai(vllm_gw, idle_vllm):
    return openai.OpenAI(base_url=vllm_gw.base, api_key="x", max_retries=0)


@pytest.fixture
def ant(vllm_gw, idle_vllm):
    return anthropic.Anthropic(base_url=vllm_gw.llm, api_key="x", max_retries=0)


@pytest.fixture
def gem(vllm_gw, idle_vllm):
    return genai.Client(api_key="unused", http_options=gt.HttpOptions(
        base_url=vllm_gw.llm, retry_options=gt.HttpRetryOptions(attempts=1)))


@pytest.fixture
def oll(vllm_gw, idle_vllm):
    return ollama.Client(host=vllm_gw.url)


def _reasoning_of(message) -> str | None:
    return getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None)


# -- a reasoning answer -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_openai_reasoning_answer(oai, idle_vllm, stream):
    msgs = [{"role": "user", "content": f"What is 2+2? (openai {stream}) " + directive("reason")}]
    if stream:
        def call():
            chunks = list(oai.chat.completions.create(model=MODEL, messages=msgs, max_tokens=200, stream=True,
                                                      stream_options={"include_usage": True}))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reasoning = "".join(_reasoning_of(c.choices[0].delta) or "" for c in chunks if c.choices)
            return text, reasoning, chunks[-1].usage
    else:
        def call():
            r = oai.chat.completions.create(model=MODEL, messages=msgs, max_tokens=200)
            return r.choices[0].message.content, _reasoning_of(r.choices[0].message), r.usage
    (text, reasoning, usage), vllm_saw = measured(idle_vllm, call)
    assert (reasoning, text) == (REASON.reasoning, REASON.content)
    completion, reasoning_tokens = vllm_counts(idle_vllm, "reason")
    assert usage.prompt_tokens == vllm_saw.prompt
    assert usage.completion_tokens == vllm_saw.generated == completion
    assert usage.completion_tokens_details.reasoning_tokens == reasoning_tokens > 0
    assert (usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0) == vllm_saw.cached


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_anthropic_reasoning_answer(ant, idle_vllm, stream):
    kw = dict(model=MODEL, max_tokens=200,
              messages=[{"role": "user", "content": f"What is 2+2? (anthropic {stream}) " + directive("reason")}])

    def call():
        if stream:
            with ant.messages.stream(**kw) as s:
                return s.get_final_message()
        return ant.messages.create(**kw)

    m, vllm_saw = measured(idle_vllm, call)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert (m.content[0].thinking, m.content[1].text) == (REASON.reasoning, REASON.content)
    assert m.content[0].signature  # signed, so that it can be sent back (test_vllm_prefix_cache.py)
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == vllm_saw.prompt
    assert (m.usage.cache_read_input_tokens or 0) == vllm_saw.cached
    assert m.usage.output_tokens == vllm_saw.generated == vllm_counts(idle_vllm, "reason")[0]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_responses_reasoning_answer(oai, idle_vllm, stream):
    kw = dict(model=MODEL, store=False, max_output_tokens=200,
              input=f"What is 2+2? (responses {stream}) " + directive("reason"))

    def call():
        if stream:
            with oai.responses.stream(**kw) as s:
                for _ in s:
                    pass
                return s.get_final_response()
        return oai.responses.create(**kw)

    r, vllm_saw = measured(idle_vllm, call)
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "message"]
    assert r.output[0].content[0].text == REASON.reasoning and r.output_text == REASON.content
    completion, reasoning_tokens = vllm_counts(idle_vllm, "reason")
    assert r.usage.input_tokens == vllm_saw.prompt
    assert r.usage.input_tokens_details.cached_tokens == vllm_saw.cached
    assert r.usage.output_tokens == vllm_saw.generated == completion
    assert r.usage.output_tokens_details.reasoning_tokens == reasoning_tokens > 0


def test_a_requested_reasoning_summary_is_answered_as_vllms_own_responses_server_answers_it(oai, idle_vllm):
    """`reasoning.summary` asked, streamed with the openai SDK's helper, from vLLM's own
    /v1/responses and through the gateway: the same reasoning item (raw text as `content`
    `reasoning_text`, `summary` empty) and the same events for it (no `reasoning_summary_*`)."""
    from vllmproc import SERVED

    kw = dict(store=False, max_output_tokens=200, reasoning={"effort": "medium", "summary": "auto"},
              input="What is 2+2? (summary) " + directive("reason"))

    def run(client, model):
        with client.responses.stream(model=model, **kw) as s:
            kinds = [e.type for e in s]
            return kinds, s.get_final_response()

    own_kinds, own = run(openai.OpenAI(base_url=idle_vllm.base, api_key="x", max_retries=0), SERVED)
    wait_for(idle_vllm.idle, timeout=60, interval=0.1)
    our_kinds, ours = run(oai, MODEL)

    def reasoning_events(kinds):
        # a run of deltas counts once: how many deltas carry the text is how far vLLM's API server
        # fell behind its engine (a busy one merges them: tests/support/wire_shape.uncoalesced), on
        # either path alike; the text itself is compared whole below
        events = [k for k in kinds if "reasoning" in k]
        return [k for i, k in enumerate(events) if not (k.endswith(".delta") and i and events[i - 1] == k)]

    assert reasoning_events(our_kinds) == reasoning_events(own_kinds), (our_kinds, own_kinds)
    assert not any("summary" in k for k in our_kinds)
    for r in (own, ours):
        item = r.output[0]
        assert item.type == "reasoning" and item.summary == [] and item.content[0].type == "reasoning_text"
    assert ours.output[0].content[0].text == own.output[0].content[0].text == REASON.reasoning


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_gemini_reasoning_answer(gem, idle_vllm, stream):
    contents = f"What is 2+2? (gemini {stream}) " + directive("reason")
    config = gt.GenerateContentConfig(max_output_tokens=200, thinking_config=gt.ThinkingConfig(include_thoughts=True))

    def call():
        if stream:
            chunks = list(gem.models.generate_content_stream(model=MODEL, contents=contents, config=config))
            parts = [p for ch in chunks if ch.candidates for p in (ch.candidates[0].content.parts or [])]
            return parts, chunks[-1].usage_metadata
        r = gem.models.generate_content(model=MODEL, contents=contents, config=config)
        return r.candidates[0].content.parts, r.usage_metadata

    (parts, u), vllm_saw = measured(idle_vllm, call)
    assert "".join(p.text for p in parts if p.thought) == REASON.reasoning
    assert "".join(p.text or "" for p in parts if not p.thought) == REASON.content
    completion, reasoning_tokens = vllm_counts(idle_vllm, "reason")
    assert u.prompt_token_count == vllm_saw.prompt
    assert u.thoughts_token_count == reasoning_tokens > 0  # Google counts the thoughts apart
    assert u.candidates_token_count == completion - reasoning_tokens
    assert u.candidates_token_count + u.thoughts_token_count == vllm_saw.generated
    assert u.total_token_count == vllm_saw.prompt + vllm_saw.generated
    assert (u.cached_content_token_count or 0) == vllm_saw.cached


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_ollama_reasoning_answer(oll, idle_vllm, stream):
    msgs = [{"role": "user", "content": f"What is 2+2? (ollama {stream}) " + directive("reason")}]

    def call():
        if stream:
            parts = list(oll.chat(model=MODEL, messages=msgs, think=True, stream=True, options={"num_predict": 200}))
            return ("".join(p.message.thinking or "" for p in parts), "".join(p.message.content or "" for p in parts),
                    parts[-1])
        r = oll.chat(model=MODEL, messages=msgs, think=True, options={"num_predict": 200})
        return r.message.thinking, r.message.content, r

    (thinking, content, last), vllm_saw = measured(idle_vllm, call)
    assert (thinking, content) == (REASON.reasoning, REASON.content)
    assert last.done and last.done_reason == "stop"
    assert last.prompt_eval_count == vllm_saw.prompt
    assert last.eval_count == vllm_saw.generated == vllm_counts(idle_vllm, "reason")[0]


# -- a tool call and its round trip ------------------------------------------------------------------


def _ask_weather(dialect: str) -> str:
    return f"What is the weather in Paris? ({dialect}) " + directive("weather")


def _tool_result() -> str:
    # the answer's script rides in the tool result: the last directive in the prompt wins
    return f"{RESULT} " + directive("after-weather")


def test_openai_tool_call_and_round_trip(oai, idle_vllm):
    msgs = [{"role": "user", "content": _ask_weather("openai")}]
    r, saw = measured(idle_vllm, lambda: oai.chat.completions.create(model=MODEL, messages=msgs, max_tokens=300,
                                                                       tools=[WEATHER_TOOL]))
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (saw.prompt, saw.generated)
    assert r.usage.completion_tokens_details.reasoning_tokens == vllm_counts(idle_vllm, "weather")[1]
    msgs += [r.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": _tool_result()}]
    r2, saw2 = measured(idle_vllm, lambda: oai.chat.completions.create(model=MODEL, messages=msgs, max_tokens=300,
                                                                         tools=[WEATHER_TOOL]))
    assert r2.choices[0].message.content == TOOL_ANSWER.content
    assert (r2.usage.prompt_tokens, r2.usage.completion_tokens) == (saw2.prompt, saw2.generated)
    assert r2.usage.completion_tokens_details.reasoning_tokens == vllm_counts(idle_vllm, "after-weather")[1]


def test_anthropic_tool_call_and_round_trip(ant, idle_vllm):
    tools = [{"name": FN["name"], "description": FN["description"], "input_schema": FN["parameters"]}]
    msgs = [{"role": "user", "content": _ask_weather("anthropic")}]
    m, saw = measured(idle_vllm, lambda: ant.messages.create(model=MODEL, max_tokens=300, tools=tools, messages=msgs))
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["thinking", "tool_use"]
    use = m.content[1]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    assert (m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), m.usage.output_tokens) == (saw.prompt, saw.generated)
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": _tool_result()}]}]
    m2, saw2 = measured(idle_vllm, lambda: ant.messages.create(model=MODEL, max_tokens=300, tools=tools, messages=msgs))
    assert m2.stop_reason == "end_turn" and m2.content[-1].text == TOOL_ANSWER.content
    assert m2.usage.input_tokens + (m2.usage.cache_read_input_tokens or 0) == saw2.prompt
    assert (m2.usage.cache_read_input_tokens or 0) == saw2.cached
    assert m2.usage.output_tokens == saw2.generated


def test_responses_tool_call_and_round_trip(oai, idle_vllm):
    tools = [{"type": "function", "name": FN["name"], "description": FN["description"], "parameters": FN["parameters"]}]
    first = [{"role": "user", "content": _ask_weather("responses")}]
    r, saw = measured(idle_vllm, lambda: oai.responses.create(model=MODEL, store=False, max_output_tokens=300,
                                                                tools=tools, input=first))
    calls = [o for o in r.output if o.type == "function_call"]
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert (r.usage.input_tokens, r.usage.output_tokens) == (saw.prompt, saw.generated)
    assert r.usage.output_tokens_details.reasoning_tokens == vllm_counts(idle_vllm, "weather")[1]
    follow = first + [o.model_dump(exclude_none=True) for o in r.output] + [
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": _tool_result()}]
    r2, saw2 = measured(idle_vllm, lambda: oai.responses.create(model=MODEL, store=False, max_output_tokens=300,
                                                                  tools=tools, input=follow))
    assert r2.output_text == TOOL_ANSWER.content
    assert (r2.usage.input_tokens, r2.usage.output_tokens) == (saw2.prompt, saw2.generated)
    assert r2.usage.input_tokens_details.cached_tokens == saw2.cached
    assert r2.usage.output_tokens_details.reasoning_tokens == vllm_counts(idle_vllm, "after-weather")[1]


def test_gemini_tool_call_and_round_trip(gem, idle_vllm):
    tool = gt.Tool(function_declarations=[gt.FunctionDeclaration(
        name=FN["name"], description=FN["description"], parameters_json_schema=FN["parameters"])])
    config = gt.GenerateContentConfig(max_output_tokens=300, tools=[tool],
                                      automatic_function_calling=gt.AutomaticFunctionCallingConfig(disable=True),
                                      thinking_config=gt.ThinkingConfig(include_thoughts=True))
    ask = gt.Content(role="user", parts=[gt.Part(text=_ask_weather("gemini"))])
    r, saw = measured(idle_vllm, lambda: gem.models.generate_content(model=MODEL, contents=[ask], config=config))
    fc = r.function_calls[0]
    assert (fc.name, fc.args) == ("get_weather", {"city": "Paris"})
    u = r.usage_metadata
    assert u.prompt_token_count == saw.prompt
    assert (u.candidates_token_count + u.thoughts_token_count, u.thoughts_token_count) == (
        saw.generated, vllm_counts(idle_vllm, "weather")[1])
    reply = gt.Content(role="user", parts=[gt.Part.from_function_response(name="get_weather",
                                                                          response={"result": _tool_result()})])
    r2, saw2 = measured(idle_vllm, lambda: gem.models.generate_content(
        model=MODEL, contents=[ask, r.candidates[0].content, reply], config=config))
    assert r2.text == TOOL_ANSWER.content
    u2 = r2.usage_metadata
    assert u2.prompt_token_count == saw2.prompt and (u2.cached_content_token_count or 0) == saw2.cached
    assert u2.candidates_token_count + u2.thoughts_token_count == saw2.generated


def test_ollama_tool_call_and_round_trip(oll, idle_vllm):
    msgs = [{"role": "user", "content": _ask_weather("ollama")}]
    r, saw = measured(idle_vllm, lambda: oll.chat(model=MODEL, messages=msgs, tools=[WEATHER_TOOL], think=True,
                                                  options={"num_predict": 300}))
    call = r.message.tool_calls[0]
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert (r.prompt_eval_count, r.eval_count) == (saw.prompt, saw.generated)
    msgs += [r.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_name": "get_weather", "content": _tool_result()}]
    r2, saw2 = measured(idle_vllm, lambda: oll.chat(model=MODEL, messages=msgs, tools=[WEATHER_TOOL], think=True,
                                                    options={"num_predict": 300}))
    assert r2.message.content == TOOL_ANSWER.content
    assert (r2.prompt_eval_count, r2.eval_count) == (saw2.prompt, saw2.generated)


# -- count_tokens: vLLM's own tokenizer (/tokenize) ---------------------------------------------------


def test_count_tokens_is_the_prompt_vllm_then_processes(ant, gem, idle_vllm):
    msgs = [{"role": "user", "content": "How many tokens is this? " + directive("plain")}]
    counted = ant.messages.count_tokens(model=MODEL, messages=msgs).input_tokens
    _, saw = measured(idle_vllm, lambda: ant.messages.create(model=MODEL, max_tokens=100, messages=msgs))
    assert counted == saw.prompt
    contents = "How many tokens is this, Gemini? " + directive("plain")
    counted = gem.models.count_tokens(model=MODEL, contents=contents).total_tokens
    _, saw = measured(idle_vllm, lambda: gem.models.generate_content(
        model=MODEL, contents=contents, config=gt.GenerateContentConfig(max_output_tokens=100)))
    assert counted == saw.prompt
