"""The command line (cli.py): `check` prints the routing table or one line per problem."""

from __future__ import annotations

import argparse

import yaml

from homelab_frontend.cli import build_parser, main


def test_check_prints_the_routing_table(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "listen": {"host": "127.0.0.1", "port": 8099},
        "backends": {"a": {"url": "http://127.0.0.1:9/v1", "slots": 3}, "b": {"url": "http://127.0.0.1:8/v1"}},
        "models": {"big": {"backends": ["a", "b"]}, "small": {"backend": "a", "upstream_model": "org/s"}},
        "aliases": {"gpt-*": "small"},
    }))
    assert main(["check", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "config OK: listen 127.0.0.1:8099" in out
    assert "slots=3" in out and "session affinity" in out and "(upstream model org/s)" in out
    assert "gpt-*" in out


def test_check_lists_every_problem_one_a_line_and_exits_2(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"backends": {"a": {"url": "http://127.0.0.1:9/v1", "slots": 0}},
                                    "models": {"m": {"backend": "zz"}}}))
    assert main(["check", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and any("backends.a.slots" in ln for ln in err) and any("models.m.backend" in ln for ln in err)


def test_every_option_of_every_command_says_what_it_does():
    parser = build_parser(with_stub=True)
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    commands = {c.dest: c.help for c in sub._choices_actions}
    assert set(commands) == {"serve", "check", "usage", "demo", "stub", "config-reference"}
    assert all(commands.values()), commands
    assert "llama.cpp" in commands["stub"]  # all three flavours named
    for name, command in sub.choices.items():
        for action in command._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {'/'.join(action.option_strings)} has no help text"
