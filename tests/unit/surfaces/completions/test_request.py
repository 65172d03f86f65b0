"""Completion bodies -> TextCall: what is forwarded, and every refusal naming its field."""

from __future__ import annotations

import json

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.completions.request import parse_completions, parse_infill


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
