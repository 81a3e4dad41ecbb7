"""Host addresses of Lever's servers, without aiohttp: whether a `--host` is
loopback only (the servers refuse to run without a token elsewhere), and a
host as the host part of a URL (an IPv6 address in brackets, RFC 3986)."""

from __future__ import annotations

import ipaddress
import socket

from ..errors import LeverError


def loopback_address(text: str) -> bool:
    """True for a loopback IP address: 127.0.0.0/8, ::1, or an IPv4-mapped
    IPv6 address of 127.0.0.0/8 (::ffff:127.0.0.1).  A zone (%eth0) is ignored."""
    address = ipaddress.ip_address(text.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def is_loopback(host: str) -> bool:
    """True if every address `host` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as e:
        raise LeverError(f"--host {host}: cannot be resolved ({e})") from None
    return all(loopback_address(info[4][0]) for info in infos)


def url_host(host: str) -> str:
    """`host` as written in a URL: an IPv6 address ("::1") in brackets ("[::1]")."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def base_url(scheme: str, host: str, port: int) -> str:
    """"http://127.0.0.1:8000", "http://[::1]:8000": the URL of a server on host:port."""
    return f"{scheme}://{url_host(host)}:{port}"
