"""For the operator: metrics, the access log, the admin API, backend health probes, the dashboard."""
