"""Shared fixtures: real stub upstreams and a real gateway process on free loopback ports."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings

import fastset
import xdist_groups
from gwproc import Gateway, config_for
from stubproc import start_stub, wait_for

R1 = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
QWEN = "qwen2.5:3b-instruct"


@pytest.fixture(scope="session")
def tmpdir_session():
    return tempfile.mkdtemp(prefix="hlf-tests-")


@pytest.fixture(scope="session")
def vllm_stub(tmpdir_session):
    log = os.path.join(tmpdir_session, "stub-reasoning.log")
    with start_stub("vllm", "--reasoning", "--model", R1, "--max-model-len", "4096", log_path=log) as s:
        yield s


@pytest.fixture(scope="session")
def ollama_stub(tmpdir_session):
    log = os.path.join(tmpdir_session, "stub-ollama.log")
    with start_stub("ollama", "--model", QWEN, log_path=log) as s:
        yield s


def standard_config(vllm_url: str, ollama_url: str, **extra) -> dict:
    return config_for(
        {
            "gpu0": {"url": vllm_url, "kind": "vllm", "slots": 8},
            "ollama": {"url": ollama_url, "kind": "ollama", "slots": 4},
        },
        {
            "reasoning": {"backend": "gpu0", "upstream_model": R1},
            QWEN: {"backend": "ollama"},
        },
        aliases={"claude-*haiku*": QWEN, "claude-*": "reasoning"},
        **extra,
    )


@pytest.fixture(scope="session")
def gateway(vllm_stub, ollama_stub):
    with Gateway(standard_config(vllm_stub.base, ollama_stub.base)) as gw:
        yield gw


@pytest.fixture
def stubs(vllm_stub, ollama_stub, request):
    """Both stubs with fresh counters (and the vLLM stub's request record) for this test; and,
    for a test on the shared gateway, both backends up there: a test before it (any module, in
    whatever order a worker runs them) may have had a stub drop connections, which marks the
    backend down until its re-probe."""
    vllm_stub.fail()  # a failure mode a test left set
    ollama_stub.fail()
    vllm_stub.reset()
    ollama_stub.reset()
    if "gateway" in request.fixturenames:
        gw = request.getfixturevalue("gateway")
        wait_for(lambda: all(b["up"] for b in gw.admin()["backends"].values()), 30, 0.05)
    return vllm_stub, ollama_stub


# -- the parallel run (tests/xdist_groups.py) ------------------------------------------------------


REAL_DIRS = ("tests/real/", "tests/e2e/")  # every test there drives a real server or a CLI


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks, and before `-m` selects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(REAL_DIRS):
            item.add_marker(pytest.mark.real)
    xdist_groups.assign(items)


def pytest_configure(config):
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no":
        config.pluginmanager.register(xdist_groups.GroupClock(config), "hlf-group-clock")
    config.pluginmanager.register(xdist_groups.NodeIdSuffix(), "hlf-group-suffix")
    # Hypothesis's per-example deadline and its too-slow health check are timings: on a busy
    # machine (the suite runs on several workers beside other work) they fail a correct property.
    settings.register_profile("busy", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("busy")
    if fastset.active():
        fastset.install()
        config.pluginmanager.register(fastset.Guard(), "hlf-fast-guard")
        # fewer examples for the property tests that set no count of their own
        settings.register_profile("fast", settings.get_profile("busy"), max_examples=25)
        settings.load_profile("fast")


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") == "loadgroup":
        return xdist_groups.make_scheduler(config, log)
    return None
