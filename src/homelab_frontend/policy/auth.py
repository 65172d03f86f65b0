"""Client keys: who may use the gateway, which models, how many requests at once.

With no keys configured the gateway is open (it says so at start-up). Keys are read from the
environment at start, compared in constant time against every configured key (no early exit that
would tell a prober how far it got, and both sides hashed first so that not even the length of a
key shows in the timing), and never logged: only a key's name is.

Order of checks on a surface request: the key (401) before the body is even read, so that a
stranger cannot make the gateway parse anything; the model (403) once the body names one; the
key's `max_concurrent` (429) just before the request asks for a slot.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import os
from contextlib import asynccontextmanager
from typing import AsyncIterator, Mapping

from aiohttp import web

from .. import config as cfgmod
from ..errors import GatewayError
from .routing import Route


class Principal:
    """Who is asking: an API key's name and its queue priority (anonymous when keys are off).
    Through a front gateway (a key marked `peer`): the person the front admitted, `via` that
    key's name, and `pin` the backend of ours whose slot the front holds for the request."""

    __slots__ = ("name", "priority", "via", "pin")

    def __init__(self, name: str = "", priority: int = 0, via: str | None = None, pin: str | None = None) -> None:
        self.name = name
        self.priority = priority
        self.via = via
        self.pin = pin


ANONYMOUS = Principal()

# What a front gateway tells a peer with each request (docs/several-boxes.md), believed only from
# a key marked `peer: true` in the peer's auth.keys; from any other key they are ignored.
PERSON_HEADER = "x-hlf-on-behalf-of"  # the name of the key the front admitted
BACKEND_HEADER = "x-hlf-peer-backend"  # the peer's backend whose slot the front holds for it
_NAME_MAX = 128


def _through_peer(key: "_Key", request: web.Request) -> Principal:
    """A peer key's request: the person it names (a printable name of at most 128 characters;
    anything else, or none, leaves the front's own key as the one counted)."""
    person = request.headers.get(PERSON_HEADER, "").strip()
    pin = request.headers.get(BACKEND_HEADER, "").strip() or None
    if not person or len(person) > _NAME_MAX or not person.isprintable():
        return Principal(key.name, key.cfg.priority, pin=pin)
    return Principal(person, key.cfg.priority, via=key.name, pin=pin)


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


class _Key:
    __slots__ = ("name", "digest", "cfg", "principal")

    def __init__(self, cfg: cfgmod.AuthKey, secret: str) -> None:
        self.name = cfg.name
        self.digest = _digest(secret)
        self.cfg = cfg
        self.principal = Principal(cfg.name, cfg.priority)


_PRINCIPAL = web.RequestKey("principal_key", _Key)  # the matched key, set once per request
_THROUGH = web.RequestKey("principal_through_peer", Principal)  # a peer key's request: who it is for


def _presented(request: web.Request, *, query_key: bool = False) -> str | None:
    """The key as the client sent it: `x-api-key` (Anthropic), `Authorization: Bearer` (OpenAI),
    `x-goog-api-key`, and on the Gemini routes alone (`query_key`) the `key` query parameter,
    which Google's clients send. Anywhere else a key in the URL is not taken: URLs end up in proxy
    logs, shell and browser history, and no other dialect's clients put one there."""
    for name in ("x-api-key", "x-goog-api-key"):
        key = request.headers.get(name)
        if key and key.strip():
            return key.strip()
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if query_key:
        key = request.query.get("key")
        if key and key.strip():
            return key.strip()
    return None


class Auth:
    def __init__(self, cfg: cfgmod.Auth, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        problems = cfgmod.auth_environment_problems(cfg, env)  # the rule `check` applies too
        if problems:
            raise cfgmod.ConfigError(problems)
        self.keys = [_Key(k, k.key if k.key is not None else env[k.key_env or ""]) for k in cfg.keys]
        self.admin_digest = _digest(env[cfg.admin_key_env]) if cfg.admin_key_env else None
        self._active: dict[str, int] = {}

    def inherit(self, old: "Auth | None") -> None:
        """Keep counting the requests admitted under the previous config (a reload must not
        reset every key's max_concurrent count while its requests still run)."""
        if old is not None:
            self._active = old._active

    @property
    def open(self) -> bool:
        return not self.keys

    def _match(self, presented: str) -> _Key | None:
        given = _digest(presented)
        found = None
        for k in self.keys:  # no early exit: every key is compared every time
            if hmac.compare_digest(k.digest, given):
                found = k
        return found

    def authenticate(self, request: web.Request, *, query_key: bool = False) -> Principal:
        """The caller's identity, or 401. Remembered on the request for `admit`. `query_key`:
        a `?key=` counts (the Gemini routes only)."""
        if not self.keys:
            return ANONYMOUS
        known = request.get(_PRINCIPAL)
        if known is not None:
            return request.get(_THROUGH) or known.principal
        presented = _presented(request, query_key=query_key)
        if presented is None:
            if query_key:
                how = "send it as x-goog-api-key, x-api-key, Authorization: Bearer or ?key="
            elif "key" in request.query:
                how = ("a key in the URL (?key=) is taken only on the Gemini API's routes: "
                       "send it as x-api-key or Authorization: Bearer")
            else:
                how = "send it as x-api-key or Authorization: Bearer"
            raise GatewayError("authentication", f"missing API key: {how}")
        key = self._match(presented)
        if key is None:
            raise GatewayError("authentication", "invalid API key")
        request[_PRINCIPAL] = key
        if key.cfg.peer:
            request[_THROUGH] = through = _through_peer(key, request)
            return through
        return key.principal

    @staticmethod
    def key_name(request: web.Request) -> str | None:
        """The name of the key this request authenticated with (None: keys off, or none matched);
        through a front gateway, the person the front admitted (who the ledger counts)."""
        through = request.get(_THROUGH)
        if through is not None:
            return through.name
        key = request.get(_PRINCIPAL)
        return key.name if key is not None else None

    def may_use(self, request: web.Request, route: Route) -> bool:
        key = request.get(_PRINCIPAL)
        if key is None or key.cfg.models is None:
            return True
        # the model the client asked for, not a fallback the gateway chose for it
        names = (route.client_model, route.requested or route.model)
        return any(fnmatch.fnmatchcase(n, p) for p in key.cfg.models for n in names)

    def admit(self, request: web.Request, route: Route | None, dialect: str) -> Principal:
        """authenticate (401), then whether the key may use the route's model (403)."""
        principal = self.authenticate(request)
        if route is not None and not self.may_use(request, route):
            raise GatewayError(
                "permission", f"key {principal.name!r} may not use model {route.client_model!r}", param="model"
            )
        return principal

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

    def _is_admin_key(self, request: web.Request) -> bool:
        presented = _presented(request)
        return (
            self.admin_digest is not None
            and presented is not None
            and hmac.compare_digest(self.admin_digest, _digest(presented))
        )

    def is_admin(self, request: web.Request) -> bool:
        """The admin key when one is configured; with none, admin calls are allowed only when
        the gateway is open (no client keys), i.e. a loopback/LAN-trusted setup."""
        if self.admin_digest is None:
            return not self.keys
        return self._is_admin_key(request)

    def may_read_metrics(self, request: web.Request) -> bool:
        """For /metrics: the admin key when one is configured, else open (a scraper on the LAN;
        metrics carry key names and counts, never keys or message text)."""
        if self.admin_digest is None:
            return True
        return self._is_admin_key(request)
