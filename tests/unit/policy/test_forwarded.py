"""Who a request comes from (policy/forwarded.py): a forwarded header believed only from a trusted
proxy, walked from the right; never from anyone else."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend import config as cfgmod
from homelab_frontend.policy.forwarded import Forwarding, address, forwarded, network, x_forwarded_for

PROXIES = ["10.0.0.0/8", "192.0.2.1"]

ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
any_ip = st.one_of(ipv4, ipv6)
header_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200)


def untrusted_ip(fwd: Forwarding):
    return any_ip.filter(lambda a: not fwd.trusts(address(a)))


@given(peer=any_ip, values=st.lists(header_text, max_size=3))
def test_a_header_from_a_peer_that_is_no_trusted_proxy_is_never_believed(peer, values):
    fwd = Forwarding(PROXIES)
    if fwd.trusts(address(peer)):
        return
    assert fwd.client(peer, values) == str(address(peer))
    assert Forwarding(PROXIES, "forwarded").client(peer, values) == str(address(peer))


@given(peer=any_ip, values=st.lists(header_text, max_size=3))
def test_nothing_is_trusted_by_default_loopback_included(peer, values):
    assert Forwarding().client(peer, values) == str(address(peer))
    assert Forwarding().client("127.0.0.1", ["203.0.113.9"]) == "127.0.0.1"


@given(sent=header_text, client=untrusted_ip(Forwarding(PROXIES)))
def test_what_the_client_wrote_itself_cannot_hide_the_address_the_proxy_appended(sent, client):
    """nginx's `$proxy_add_x_forwarded_for`: the client's own header, then its address."""
    fwd = Forwarding(PROXIES)
    assert fwd.client("10.1.2.3", [sent + ", " + client if sent.strip() else client]) == str(address(client))
    assert fwd.client("10.1.2.3", [sent, client]) == str(address(client))  # as two header lines


@given(sent=header_text, client=untrusted_ip(Forwarding(PROXIES)))
def test_the_same_for_forwarded_elements(sent, client):
    fwd = Forwarding(PROXIES, "forwarded")
    quoted = f'"[{client}]:4711"' if ":" in client else client
    assert fwd.client("10.1.2.3", [sent, f"for={quoted};proto=https;by=10.1.2.3"]) == str(address(client))
    # appended on the client's own line, an unbalanced quote of the client's can swallow the
    # proxy's element: then the proxy is the client, never an address the client wrote
    assert fwd.client("10.1.2.3", [f"{sent}, for={quoted}"]) in (str(address(client)), "10.1.2.3")


def test_the_walk_skips_trusted_hops_and_stops_at_the_first_untrusted_one():
    fwd = Forwarding(PROXIES)
    # client 203.0.113.9 -> proxy 10.0.0.2 -> proxy 10.0.0.1 -> gateway
    assert fwd.client("10.0.0.1", ["198.51.100.1, 203.0.113.9, 10.0.0.2"]) == "203.0.113.9"
    # only trusted hops: the leftmost (a request from a proxy's own host)
    assert fwd.client("10.0.0.1", ["10.0.0.3, 10.0.0.2"]) == "10.0.0.3"
    # no header: the proxy itself (its health check)
    assert fwd.client("10.0.0.1", []) == "10.0.0.1"
    # a hop that is no address ends the walk at the last one believed: never the text
    assert fwd.client("10.0.0.1", ["203.0.113.9, <script>, 10.0.0.2"]) == "10.0.0.2"
    assert fwd.client("10.0.0.1", ["unknown"]) == "10.0.0.1"
    # empty elements are no hops
    assert fwd.client("10.0.0.1", ["203.0.113.9,, "]) == "203.0.113.9"


def test_addresses_as_proxies_write_them():
    assert str(address("192.0.2.7:4711")) == "192.0.2.7"
    assert str(address("[2001:db8::1]:4711")) == "2001:db8::1"
    assert str(address("[2001:db8::1]")) == "2001:db8::1"
    assert str(address("2001:db8::1")) == "2001:db8::1"
    assert str(address("::ffff:10.0.0.1")) == "10.0.0.1"  # a dual-stack socket's IPv4 peer
    for junk in ("", "unknown", "_hidden", "1.2.3.4:x", "[::1", "[::1]x", "1.2.3", "example.com", "1" * 100):
        assert address(junk) is None, junk


def test_forwarded_elements_per_rfc_7239():
    assert forwarded(['for=192.0.2.60;proto=http;by=203.0.113.43']) == [ipaddress.ip_address("192.0.2.60")]
    assert forwarded(['For="[2001:db8:cafe::17]:4711"']) == [ipaddress.ip_address("2001:db8:cafe::17")]
    assert forwarded(['for=192.0.2.43, for=198.51.100.17']) == [ipaddress.ip_address("192.0.2.43"),
                                                                ipaddress.ip_address("198.51.100.17")]
    # a quoted string may hold the separators; an element without `for` is a hop nobody named
    assert forwarded(['for="_a,b;c", proto=https', "for=unknown"]) == [None, None, None]
    assert x_forwarded_for(["203.0.113.9, 10.0.0.2", "10.0.0.1"]) == [
        ipaddress.ip_address(a) for a in ("203.0.113.9", "10.0.0.2", "10.0.0.1")]


def test_a_forwarded_header_is_read_only_when_it_is_the_configured_one():
    """A proxy that writes one header passes the other through from the client as it came."""
    xff = Forwarding(PROXIES)
    rfc = Forwarding(PROXIES, "forwarded")
    assert xff.client("10.0.0.1", ["for=203.0.113.66"]) == "10.0.0.1"  # a Forwarded value: not an XFF address
    assert rfc.client("10.0.0.1", ["203.0.113.66"]) == "10.0.0.1"  # an XFF value: no for=


def test_config_entries_and_their_problems():
    assert network("10.0.0.0/8") == ipaddress.ip_network("10.0.0.0/8")
    assert network("::ffff:10.0.0.0/104") == ipaddress.ip_network("10.0.0.0/8")
    with pytest.raises(ValueError):
        network("10.0.0.5/8")
    cfg = cfgmod.parse({"connections": {"trusted_proxies": ["127.0.0.1", "fd7a:115c:a1e0::/48"],
                                        "forwarded_header": "forwarded"}})
    assert Forwarding(cfg.connections.trusted_proxies, cfg.connections.forwarded_header).client(
        "fd7a:115c:a1e0::1", ['for="[fd7a:115c:a1e0::2]", for=100.64.0.7']) == "100.64.0.7"
    with pytest.raises(cfgmod.ConfigError) as e:
        cfgmod.parse({"connections": {"trusted_proxies": ["10.0.0.0/8", "proxy.lan", "10.0.0.5/8"]}})
    assert [p.split(":")[0] for p in e.value.problems] == ["connections.trusted_proxies[1]",
                                                          "connections.trusted_proxies[2]"]
    with pytest.raises(cfgmod.ConfigError) as e:
        cfgmod.parse({"connections": {"forwarded_header": "x-real-ip"}})
    assert e.value.problems[0].startswith("connections.forwarded_header")
