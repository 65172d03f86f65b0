"""Client keys: who may use the gateway, which models, how many requests at once.

With no keys configured the gateway is open (it says so at start-up). Keys are read from the
environment at start, compared in constant time against every configured key (no early exit that
would tell a prober how far it got), and never logged: only a key's name is.
"""

from __future__ import annotations

import fnmatch
import hmac
import os
from contextlib import asynccontextmanager
from typing import AsyncIterator

from aiohttp import web

from . import config as cfgmod
from .errors import GatewayError
from .exchange import ANONYMOUS, Principal
from .routing import Route


class _Key:
    __slots__ = ("name", "secret", "cfg", "principal")

    def __init__(self, cfg: cfgmod.AuthKey, secret: str) -> None:
        self.name = cfg.name
        self.secret = secret.encode()
        self.cfg = cfg
        self.principal = Principal(cfg.name, cfg.priority)


def _presented(request: web.Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key.strip()
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


class Auth:
    def __init__(self, cfg: cfgmod.Auth, env: dict[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        problems: list[str] = []
        self.keys: list[_Key] = []
        for i, k in enumerate(cfg.keys):
            secret = k.key if k.key is not None else env.get(k.key_env or "")
            if not secret:
                problems.append(f"auth.keys[{i}].key_env: environment variable {k.key_env!r} is not set")
                continue
            self.keys.append(_Key(k, secret))
        self.admin_secret: bytes | None = None
        if cfg.admin_key_env:
            admin = env.get(cfg.admin_key_env)
            if not admin:
                problems.append(f"auth.admin_key_env: environment variable {cfg.admin_key_env!r} is not set")
            else:
                self.admin_secret = admin.encode()
        if problems:
            raise cfgmod.ConfigError(problems)
        self._active: dict[str, int] = {}

    @property
    def open(self) -> bool:
        return not self.keys

    def _match(self, presented: str) -> _Key | None:
        given = presented.encode()
        found = None
        for k in self.keys:  # no early exit: every key is compared every time
            if hmac.compare_digest(k.secret, given):
                found = k
        return found

    def admit(self, request: web.Request, route: Route | None, dialect: str) -> Principal:
        if not self.keys:
            return ANONYMOUS
        presented = _presented(request)
        if presented is None:
            raise GatewayError(
                "authentication", "missing API key: send it as x-api-key or Authorization: Bearer"
            )
        key = self._match(presented)
        if key is None:
            raise GatewayError("authentication", "invalid API key")
        if route is not None and key.cfg.models is not None:
            names = (route.client_model, route.model)
            if not any(fnmatch.fnmatchcase(n, p) for p in key.cfg.models for n in names):
                raise GatewayError(
                    "permission", f"key {key.name!r} may not use model {route.client_model!r}", param="model"
                )
        request["principal_key"] = key
        return key.principal

    def limit_for(self, name: str) -> int | None:
        for k in self.keys:
            if k.name == name:
                return k.cfg.max_concurrent
        return None

    @asynccontextmanager
    async def hold(self, principal: Principal) -> AsyncIterator[None]:
        """Count a key's concurrent requests; over its max_concurrent -> 429 rate_limit."""
        limit = self.limit_for(principal.name) if principal.name else None
        active = self._active.get(principal.name, 0)
        if limit is not None and active >= limit:
            raise GatewayError(
                "rate_limit",
                f"key {principal.name!r} already has {active} requests running (its max_concurrent is {limit})",
                retry_after=1,
            )
        self._active[principal.name] = active + 1
        try:
            yield
        finally:
            self._active[principal.name] -= 1

    def is_admin(self, request: web.Request) -> bool:
        """The admin key when one is configured; with none, admin calls are allowed only when
        the gateway is open (no client keys), i.e. a loopback/LAN-trusted setup."""
        if self.admin_secret is None:
            return not self.keys
        presented = _presented(request)
        return presented is not None and hmac.compare_digest(self.admin_secret, presented.encode())
