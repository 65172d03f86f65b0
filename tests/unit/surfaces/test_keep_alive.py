"""surfaces/keep_alive.py: a `keep_alive` found at the top of any dialect's body (nowhere else),
a value that is no duration a 400 naming the field, and only the route's managed backends told."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.lifecycle.keep_alive import FOREVER
from homelab_frontend.surfaces import keep_alive


@pytest.mark.parametrize("body, expected", [
    (b'{"model": "m", "messages": []}', None),
    (b'{"model": "m", "keep_alive": "5m"}', 300.0),
    (b'{"model": "m", "keep_alive": -1}', FOREVER),
    (b'{"model": "m", "keep_alive": 0, "stream": true}', 0.0),
    (b'{"model": "m", "keep_alive": null}', None),
    # only the top level counts: a message that talks about it is no request to keep anything
    (b'{"model": "m", "messages": [{"role": "user", "content": "\\"keep_alive\\": 5"}], "x": {"keep_alive": 9}}', None),
    (b'[{"keep_alive": 5}]', None),  # not an object: the dialect's own parser refuses it
])
def test_the_top_level_field_of_any_body(body, expected):
    assert keep_alive.from_body(body) == expected


@pytest.mark.parametrize("value", [b'"soon"', b'true', b'{}', b'[1]'])
def test_a_value_that_is_no_duration_is_a_400_naming_the_field(value):
    with pytest.raises(GatewayError) as err:
        keep_alive.from_body(b'{"model": "m", "keep_alive": ' + value + b'}')
    assert err.value.kind == "invalid_request" and err.value.param == "keep_alive"
    assert err.value.message.startswith("keep_alive: expected")


class _Fleet:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def managed(self, name):
        return name == "run"

    def keep_alive(self, name, asked, *, prompt=True):
        self.calls.append((name, asked, prompt))


def test_only_the_routes_managed_backends_are_told_and_only_when_asked():
    fleet = _Fleet()
    gw = SimpleNamespace(fleet=fleet)
    route = SimpleNamespace(backends=[SimpleNamespace(name="static"), SimpleNamespace(name="run")])
    keep_alive.apply(gw, route, None)
    assert fleet.calls == []
    keep_alive.apply(gw, route, 60.0)
    keep_alive.apply(gw, route, 0.0, prompt=False)
    assert fleet.calls == [("run", 60.0, True), ("run", 0.0, False)]
