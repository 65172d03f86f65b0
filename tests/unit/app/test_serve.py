"""Start-up helpers (app/serve.py): the open-gateway warning's loopback test, the one-line failure."""

from __future__ import annotations

import pytest

from homelab_frontend.app.serve import _loopback, fail


@pytest.mark.parametrize("host, loop", [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                        ("127.0.0.2", True), ("0.0.0.0", False), ("192.168.1.5", False),
                                        ("gpu-box.lan", False)])
def test_loopback(host, loop):
    assert _loopback(host) is loop


def test_fail_is_one_line_and_status_2(capsys):
    assert fail("cannot listen on 127.0.0.1:1: permission denied") == 2
    captured = capsys.readouterr()
    assert captured.err == "homelab-frontend: cannot listen on 127.0.0.1:1: permission denied\n"
    assert captured.out == ""
