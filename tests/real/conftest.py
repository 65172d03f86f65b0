"""Fixtures for the tests against llama.cpp's real llama-server (Gemma 3 270M, --parallel 2) with
a real gateway in front (kind: llamacpp, slots 2).

Without the server: in CI (CI=true) every test here fails, saying `bash .ci/deps/llama-cpp.sh`
installs it; elsewhere (a developer's `make test`) they are skipped with the same message.
"""

from __future__ import annotations

import pytest

from gwproc import Gateway
from llamaproc import LlamaServer, llama_config, require_llama
from stubproc import wait_for


@pytest.fixture(scope="session")
def llama():
    require_llama()
    with LlamaServer(parallel=2, ctx=2048) as server:
        yield server


@pytest.fixture(scope="session")
def llama_gw(llama):
    with Gateway(llama_config(llama.base)) as gw:
        yield gw


@pytest.fixture
def idle_llama(llama, llama_gw):
    """The shared server with nothing running (a previous test's generation would skew this one's
    evidence), and the gateway holding no slot."""
    wait_for(llama.idle, timeout=30, interval=0.25)
    yield llama


# -- the real vLLM (tests/vllmproc.py): one server for every module that shares it --------------


@pytest.fixture(scope="session")
def vllm():
    from vllmproc import VllmServer, require_vllm

    require_vllm()
    with VllmServer() as server:
        yield server


@pytest.fixture(scope="session")
def vllm_gw(vllm):
    from vllmproc import vllm_config

    with Gateway(vllm_config(vllm.base)) as gw:
        yield gw


@pytest.fixture
def idle_vllm(vllm, vllm_gw):
    """The shared vLLM with nothing running or waiting, and the gateway holding no slot."""
    wait_for(vllm.idle, timeout=60, interval=0.1)
    wait_for(lambda: vllm_gw.admin()["backends"]["vllm"]["in_use"] == 0, timeout=30, interval=0.1)
    yield vllm
