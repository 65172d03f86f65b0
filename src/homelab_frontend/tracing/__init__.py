"""OpenTelemetry traces of requests, optional (`pip install homelab-frontend[otel]`, then
`tracing: {otlp_endpoint: ...}`). `traceparent.py` is the W3C header and a request's ids,
`spans.py` the spans planned from a finished request's record, `otel.py` the SDK export. With
tracing off nothing here is imported beyond this package's name."""
