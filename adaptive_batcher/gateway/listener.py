"""A listening TCP socket whose connections send small writes at once.

asyncio turns Nagle's algorithm off (``TCP_NODELAY``) on the connections it accepts only when
the listening socket was made with ``proto=IPPROTO_TCP``; ``socket.socket(AF_INET,
SOCK_STREAM)`` makes one with ``proto=0``, and its connections keep Nagle on. A streamed
response is a run of small writes, so each chunk after the first then waits for the client's
ACK of the one before, which Linux delays by up to 40 ms: measured here, a GET on such a
server took 44 ms per request on a kept-alive connection against 1.3 ms with a fresh one, and
a stream's chunks arrived 40 ms late. Source: CPython ``asyncio.base_events._set_nodelay``.
"""

from __future__ import annotations

import socket

from adaptive_batcher._validate import check_int, check_str

__all__ = ["tcp_listener"]


def tcp_listener(host: str, port: int, *, backlog: int = 2048) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening, made so that asyncio servers
    (uvicorn's ``serve(sockets=[...])``) set ``TCP_NODELAY`` on every accepted connection.

    Args:
        host: an IPv4 or IPv6 address (a ``:`` in it means IPv6).
        port: the port, 0 for any free one (``getsockname()[1]`` tells which).
        backlog: connections the kernel queues before they are accepted (>= 1).

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range (named).
        OSError: the address cannot be bound (in use, not local).
    """
    check_str("host", host)
    check_int("port", port, 0)
    if port > 65535:
        raise ValueError(f"port must be in [0, 65535], got {port}")
    check_int("backlog", backlog, 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(backlog)
    except OSError:
        listener.close()
        raise
    return listener
