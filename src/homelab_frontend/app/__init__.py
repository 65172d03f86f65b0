"""The running gateway: its typed state, the per-request lifecycle, routes, serve and signals, the demo."""
