"""The OpenAI Agents SDK (openai-agents) with its default model, aliased in the gateway's config
to a stub model, runs a tool turn through the Responses surface: the agent calls a Python function
tool, the SDK runs it and sends the result back, and the final output quotes it. Tracing is off:
the SDK would otherwise export traces to OpenAI's servers."""

from __future__ import annotations

import asyncio

import openai
import pytest
from agents import Agent, Runner, function_tool, set_default_openai_api, set_default_openai_client, set_tracing_disabled
from agents.models.default_models import get_default_model

from conftest import standard_config
from gwproc import Gateway


@pytest.fixture(scope="module")
def agents_gateway(vllm_stub, ollama_stub):
    default = get_default_model()
    cfg = standard_config(vllm_stub.base, ollama_stub.base)
    cfg["aliases"] = {default: "reasoning", **cfg["aliases"]}
    with Gateway(cfg) as gw:
        yield gw, default


def test_default_model_runs_a_tool_turn(agents_gateway, vllm_stub, stubs):
    gw, default = agents_gateway
    calls = []

    @function_tool
    def lookup_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny-in-{city}"

    async def run():
        set_tracing_disabled(True)
        set_default_openai_api("responses")
        set_default_openai_client(openai.AsyncOpenAI(base_url=gw.base, api_key="unused", max_retries=0),
                                  use_for_tracing=False)
        agent = Agent(name="helper", instructions="Use the tool.", tools=[lookup_weather])
        return await Runner.run(agent, "What is the weather? [stub agent]")

    result = asyncio.run(run())
    assert calls == ["hello"]  # the stub agent fills required string fields with "hello"
    assert result.final_output == "The tool said: sunny-in-hello"
    reqs = vllm_stub.requests()
    assert len(reqs) == 2
    assert reqs[1]["body"]["messages"][-1] == {"role": "tool", "tool_call_id": reqs[1]["body"]["messages"][-2]["tool_calls"][0]["id"],
                                               "content": "sunny-in-hello"}
    log = [r for r in gw.access_log() if r["path"] == "/llm/v1/responses"]
    assert [r["model"] for r in log[-2:]] == [default, default] and all(r["outcome"] == "ok" for r in log[-2:])
