"""The OpenAI Agents SDK (openai-agents) with its default model, aliased in the gateway's config
to a stub model, runs a tool turn through the Responses surface: the agent calls a Python function
tool, the SDK runs it and sends the result back, and the final output quotes it. Tracing is off:
the SDK would otherwise export traces to OpenAI's servers."""

from __future__ import annotations

import asyncio

import openai
import pytest

from conftest import standard_config
from gwproc import Gateway


@pytest.fixture(scope="module")
def sdk():
    """The Agents SDK, imported by the xdist worker that runs this module only: its import is
    ~1.5 s of CPU (hundreds of pydantic models), which every worker would pay at collection."""
    import agents
    import agents.models.default_models

    return agents


@pytest.fixture(scope="module")
def agents_gateway(sdk, vllm_stub, ollama_stub):
    default = sdk.models.default_models.get_default_model()
    cfg = standard_config(vllm_stub.base, ollama_stub.base)
    cfg["aliases"] = {default: "reasoning", **cfg["aliases"]}
    with Gateway(cfg) as gw:
        yield gw, default


def test_default_model_runs_a_tool_turn(sdk, agents_gateway, vllm_stub, stubs):
    gw, default = agents_gateway
    calls = []

    @sdk.function_tool
    def lookup_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny-in-{city}"

    async def run():
        sdk.set_tracing_disabled(True)
        sdk.set_default_openai_api("responses")
        sdk.set_default_openai_client(openai.AsyncOpenAI(base_url=gw.base, api_key="unused", max_retries=0),
                                      use_for_tracing=False)
        agent = sdk.Agent(name="helper", instructions="Use the tool.", tools=[lookup_weather])
        return await sdk.Runner.run(agent, "What is the weather? [stub agent]")

    result = asyncio.run(run())
    assert calls == ["hello"]  # the stub agent fills required string fields with "hello"
    assert result.final_output == "The tool said: sunny-in-hello"
    reqs = vllm_stub.requests()
    assert len(reqs) == 2
    assert reqs[1]["body"]["messages"][-1] == {"role": "tool", "tool_call_id": reqs[1]["body"]["messages"][-2]["tool_calls"][0]["id"],
                                               "content": "sunny-in-hello"}
    log = [r for r in gw.access_log() if r["path"] == "/llm/v1/responses"]
    assert [r["model"] for r in log[-2:]] == [default, default] and all(r["outcome"] == "ok" for r in log[-2:])
