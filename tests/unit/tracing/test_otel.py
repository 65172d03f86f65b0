"""tracing/otel.py: the collector's address, and when tracing is on at all."""

from __future__ import annotations

import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.tracing import otel


@pytest.mark.parametrize("given, want", [
    ("http://collector:4318", "http://collector:4318/v1/traces"),
    ("http://collector:4318/", "http://collector:4318/v1/traces"),
    ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
    ("https://otel.example/custom/path", "https://otel.example/custom/path"),  # a path given is kept
])
def test_a_bare_collector_address_gets_the_traces_path(given, want):
    assert otel.endpoint_url(given) == want


def test_off_without_an_endpoint_or_when_the_sdk_is_disabled(monkeypatch):
    assert otel.start(cfgmod.Tracing()) is None
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert otel.start(cfgmod.Tracing(otlp_endpoint="http://127.0.0.1:9")) is None


def test_on_with_an_endpoint(monkeypatch):
    pytest.importorskip("opentelemetry.sdk")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    tracer = otel.start(cfgmod.Tracing(otlp_endpoint="http://127.0.0.1:9"))
    try:
        assert isinstance(tracer, otel.Tracer) and tracer.endpoint == "http://127.0.0.1:9/v1/traces"
    finally:
        tracer.close()
