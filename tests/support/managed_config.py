"""Configs of managed backends for the lifecycle unit tests (operator.py, following.py, reload.py)."""

from __future__ import annotations

from homelab_frontend import config as cfgmod


def config(run: dict | None = None, **backends) -> cfgmod.Config:
    """Managed backends named by keyword, each `run` dict merged over a small default; a value of
    None makes that backend unmanaged (a plain URL)."""
    out = {}
    for name, extra in backends.items():
        b: dict = {"url": f"http://127.0.0.1:9/{name}/v1"}
        if extra is not None:
            b["run"] = {"cmd": [name], "uses": {"gpu": 1}, **(run or {}), **extra}
        out[name] = b
    return cfgmod.parse({"backends": out, "models": {n: {"backend": n} for n in backends},
                         "resources": {"gpu": 1}})
