"""Completion bodies -> TextCall: what is forwarded, and every refusal naming its field."""

from __future__ import annotations

import json

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.completions.request import parse_completions, parse_infill, parse_native_completion


def body(**kw) -> bytes:
    return json.dumps({"model": "m", "prompt": "p", **kw}).encode()


def test_continue_openai_provider_shape():
    # Continue's OpenAI provider (core/llm/llms/OpenAI.ts, _legacystreamComplete): prompt + sampling
    call = parse_completions(body(prompt="<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", max_tokens=1024,
                                  temperature=0.01, stop=["<|endoftext|>", "\n\n"], stream=True,
                                  stream_options={"include_usage": True}, user="x", frequency_penalty=0))
    assert call.stream and call.include_usage and call.suffix is None
    assert call.params == {"max_tokens": 1024, "temperature": 0.01, "stop": ["<|endoftext|>", "\n\n"],
                           "frequency_penalty": 0}


def test_prompt_list_of_one_and_suffix():
    call = parse_completions(body(prompt=["a"], suffix="b"))
    assert (call.prompt, call.suffix, call.stream) == ("a", "b", False)


@pytest.mark.parametrize("kw,param", [
    ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": 3}, "prompt"), ({"n": 2}, "n"), ({"best_of": 2}, "best_of"),
    ({"n": 0}, "n"), ({"suffix": 1}, "suffix"), ({"temperature": "hot"}, "temperature"), ({"seed": 1.5}, "seed"),
    ({"max_tokens": -1}, "max_tokens"), ({"stop": [1]}, "stop"), ({"echo": "yes"}, "echo"),
    ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage"), ({"model": 3}, "model"),
])
def test_refusals_name_the_field(kw, param):
    with pytest.raises(GatewayError) as exc:
        parse_completions(body(**kw))
    assert exc.value.status == 400 and exc.value.param == param and exc.value.message.startswith(param + ":")


def test_echo_is_vllm_only_logprobs_refused_and_n_1_is_fine():
    assert parse_completions(body(echo=True)).vllm_only == "echo"
    with pytest.raises(GatewayError) as exc:
        parse_completions(body(logprobs=2))
    assert exc.value.param == "logprobs"
    assert parse_completions(body(n=1, best_of=1, echo=False, logprobs=None)).vllm_only is None


def test_llama_vscode_infill_shape_with_a_default_model():
    raw = {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "t", "time": 1, "filename": "f"}],
           "prompt": "c", "n_predict": 128, "top_k": 40, "top_p": 0.99, "stream": False,
           "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
           "t_max_predict_ms": 1000, "n_indent": 4, "unknown": 1}
    call = parse_infill("coder")(json.dumps(raw).encode())
    assert call.model == "coder" and call.prompt == "ac" and call.suffix == "b"
    assert call.extra == [{"filename": "f", "text": "t"}] and call.params["max_tokens"] == 128
    assert "unknown" not in call.llama and call.llama["t_max_predict_ms"] == 1000
    assert not call.warmup
    assert parse_infill("coder")(json.dumps({**raw, "n_predict": 0}).encode()).warmup  # cache warm-up


def test_infill_without_a_model_or_default_and_missing_fields():
    with pytest.raises(GatewayError) as exc:
        parse_infill(None)(b'{"input_prefix": "a", "input_suffix": "b"}')
    assert exc.value.param == "model"
    with pytest.raises(GatewayError) as exc:
        parse_infill("m")(b'{"input_prefix": "a"}')
    assert exc.value.param == "input_suffix"
    with pytest.raises(GatewayError) as exc:
        parse_infill("m")(b'{"input_prefix": "a", "input_suffix": "", "input_extra": [{"filename": "x"}]}')
    assert exc.value.param == "input_extra[0].text"


def test_llama_vim_infill_keeps_its_response_fields_for_the_gateway_and_not_the_backend():
    fields = ["content", "timings/prompt_n", "truncated", "tokens_cached"]
    raw = {"id_slot": 0, "input_prefix": "def f():\n", "input_suffix": "\n", "input_extra": [], "prompt": "    ",
           "n_predict": 128, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.9,
           "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500,
           "t_max_predict_ms": 250, "response_fields": fields, "model": ""}
    call = parse_infill("coder")(json.dumps(raw).encode())
    assert call.model == "coder" and call.fields == fields and not call.stream and not call.warmup
    assert "response_fields" not in call.llama and "stream" not in call.llama and "model" not in call.llama
    assert call.llama["samplers"] == ["top_k", "top_p", "infill"] and call.llama["n_indent"] == 4
    warm = parse_infill("coder")(json.dumps({**raw, "n_predict": 0, "response_fields": [""]}).encode())
    assert warm.warmup and warm.fields == [""]
    assert parse_infill("coder")(json.dumps({**raw, "response_fields": []}).encode()).fields is None


def test_llama_fields_that_shape_the_answer_are_relayed_and_n_cmpl_is_not():
    raw = {"input_prefix": "a", "input_suffix": "b", "n_probs": 2, "post_sampling_probs": True, "return_tokens": True,
           "timings_per_token": True, "return_progress": True, "n_cmpl": 3, "n": 2, "verbose": True}
    call = parse_infill("m")(json.dumps(raw).encode())
    assert {k: call.llama[k] for k in ("n_probs", "post_sampling_probs", "return_tokens", "timings_per_token",
                                       "return_progress")} == {"n_probs": 2, "post_sampling_probs": True,
                                                               "return_tokens": True, "timings_per_token": True,
                                                               "return_progress": True}
    assert not {"n_cmpl", "n", "verbose"} & set(call.llama)  # one request, one sequence, one object back


@pytest.mark.parametrize("raw, param", [
    ({"response_fields": "content"}, "response_fields"),
    ({"response_fields": ["content", 1]}, "response_fields"),
    ({"return_tokens": "yes"}, "return_tokens"),
    ({"n_predict": -2}, "n_predict"),
    ({"max_tokens": "8"}, "max_tokens"),
])
def test_bad_llama_fields_are_a_400_naming_them(raw, param):
    with pytest.raises(GatewayError) as e:
        parse_infill("m")(json.dumps({"input_prefix": "a", "input_suffix": "b", **raw}).encode())
    assert e.value.param == param


def test_n_predict_and_its_aliases():
    p = parse_infill("m")
    assert p(b'{"input_prefix":"a","input_suffix":"b","max_tokens":7}').params["max_tokens"] == 7
    assert p(b'{"input_prefix":"a","input_suffix":"b","max_completion_tokens":0}').warmup
    assert "max_tokens" not in p(b'{"input_prefix":"a","input_suffix":"b","n_predict":-1}').params


def test_native_completion_is_continues_and_twinnys_llamacpp_shape():
    # Continue's llama.cpp provider (core/llm/llms/LlamaCpp.ts) and Twinny's (provider-options.ts)
    call = parse_native_completion(None)(json.dumps({"model": "coder", "prompt": "<PRE> a <SUF>b <MID>", "stream": True,
                                                     "n_predict": 16, "top_k": 40, "stop": ["\n\n"]}).encode())
    assert call.endpoint == "completion" and call.stream and call.suffix is None and call.prompt.startswith("<PRE>")
    assert call.params == {"max_tokens": 16, "stop": ["\n\n"], "top_k": 40}
    twinny = parse_native_completion("coder")(b'{"prompt": "x", "stream": true, "temperature": 0.2, "max_tokens": 9}')
    assert twinny.model == "coder" and twinny.params["max_tokens"] == 9 and twinny.llama["max_tokens"] == 9
    with pytest.raises(GatewayError) as e:
        parse_native_completion("m")(b'{"prompt": [1, 2]}')
    assert e.value.param == "prompt"
