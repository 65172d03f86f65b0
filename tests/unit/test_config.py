"""Config validation: one line per problem, each naming its key path."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from homelab_frontend import config as cfgmod
from homelab_frontend.lifecycle.supervisor import DEATH_GRACE_S
from homelab_frontend.policy.routing import resolve_alias
from support.scale import examples

GOOD = """
listen: {host: 127.0.0.1, port: 8080}
backends:
  gpu0: {url: "http://127.0.0.1:8000/v1", slots: 8, api_key_env: GPU0_KEY}
models:
  reasoning: {backend: gpu0, upstream_model: deepseek-ai/DeepSeek-R1-Distill-Qwen-32B}
  small: {backends: [gpu0]}
aliases:
  "claude-*": reasoning
"""


def test_good_config_and_defaults(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(GOOD)
    cfg = cfgmod.load(p)
    assert cfg.backends["gpu0"].slots == 8
    assert cfg.backends["gpu0"].queue.depth == 32 and cfg.backends["gpu0"].timeouts.total_s is None
    assert cfg.models["small"].backend_names() == ["gpu0"]
    assert resolve_alias(cfg, "claude-opus-4-8") == "reasoning"
    assert resolve_alias(cfg, "reasoning") == "reasoning"
    assert resolve_alias(cfg, "gpt-4") is None


@pytest.mark.parametrize(
    "raw,expected",
    [
        ({"backends": {"g": {"url": "http://h/v1", "bogus": 1}}}, "backends.g.bogus: unknown key"),
        ({"backends": {"g": {"url": "http://h/v1", "slots": "8"}}}, "backends.g.slots: expected `int`, got `str` ('8')"),
        ({"backends": {"g": {"url": "ftp://h"}}}, "backends.g.url: 'ftp://h' is not an http(s) URL"),
        ({"backends": {"g": {"url": "http://h/v1"}}, "models": {"reasoning": {"backend": "gpu9"}}},
         "models.reasoning.backend: no backend named 'gpu9'"),
        ({"backends": {"g": {"url": "http://h/v1", "slots": 0}}}, "backends.g.slots: must be at least 1, got 0"),
        ({"listen": {"port": "x"}}, "listen.port: expected `int`, got `str` ('x')"),
        ({"whatever": 1}, "whatever: unknown key"),
        ({"backends": {"g": {"url": "http://h/v1"}}, "models": {"m": {"backend": "g"}}, "aliases": {"c-*": "nope"}},
         "aliases.c-*: no model named 'nope'"),
    ],
)
def test_each_problem_names_its_key_path(raw, expected):
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse(raw)
    assert expected in ei.value.problems


def test_all_problems_reported_at_once():
    raw = {"listen": {"port": "x"}, "backends": {"a": {"url": "nope"}, "b": {"url": "http://h/v1", "slots": -1}},
           "models": {"m": {"backend": "zz"}}}
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse(raw)
    assert len(ei.value.problems) == 4


def test_check_cli(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    r = subprocess.run([sys.executable, "-m", "homelab_frontend", "check", "--config", str(good)],
                       capture_output=True, text=True, env={**os.environ, "GPU0_KEY": "k"})
    assert r.returncode == 0, r.stderr
    assert "reasoning" in r.stdout and "gpu0" in r.stdout and "claude-*" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("backends:\n  g: {url: 'http://h/v1', slots: two}\nmodels:\n  reasoning: {backend: gpu9}\n")
    r = subprocess.run([sys.executable, "-m", "homelab_frontend", "check", "--config", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert "models.reasoning.backend: no backend named 'gpu9'" in lines
    assert any(line.startswith("backends.g.slots:") for line in lines)
    bad.write_text("backends: [\n")
    r = subprocess.run([sys.executable, "-m", "homelab_frontend", "check", "--config", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "not valid YAML" in r.stderr


def test_system_turns_per_model_default_merge_and_only_known_values():
    base = {"backends": {"g": {"url": "http://h/v1"}}}
    cfg = cfgmod.parse({**base, "models": {"a": {"backend": "g"}, "b": {"backend": "g", "system_turns": "native"}}})
    assert cfg.models["a"].system_turns == "merge" and cfg.models["b"].system_turns == "native"
    with pytest.raises(cfgmod.ConfigError) as info:
        cfgmod.parse({**base, "models": {"a": {"backend": "g", "system_turns": "inline"}}})
    assert info.value.problems[0].startswith("models.a.system_turns:")


def test_claude_aliases_catch_the_newest_model_names():
    cfg = cfgmod.parse({"backends": {"g": {"url": "http://h/v1"}}, "models": {"r": {"backend": "g"}, "q": {"backend": "g"}},
                        "aliases": {"claude-*haiku*": "q", "claude-*": "r"}})
    assert resolve_alias(cfg, "claude-opus-5-5") == "r"
    assert resolve_alias(cfg, "claude-haiku-5-5") == "q"


def test_affinity_is_on_by_default_and_off_per_model():
    cfg = cfgmod.parse({"backends": {"a": {"url": "http://127.0.0.1:1/v1"}, "b": {"url": "http://127.0.0.1:2/v1"}},
                        "models": {"m": {"backends": ["a", "b"]}, "n": {"backends": ["a", "b"], "affinity": False}}})
    assert cfg.models["m"].affinity is True and cfg.models["m"].affinity_max_wait_s == 2.0
    assert cfg.models["n"].affinity is False
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.parse({"backends": {"a": {"url": "http://127.0.0.1:1/v1"}},
                      "models": {"m": {"backend": "a", "affinity_max_wait_s": -1}, "k": {"backend": "a", "affinity": "yes"}}})
    assert "models.m.affinity_max_wait_s: must be 0 or more, got -1" in err.value.problems
    assert any(p.startswith("models.k.affinity") for p in err.value.problems), err.value.problems


@pytest.mark.parametrize("models,expected", [
    ({"a": {"backend": "g", "fallback": "a"}}, "models.a.fallback: a loop (a -> a)"),
    ({"a": {"backend": "g", "fallback": "b"}, "b": {"backend": "g", "fallback": "a"}},
     "models.b.fallback: a loop (b -> a -> b)"),
    ({"a": {"backend": "g", "fallback": "zz"}}, "models.a.fallback: no model named 'zz'"),
])
def test_fallback_problems(models, expected):
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse({"backends": {"g": {"url": "http://h/v1"}}, "models": models})
    assert expected in ei.value.problems


def test_a_fallback_chain_without_a_loop_is_fine():
    cfg = cfgmod.parse({"backends": {"g": {"url": "http://h/v1"}},
                        "models": {"a": {"backend": "g", "fallback": "b"}, "b": {"backend": "g", "fallback": "c"},
                                   "c": {"backend": "g"}}})
    assert cfg.models["a"].fallback == "b"


def test_model_capabilities_for_ollamas_show_only_known_names():
    base = {"backends": {"g": {"url": "http://h/v1"}}}
    cfg = cfgmod.parse({**base, "models": {"a": {"backend": "g"}, "b": {"backend": "g", "capabilities": ["completion", "tools"]}}})
    assert cfg.models["a"].capabilities is None and cfg.models["b"].capabilities == ["completion", "tools"]
    with pytest.raises(cfgmod.ConfigError) as info:
        cfgmod.parse({**base, "models": {"a": {"backend": "g", "capabilities": ["tools", "telepathy"]}}})
    assert info.value.problems == [
        "models.a.capabilities[1]: unknown capability 'telepathy' "
        "(known: completion, tools, thinking, vision, embedding, insert, audio, speech, transcription, rerank, image)"]


# -- managed backends (run:) ------------------------------------------------------------------

def _managed(run: dict, **extra) -> dict:
    return {"resources": {"gpu0": 24}, "backends": {"coder": {"url": "http://127.0.0.1:9101/v1", "run": run}},
            **extra}


def test_run_section_defaults_and_a_string_cmd_split_like_a_shell():
    cfg = cfgmod.parse(_managed({"cmd": "llama-server -m '/models/my coder.gguf' --port 9101", "uses": {"gpu0": 18}}))
    run = cfg.backends["coder"].run
    assert run.argv() == ["llama-server", "-m", "/models/my coder.gguf", "--port", "9101"]
    assert (run.start_timeout_s, run.stop_timeout_s, run.idle_ttl_s, run.unload, run.preload) == (300, 15, None, "stop", False)
    assert cfg.lifecycle.policy == "batch" and cfg.resources == {"gpu0": 24}
    # the kill grace on the gateway's death is the supervisor's own default (which the config
    # layer cannot import: a script the gateway never imports)
    assert run.kill_grace_s == DEATH_GRACE_S


@pytest.mark.parametrize(
    "run,expected",
    [
        ({"cmd": ["x"], "bogus": 1}, "backends.coder.run.bogus: unknown key"),
        ({"cmd": ["x"], "uses": {"gpu1": 4}}, "backends.coder.run.uses.gpu1: no such resource (resources: gpu0)"),
        ({"cmd": ["x"], "uses": {"gpu0": 30}}, "backends.coder.run.uses.gpu0: 30 is more than all of it (24): "
                                                "this backend could never start"),
        ({"cmd": []}, "backends.coder.run.cmd: empty (which program runs this backend?)"),
        ({"cmd": "llama-server 'unbalanced"}, "backends.coder.run.cmd: cannot split \"llama-server 'unbalanced\" "
                                               "like a shell would: No closing quotation"),
        ({"cmd": ["x"], "start_timeout_s": 0}, "backends.coder.run.start_timeout_s: must be more than 0, got 0"),
        ({"cmd": ["x"], "idle_ttl_s": -1}, "backends.coder.run.idle_ttl_s: must be more than 0, got -1"),
        ({"cmd": ["x"], "kill_grace_s": -1}, "backends.coder.run.kill_grace_s: must be 0 or more, got -1"),
        ({"cmd": ["x"], "kill_grace_s": float("inf")}, "backends.coder.run.kill_grace_s: must be a finite number of seconds, 0 or more"),
        ({"cmd": ["x"], "unload": "sleep"}, "backends.coder.run.unload: sleep is vLLM's sleep mode: it needs "
                                             "`kind: vllm` on the backend (got no kind)"),
        ({"cmd": ["x"], "unload": "pause"}, "backends.coder.run.unload: invalid value 'pause' (valid: stop, sleep)"),
        ({"cmd": ["x"], "ready_url": "nope"}, "backends.coder.run.ready_url: 'nope' is not an http(s) URL"),
    ],
)
def test_run_problems_name_their_key_path(run, expected):
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse(_managed(run))
    assert expected in ei.value.problems, ei.value.problems


def test_run_env_values_are_strings():
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse(_managed({"cmd": ["x"], "env": {"A": 1}}))
    [problem] = ei.value.problems
    assert problem == "backends.coder.run.env.A: expected `str`, got `int` (1)"


def test_lifecycle_section_and_resources_are_checked():
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse({"resources": {"gpu0": -1}, "lifecycle": {"policy": "lru", "swap_after_s": 5}})
    assert "resources.gpu0: must be 0 or more, got -1" in ei.value.problems
    assert "lifecycle.policy: invalid value 'lru' (valid: batch, fifo)" in ei.value.problems


def test_check_validates_run_without_requiring_its_files_and_prints_the_plan(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("""
resources: {gpu0: 24}
backends:
  coder: {url: "http://127.0.0.1:9101/v1", run: {cmd: [/no/such/llama-server, -m, /no/such.gguf], uses: {gpu0: 18}}}
  chat: {url: "http://127.0.0.1:9102/v1", run: {cmd: [/no/such/llama-server], uses: {gpu0: 12}, idle_ttl_s: 600}}
  tiny: {url: "http://127.0.0.1:9103/v1", run: {cmd: [/no/such/llama-server], uses: {gpu0: 4}}}
models:
  coder: {backend: coder}
""")
    out = subprocess.run([sys.executable, "-m", "homelab_frontend", "check", "--config", str(p)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "gpu0             24  (used by: coder 18, chat 12, tiny 4)" in out.stdout
    assert "coder + chat (gpu0: 30 > 24)" in out.stdout
    assert "coder + tiny" not in out.stdout and "idle_ttl 600s" in out.stdout


def test_a_front_with_peers_and_no_models_is_valid():
    cfg = cfgmod.parse({"backends": {"box1": {"url": "http://10.0.0.2:8080/llm/v1", "kind": "peer",
                                              "api_key_env": "BOX1_KEY", "peer": {"models": ["qwen*"]}}},
                        "aliases": {"claude-*": "qwen3-8b"},  # a peer's model: known only at run time
                        "auth": {"keys": [{"name": "front", "key": "k", "peer": True}]}})
    assert cfg.models == {} and cfg.backends["box1"].peer.models == ["qwen*"]
    assert cfg.auth.keys[0].peer is True


def test_peer_problems_name_their_keys():
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.parse({"backends": {"box1": {"url": "http://h/llm/v1", "kind": "peer", "run": {"cmd": "x"}}}})
    assert "backends.box1.run: a peer runs its own servers" in str(err.value)
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.parse({"backends": {"box1": {"url": "http://h/llm/v1", "kind": "peer", "peer": {"start_penalty_s": -1}}}})
    assert "backends.box1.peer.start_penalty_s" in str(err.value)
    with pytest.raises(cfgmod.ConfigError) as err:  # without a peer an alias must name a model
        cfgmod.parse({"backends": {"a": {"url": "http://h/v1"}}, "aliases": {"x": "nope"}})
    assert "aliases.x: no model named 'nope'" in str(err.value)


# -- what `check` and `serve` both ask ------------------------------------------------------------


def test_a_key_given_twice_is_refused_at_any_depth_with_its_path_and_lines(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("backends:\n"
                 "  gpu0:\n"
                 "    url: http://h/v1\n"
                 "    slots: 4\n"
                 "    slots: 8\n"
                 "models:\n"
                 "  m: {backend: gpu0}\n"
                 "auth:\n"
                 "  keys:\n"
                 "    - {name: a, key: x, name: b}\n"
                 "models:\n"
                 "  n: {backend: gpu0}\n")
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.load(p)
    assert ei.value.problems == [
        "backends.gpu0.slots: given twice (lines 4 and 5): YAML keeps only the last; remove one",
        "auth.keys[0].name: given twice (lines 10 and 10): YAML keeps only the last; remove one",
        "models: given twice (lines 6 and 11): YAML keeps only the last; remove one",
    ]


def test_anchors_and_merge_keys_are_not_duplicates(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("backends:\n"
                 "  a: &a {url: 'http://h1/v1', slots: 2}\n"
                 "  b: {<<: *a, url: 'http://h2/v1'}\n"
                 "models:\n"
                 "  m: {backends: [a, b]}\n")
    cfg = cfgmod.load(p)
    assert cfg.backends["b"].slots == 2 and cfg.backends["b"].url == "http://h2/v1"


def test_every_variable_the_config_names_must_be_set():
    cfg = cfgmod.parse({
        "backends": {"g": {"url": "http://h/v1", "api_key_env": "G_KEY"}},
        "models": {"m": {"backend": "g"}},
        "auth": {"keys": [{"name": "a", "key_env": "A_KEY"}, {"name": "b", "key": "literal"}],
                 "admin_key_env": "ADMIN_KEY"},
        "anthropic": {"signing_key_env": "SIGN_KEY"},
    })
    assert cfgmod.environment_problems(cfg, {}) == [
        "auth.keys[0].key_env: environment variable 'A_KEY' is not set",
        "auth.admin_key_env: environment variable 'ADMIN_KEY' is not set",
        "backends.g.api_key_env: environment variable 'G_KEY' is not set",
        "anthropic.signing_key_env: environment variable 'SIGN_KEY' is not set "
        "(leave the key out for a random secret per process)",
    ]
    every = {"G_KEY": "g", "A_KEY": "a", "ADMIN_KEY": "r", "SIGN_KEY": "s"}
    assert cfgmod.environment_problems(cfg, every) == []
    assert cfgmod.environment_problems(cfg, {**every, "A_KEY": ""})[0].startswith("auth.keys[0].key_env:")


@pytest.mark.parametrize("kind,url,ok", [
    ("ollama", "http://127.0.0.1:11434", False),
    ("ollama", "http://127.0.0.1:11434/", False),
    ("ollama", "http://127.0.0.1:11434/api", False),
    ("ollama", "http://127.0.0.1:11434/v1/", True),
    ("vllm", "http://127.0.0.1:8000", False),
    ("vllm", "http://proxy/gpu0/v1", True),
    ("llamacpp", "http://127.0.0.1:8080", True),  # llama-server answers without /v1 as well
    ("openai", "https://example.com/openai", True),
    (None, "http://127.0.0.1:8000", True),  # unknown until detected
])
def test_kinds_that_serve_only_under_v1_need_it_in_the_url(kind, url, ok):
    raw = {"backends": {"g": {"url": url, **({"kind": kind} if kind else {})}}, "models": {"m": {"backend": "g"}}}
    if ok:
        cfgmod.parse(raw)
        return
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse(raw)
    [problem] = ei.value.problems
    assert problem.startswith(f"backends.g.url: {url!r}: ") and "under /v1" in problem
    assert f"did you mean {url.rstrip('/')}/v1?" in problem


def test_two_backends_on_one_server_are_a_warning_naming_both():
    cfg = cfgmod.parse({"backends": {"a": {"url": "http://localhost:8000/v1", "slots": 4},
                                     "b": {"url": "http://127.0.0.1:8000/v1/", "slots": 8},
                                     "c": {"url": "http://127.0.0.1:8001/v1"}},
                        "models": {"m": {"backends": ["a", "b", "c"]}}})
    assert cfgmod.warnings(cfg) == [
        "backends.b.url: the same server as backends.a (http://127.0.0.1:8000/v1/): its slots are counted twice "
        "(4 + 8); fine only if the server runs 12 sequences at once"]
    assert cfgmod.warnings(cfgmod.parse({})) == []


def test_an_invalid_enum_value_names_the_valid_ones():
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse({"backends": {"g": {"url": "http://h/v1", "kind": "VLLM"}}, "models": {"m": {"backend": "g"}}})
    assert ei.value.problems == ["backends.g.kind: invalid value 'VLLM' (valid: vllm, ollama, llamacpp, openai, whispercpp, peer)"]


@pytest.mark.parametrize("raw,expected", [
    ({"lifecycle": {"polcy": "batch"}}, "lifecycle.polcy: unknown key (did you mean 'policy'?)"),
    ({"backends": {"g": {"url": "http://h/v1", "slot": 2}}}, "backends.g.slot: unknown key (did you mean 'slots'?)"),
    ({"auth": {"keys": [{"name": "a", "key": "k", "budget": {"tokens_per_dya": 1}}]}},
     "auth.keys[0].budget.tokens_per_dya: unknown key (did you mean 'tokens_per_day'?)"),
    ({"zzz": 1}, "zzz: unknown key"),
    ({"resources": {"gpu0": 24, "gpu1": "lots"}}, "resources.gpu1: expected `float`, got `str` ('lots')"),
])
def test_an_unknown_key_suggests_the_nearest_and_a_bad_value_is_shown(raw, expected):
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse(raw)
    assert expected in ei.value.problems, ei.value.problems


def test_an_empty_literal_key_is_refused():
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse({"auth": {"keys": [{"name": "a", "key": ""}]}})
    assert ei.value.problems == ["auth.keys[0].key: must not be empty"]


def test_every_problem_of_one_section_is_said_not_only_msgspecs_first():
    raw = {"backends": {"g": {"url": "http://h/v1", "slots": 0, "queue": {"depth": -1, "timeout_s": "x"},
                              "timeouts": {"idle_s": 0}, "bogus": 1}},
           "usage": {"retention_days": 7, "flush_interval_s": 11}, "models": {"m": {"backend": "g"}}}
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse(raw)
    assert sorted(ei.value.problems) == sorted([
        "backends.g.slots: must be at least 1, got 0",
        "backends.g.queue.depth: must be 0 or more, got -1",
        "backends.g.queue.timeout_s: expected `float`, got `str` ('x')",
        "backends.g.timeouts.idle_s: must be more than 0, got 0",
        "backends.g.bogus: unknown key",
        "usage.retention_days: must be at least 32, got 7",
        "usage.flush_interval_s: must be at most 10, got 11",
    ])


def test_a_required_value_that_is_wrong_is_said_once():
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse({"backends": {"g": {"url": 3, "slots": 0}}})
    assert ei.value.problems == ["backends.g.url: expected `str`, got `int` (3)",
                                 "backends.g.slots: must be at least 1, got 0"]  # and no "url: missing"


def test_a_kindless_url_on_ollamas_port_without_v1_is_a_warning():
    cfg = cfgmod.parse({"backends": {"o": {"url": "http://box:11434"}, "p": {"url": "http://box:11434/v1"}},
                        "models": {"m": {"backends": ["o", "p"]}}})
    assert cfgmod.warnings(cfg) == [
        "backends.o.url: 'http://box:11434' is Ollama's port, and Ollama serves its OpenAI-compatible API under /v1 "
        "(did you mean http://box:11434/v1?)"]


# each field with a range, a value outside it, and the line that says so
_OUT_OF_RANGE = {
    "slots": (0, "must be at least 1, got 0"),
    "queue.depth": (-3, "must be 0 or more, got -3"),
    "queue.timeout_s": (-1.5, "must be 0 or more, got -1.5"),
    "timeouts.connect_s": (0, "must be more than 0, got 0"),
    "timeouts.idle_s": (-2, "must be more than 0, got -2"),
    "timeouts.total_s": (0, "must be more than 0, got 0"),
    "limits.max_line_bytes": (100, "must be at least 1024, got 100"),
    "run.sleep_level": (3, "must be at most 2, got 3"),
    "run.backoff_s": (0, "must be more than 0, got 0"),
}


@settings(max_examples=examples(60), deadline=None)
@given(st.sets(st.sampled_from(sorted(_OUT_OF_RANGE))))
def test_each_value_out_of_range_is_said_once_whatever_else_is_wrong(bad):
    backend: dict = {"url": "http://h/v1", "kind": "vllm", "run": {"cmd": ["x"]}}
    for key in bad:
        *outer, last = key.split(".")
        node = backend
        for part in outer:
            node = node.setdefault(part, {})
        node[last] = _OUT_OF_RANGE[key][0]
    raw = {"backends": {"g": backend}, "models": {"m": {"backend": "g"}}}
    if not bad:
        cfgmod.parse(raw)
        return
    with pytest.raises(cfgmod.ConfigError) as ei:
        cfgmod.parse(raw)
    assert sorted(ei.value.problems) == sorted(f"backends.g.{k}: {_OUT_OF_RANGE[k][1]}" for k in bad)


def test_relayed_endpoints_config_health_path_paths_and_upload_limits():
    base = {"backends": {"w": {"url": "http://h:1", "kind": "whispercpp", "paths": {"transcriptions": "/asr"},
                               "health_path": "/health"}},
            "models": {"whisper-1": {"backend": "w", "capabilities": ["transcription"]}}}
    cfg = cfgmod.parse(base)
    assert cfg.backends["w"].paths == {"transcriptions": "/asr"}
    assert cfg.limits.max_upload_bytes == 25 * 1024 * 1024 and cfg.limits.max_form_head_bytes == 1024 * 1024
    with pytest.raises(cfgmod.ConfigError) as info:
        cfgmod.parse({**base, "backends": {"w": {"url": "http://h:1", "paths": {"transcribe": "/x", "speech": "y"},
                                                 "health_path": "health"}},
                      "limits": {"max_upload_bytes": 10}})
    assert info.value.problems == [
        "limits.max_upload_bytes: must be at least 1024, got 10",
        "backends.w.health_path: 'health' must be a path from the server's root, starting with /",
        "backends.w.paths.transcribe: no such endpoint (known: rerank, rerank_v2, score, transcriptions, "
        "translations, speech, voices, audio_models, image_generations, image_edits)",
        "backends.w.paths.speech: 'y' must be a path from the server's root, starting with /"]
