"""The `homelab-frontend` command as a user runs it (the installed console script, a process):
`check` fails for what `serve` refuses (the environment included) and says each problem in one
line naming its key path, warns (exit 1) for what `serve` runs but is probably a mistake,
`--version` reads the package's metadata, `config-reference --write` regenerates the page, and a
reader that leaves early (`check ... | head`) ends it quietly."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import yaml

CLI = str(Path(sys.executable).with_name("homelab-frontend"))
ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HLF_CLI_")}
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60, env={**base, **(env or {})})


def write(tmp_path: Path, cfg: dict | str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(cfg if isinstance(cfg, str) else yaml.safe_dump(cfg, sort_keys=False))
    return str(path)


def serve(path: str, tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`serve` on a file it must refuse: it exits at once (2) with one line."""
    return run("serve", "--config", path, "--port", "0", env={"XDG_STATE_HOME": str(tmp_path / "state"), **(env or {})})


BASE = {"backends": {"gpu0": {"url": "http://127.0.0.1:9/v1", "kind": "vllm"}}, "models": {"m": {"backend": "gpu0"}}}


def test_version_from_the_package_metadata():
    for flag in ("--version", "-V"):
        done = run(flag)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"homelab-frontend {version('homelab-frontend')}"


def test_an_unset_key_variable_fails_check_as_it_fails_serve(tmp_path):
    cfg = {**copy.deepcopy(BASE), "auth": {"keys": [{"name": "alice", "key_env": "HLF_CLI_ALICE"}]}}
    cfg["backends"]["gpu0"]["api_key_env"] = "HLF_CLI_GPU0"
    path = write(tmp_path, cfg)
    done = run("check", "--config", path)
    assert done.returncode == 2 and done.stdout == ""
    problems = ["auth.keys[0].key_env: environment variable 'HLF_CLI_ALICE' is not set",
                "backends.gpu0.api_key_env: environment variable 'HLF_CLI_GPU0' is not set"]
    assert done.stderr.splitlines() == problems
    refused = serve(path, tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"homelab-frontend: invalid config: {'; '.join(problems)}"
    ok = run("check", "--config", path, env={"HLF_CLI_ALICE": "sk-a", "HLF_CLI_GPU0": "sk-g"})
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("config OK: listen 127.0.0.1:8080")


def test_a_key_given_twice_fails_check_and_serve_naming_path_and_lines(tmp_path):
    path = write(tmp_path, "backends:\n  gpu0:\n    url: http://127.0.0.1:9/v1\n    slots: 2\n"
                           "    slots: 4\nmodels:\n  m: {backend: gpu0}\n")
    line = "backends.gpu0.slots: given twice (lines 4 and 5): YAML keeps only the last; remove one"
    done = run("check", "--config", path)
    assert (done.returncode, done.stderr.splitlines()) == (2, [line])
    refused = serve(path, tmp_path)
    assert (refused.returncode, refused.stderr.strip()) == (2, f"homelab-frontend: invalid config: {line}")


def test_two_backends_on_one_url_warn_and_exit_1_with_the_table(tmp_path):
    cfg = {"backends": {"a": {"url": "http://127.0.0.1:9/v1", "slots": 4}, "b": {"url": "http://localhost:9/v1"}},
           "models": {"m": {"backends": ["a", "b"]}}}
    done = run("check", "--config", write(tmp_path, cfg))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "warning: backends.b.url: the same server as backends.a (http://localhost:9/v1): its slots are counted "
        "twice (4 + 8); fine only if the server runs 12 sequences at once"]
    assert done.stdout.startswith("config usable, with warnings: listen") and "m " in done.stdout


def test_an_ollama_url_without_v1_and_an_invalid_kind_are_errors(tmp_path):
    cfg = {"backends": {"ol": {"url": "http://127.0.0.1:11434", "kind": "ollama"},
                        "gpu": {"url": "http://127.0.0.1:8000/v1", "kind": "VLLM"}},
           "models": {"m": {"backends": ["ol", "gpu"]}}}
    done = run("check", "--config", write(tmp_path, cfg))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "backends.gpu.kind: invalid value 'VLLM' (valid: vllm, ollama, llamacpp, openai, whispercpp, peer)",
        "backends.ol.url: 'http://127.0.0.1:11434': Ollama serves its OpenAI-compatible API under /v1 "
        "(did you mean http://127.0.0.1:11434/v1?)",
    ]


def test_a_reader_that_leaves_early_ends_check_quietly(tmp_path):
    models = {f"model-{i:05d}": {"backend": "gpu0"} for i in range(4000)}  # a table well past a pipe's buffer
    path = write(tmp_path, {**BASE, "models": models})
    done = subprocess.run(["bash", "-c", f"set -o pipefail; '{CLI}' check --config '{path}' | head -1"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("config OK") and done.stdout.count("\n") == 1
    assert done.stderr == "", done.stderr  # no BrokenPipeError trace
    assert done.returncode == 141  # as a killed-by-SIGPIPE writer reports


def test_config_reference_rewrites_the_page_as_committed(tmp_path):
    page = tmp_path / "configuration.md"
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    head = committed.split("<!-- BEGIN config-reference", 1)[0]
    page.write_text(head + "<!-- BEGIN config-reference: stale -->\nold rows\n<!-- END config-reference -->\n")
    done = run("config-reference", "--write", str(page))
    assert done.returncode == 0, done.stderr
    assert page.read_text(encoding="utf-8") == committed


def test_serve_runs_a_config_with_warnings_and_logs_them():
    from gwproc import Gateway, config_for

    cfg = config_for({"a": {"url": "http://127.0.0.1:9/v1", "slots": 4}, "b": {"url": "http://localhost:9/v1"}},
                     {"m": {"backends": ["a", "b"]}})
    with Gateway(cfg) as gw:
        assert gw.get("/healthz")[0] == 200
        assert ("config: backends.b.url: the same server as backends.a (http://localhost:9/v1): its slots are "
                "counted twice (4 + 8)") in gw.stderr()
