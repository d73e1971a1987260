"""tcp_listener: connections accepted by an asyncio server on it have Nagle off (TCP_NODELAY),
which a plain ``socket.socket()`` listener does not give; the gateway command listens on one."""

from __future__ import annotations

import asyncio
import socket

import pytest

from adaptive_batcher.cli.gateway_cmd import _listen
from adaptive_batcher.gateway.listener import tcp_listener


async def accepted_nodelay(listener: socket.socket) -> int:
    """TCP_NODELAY of the connection an asyncio server accepts on ``listener``."""
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connection, sock=listener)
    port = listener.getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        async with asyncio.timeout(10):
            value = await accepted
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    return value


async def test_connections_accepted_on_it_have_nagle_off() -> None:
    assert await accepted_nodelay(tcp_listener("127.0.0.1", 0)) != 0


async def test_the_gateway_command_listens_on_one() -> None:
    assert await accepted_nodelay(_listen("127.0.0.1", 0)) != 0


async def test_a_plain_socket_listener_leaves_nagle_on() -> None:
    # why tcp_listener exists: asyncio sets TCP_NODELAY only for proto=IPPROTO_TCP sockets
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    plain.bind(("127.0.0.1", 0))
    plain.listen(8)
    assert await accepted_nodelay(plain) == 0


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="port"):
        tcp_listener("127.0.0.1", 70_000)
    with pytest.raises(ValueError, match="backlog"):
        tcp_listener("127.0.0.1", 0, backlog=0)
    with pytest.raises(TypeError, match="host"):
        tcp_listener(None, 0)  # type: ignore[arg-type]


def test_a_busy_port_is_an_os_error() -> None:
    busy = tcp_listener("127.0.0.1", 0)
    # SO_REUSEADDR does not let a second socket listen where one listens already
    with busy, pytest.raises(OSError, match="in use"):
        tcp_listener("127.0.0.1", busy.getsockname()[1])
