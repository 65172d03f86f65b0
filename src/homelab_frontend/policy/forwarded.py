"""Who a request comes from: its peer's address, or, behind a reverse proxy the config trusts,
the client address that proxy reports. Pure.

Behind Caddy, Traefik, nginx or Tailscale serve every connection comes from the proxy, so without
this the access log and the dashboard name the proxy for everybody, and latest-wins (a client's
new completion cancels its previous one, admission/supersede.py) takes everybody behind it for one
client. A proxy says whom it forwards for in a header; that header is believed only when the
connection comes from an address in `connections.trusted_proxies` (never from anyone else: a
client writes what it likes there), as uvicorn's `--forwarded-allow-ips` does. Nothing is trusted
by default, loopback included: a gateway on 127.0.0.1 with no proxy in front must not take a
local client's header for its address.

The walk, from the right. Each proxy appends the address it was connected from to the list it
received (nginx's `$proxy_add_x_forwarded_for`): so the last entry was written by the peer,
which is trusted, and is believed; if that entry is itself a trusted proxy, the one before it was
written by that proxy and is believed too; and so on, until the first untrusted address, which
is the client. Whatever lies left of it was written by the client or a proxy nobody vouches for,
and is ignored. When every entry is a trusted proxy, the leftmost is the client (a request from
a proxy's own host). An entry that is not an address (RFC 7239's `unknown` or an obfuscated
`_name`, garbage) ends the walk: the client is then the last address believed (the proxy that
could not say), never the text.

One header, chosen in the config (`connections.forwarded_header`), not both: a proxy that writes
one passes the other through from the client untouched (nginx appends to `X-Forwarded-For` and
forwards a client's `Forwarded` as it came), so reading both would believe the client's own
words. `x-forwarded-for` is what nginx, Caddy, Traefik and Tailscale serve set; `forwarded` is
RFC 7239's `for=`, for a proxy configured to write it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Iterable, Literal

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
HeaderKind = Literal["x-forwarded-for", "forwarded"]
HEADERS: dict[str, str] = {"x-forwarded-for": "X-Forwarded-For", "forwarded": "Forwarded"}


def network(entry: str) -> Network:
    """A config entry: an address (`10.0.0.5`, `::1`) or a CIDR network (`10.0.0.0/8`).
    Raises ValueError naming what is wrong (`10.0.0.5/8` has host bits set)."""
    net = ipaddress.ip_network(entry.strip(), strict=True)
    if isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped is not None and net.prefixlen >= 96:
        # ::ffff:10.0.0.0/104 is written for a dual-stack socket's peers: the same IPv4 network
        return ipaddress.ip_network(f"{net.network_address.ipv4_mapped}/{net.prefixlen - 96}")
    return net


def address(text: str) -> Address | None:
    """One hop as a proxy writes it: `192.0.2.7`, `192.0.2.7:4711`, `2001:db8::1`,
    `[2001:db8::1]:4711`. An IPv4-mapped IPv6 address is its IPv4 address (a dual-stack socket's
    peer). None when it is not an address."""
    text = text.strip()
    if not text or len(text) > 64:
        return None
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (text[end + 1:] and not _port(text[end + 1:])):
            return None
        text = text[1:end]
    elif text.count(":") == 1:  # IPv4 with a port (an IPv6 address has at least two colons)
        text, port = text.split(":")
        if not _port(":" + port):
            return None
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


_PORT = re.compile(r":(?:[0-9]{1,5}|_[A-Za-z0-9._-]+)")  # `:4711`, or RFC 7239's obfuscated `:_abc`


def _port(text: str) -> bool:
    return _PORT.fullmatch(text) is not None


def x_forwarded_for(values: Iterable[str]) -> list[Address | None]:
    """The hops of `X-Forwarded-For` (its lines joined, as a comma list), left to right; an
    empty element is no hop (RFC 9110's list rule), one that is not an address is None."""
    return [address(part) for value in values for part in value.split(",") if part.strip()]


def forwarded(values: Iterable[str]) -> list[Address | None]:
    """The `for=` of each element of RFC 7239's `Forwarded`, left to right; None for an element
    without one, or whose `for=` is not an address (`unknown`, `_hidden`), or that does not
    parse."""
    hops: list[Address | None] = []
    for value in values:
        for element in _split(value, ","):
            if not element.strip():
                continue
            found: Address | None = None
            for pair in _split(element, ";"):
                name, eq, val = pair.partition("=")
                if eq and name.strip().lower() == "for":
                    found = address(_unquote(val.strip()))
                    break
            hops.append(found)
    return hops


def _split(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside quoted strings (a quoted IPv6 `for` holds colons, and a
    quoted string may hold the separators)."""
    parts: list[str] = []
    cur: list[str] = []
    quoted = escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif quoted and ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def _unquote(val: str) -> str:
    if len(val) >= 2 and val[0] == val[-1] == '"':
        out, escaped = [], False
        for ch in val[1:-1]:
            if escaped or ch != "\\":
                out.append(ch)
                escaped = False
            else:
                escaped = True
        return "".join(out)
    return val


class Forwarding:
    """`connections.trusted_proxies` and `connections.forwarded_header`, ready to ask."""

    __slots__ = ("networks", "header")

    def __init__(self, trusted: Iterable[str] = (), header: HeaderKind = "x-forwarded-for") -> None:
        self.networks: tuple[Network, ...] = tuple(network(e) for e in trusted)
        self.header = header

    def trusts(self, addr: Address) -> bool:
        return any(addr.version == n.version and addr in n for n in self.networks)

    def client(self, peer: str | None, header_values: Iterable[str]) -> str:
        """The client's address as believed: the peer's, unless the peer is a trusted proxy,
        then the walk of the module docstring over `header_values` (every line of the
        configured header, in order). `header_values` is read only for a trusted peer."""
        peer_addr = address(peer) if peer else None
        if peer_addr is None:
            return peer or ""  # not an IP peer (a unix socket): nothing to walk from
        if not self.networks or not self.trusts(peer_addr):
            return str(peer_addr)
        hops = x_forwarded_for(header_values) if self.header == "x-forwarded-for" else forwarded(header_values)
        believed = peer_addr
        for hop in reversed(hops):
            if hop is None:
                break  # a hop that is no address: nothing left of it can be vouched for
            believed = hop
            if not self.trusts(hop):
                break
        return str(believed)
