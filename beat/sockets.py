"""What a connection's socket shows at once, without a round trip to its server, and
whether an endpoint a server reports is this socket's own."""

from __future__ import annotations

import select
from ipaddress import IPv4Address, IPv6Address, ip_address


def readable(fileno: int) -> bool:
    """Whether a socket has something to read (data, or its peer's close), at once; by
    ``poll``, which takes any descriptor (``select`` refuses those above 1,023)."""
    poller = select.poll()
    poller.register(fileno, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def same_endpoint(shown: str, host: str, port: int) -> bool:
    """Is ``shown`` (``ip:port``, ``[ip]:port`` or ``ip6:port`` as servers print them)
    the address ``host`` and ``port``?"""
    ip, _, shown_port = shown.rpartition(":")
    try:
        return _plain_ip(ip.strip("[]")) == _plain_ip(host) and shown_port == str(port)
    except ValueError:
        return False


def _plain_ip(text: str) -> IPv4Address | IPv6Address:
    """An address, an IPv4 one mapped into IPv6 (a dual-stack socket's view) as IPv4."""
    address = ip_address(text.split("%")[0])  # without an IPv6 zone
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address
