"""Access control for the WebSocket routes: bearer tokens, a browser origin allow-list, and a
per-connection message-rate limit. Pure functions and a small token bucket; no I/O."""

from __future__ import annotations

import hmac
import http
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True, slots=True)
class Refusal:
    status: http.HTTPStatus
    reason: str
    headers: tuple[tuple[str, str], ...] = ()


def split_list(value: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``."""
    return tuple(v.strip() for v in value.split(",") if v.strip())


SINGLE_HEADERS = ("Authorization", "Origin", "Host")  # at most once in a request (RFC 9110, 6454)


def single_values(
    pairs: Iterable[tuple[str, str]], names: tuple[str, ...] = SINGLE_HEADERS
) -> dict[str, str] | Refusal:
    """The values of the headers that may appear at most once (absent ones left out), or a 400
    naming the one that came twice: two ``Authorization`` headers leave which token counts to
    whoever reads them, so the request is refused, as NGINX does a repeated ``Host``."""
    wanted = {n.lower(): n for n in names}
    found: dict[str, str] = {}
    for name, value in pairs:
        key = wanted.get(name.lower())
        if key is None:
            continue
        if key in found:
            return Refusal(http.HTTPStatus.BAD_REQUEST, f"more than one {key} header")
        found[key] = value
    return found


def presented_token(path: str, authorization: str | None) -> str | None:
    """The client's token: ``Authorization: Bearer <t>`` first, else the ``token`` query parameter."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    values = parse_qs(urlsplit(path).query).get("token")
    return values[0] if values else None


def token_ok(presented: str | None, accepted: tuple[str, ...]) -> bool:
    """Constant-time comparison against every accepted token (no early exit on a match)."""
    if presented is None:
        return False
    ok = False
    for token in accepted:
        ok |= hmac.compare_digest(presented.encode(), token.encode())
    return ok


def same_origin(origin: str, host: str | None) -> bool:
    """Whether a browser's ``Origin`` is the server's own page (same host and port as the
    ``Host`` header it connected to)."""
    if not host:
        return False
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    default = "443" if parts.scheme == "https" else "80"

    def norm(netloc: str) -> str:
        netloc = netloc.lower()
        return netloc if ":" in netloc.rsplit("]", 1)[-1] else f"{netloc}:{default}"

    return norm(parts.netloc) == norm(host)


def host_name(host: str) -> str:
    """The name in a ``Host`` header, lower case, without its port (``[::1]:8765`` -> ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(host: str | None, allowed: tuple[str, ...]) -> bool:
    """Whether a request's ``Host`` names this server: an IP address, ``localhost`` (or a
    ``*.localhost`` name), or a name ``server.allowed_hosts`` lists (``.example.com``: it and its
    subdomains; ``*``: any). Against DNS rebinding: a web page whose own name was made to resolve
    to this server still sends that name, which is none of these. No ``Host`` (HTTP/1.0, not a
    browser): allowed."""
    if not host or "*" in allowed:
        return True
    name = host_name(host)
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    if name == "localhost" or name.endswith(".localhost"):
        return True
    for entry in (a.lower() for a in allowed):
        if name == entry or (entry.startswith(".") and (name.endswith(entry) or name == entry[1:])):
            return True
    return False


def origin_allowed(origin: str, host: str | None, origins: tuple[str, ...]) -> bool:
    """A browser's ``Origin`` may use this server: its own page, listed, or ``*`` listed."""
    return "*" in origins or origin in origins or same_origin(origin, host)


def check(
    path: str,
    authorization: str | None,
    origin: str | None,
    tokens: tuple[str, ...],
    origins: tuple[str, ...],
    host: str | None = None,
) -> Refusal | None:
    """None when the request may open a WebSocket; otherwise the HTTP refusal to send.

    No tokens configured: no authentication. Origins: a request without an Origin header (not a
    browser: SDKs, telephony) is not subject to them; a browser's is admitted when it is the server's
    own page (same host and port), listed in ``origins``, or ``origins`` holds ``*``. So by default
    no other web page the user visits can open a session on their behalf."""
    if origin is not None and not origin_allowed(origin, host, origins):
        return Refusal(
            http.HTTPStatus.FORBIDDEN,
            f"origin {origin[:100]!r} not allowed (server.allowed_origins)",
        )
    if tokens and not token_ok(presented_token(path, authorization), tokens):
        return Refusal(
            http.HTTPStatus.UNAUTHORIZED,
            "missing or invalid bearer token",
            (("WWW-Authenticate", 'Bearer realm="voicert"'),),
        )
    return None
