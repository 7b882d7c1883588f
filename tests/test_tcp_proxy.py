"""tests/tcp_proxy.py against a real echo server and a real PostgreSQL: bytes flow through it, a
cut stops them (reset: at once, with an error; blackhole: silently, until a timeout the test
sets), a restore lets them flow again."""

from __future__ import annotations

import os
import socket
import socketserver
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import psycopg
import pytest

from .polling import wait_until
from .postgres_server import PostgresServer
from .tcp_proxy import TcpProxy

TIMEOUT = 0.5  # seconds a cut connection is given to answer before the test calls it silent


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except ConnectionResetError:  # what a reset cut does to the far side too
            pass


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield ("127.0.0.1", server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[TcpProxy]:
    with TcpProxy(*echo) as running:
        yield running


def _connect(proxy: TcpProxy) -> socket.socket:
    sock = socket.create_connection((proxy.host, proxy.port), timeout=5)
    sock.settimeout(5)
    return sock


def _receive(sock: socket.socket, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        data = sock.recv(size - len(got))
        if not data:
            break
        got += data
    return bytes(got)


def _round_trip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    return _receive(sock, len(data))


def _is_dropped(sock: socket.socket) -> bool:
    """The connection was closed or reset (what a reset cut does to it)."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _is_refused(proxy: TcpProxy) -> bool:
    """A new connection is reset: at connect (the reset can beat connect()'s return) or after."""
    try:
        sock = _connect(proxy)
    except ConnectionResetError:
        return True
    with sock:
        return _is_dropped(sock)


def test_bytes_flow_both_ways_with_backpressure(proxy: TcpProxy) -> None:
    big = os.urandom(8 << 20)  # more than the proxy buffers per side: it must stop reading
    with _connect(proxy) as sock:
        assert _round_trip(sock, b"hello") == b"hello"
        sender = threading.Thread(target=sock.sendall, args=(big,))
        sender.start()
        assert _receive(sock, len(big)) == big
        sender.join()
        assert proxy.connections() == 1


def test_a_half_close_is_passed_on(proxy: TcpProxy) -> None:
    with _connect(proxy) as sock:
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)
        assert _receive(sock, 100) == b"last words"  # then EOF: the echo server saw ours
        assert sock.recv(1) == b""
    wait_until(lambda: proxy.connections() == 0, what="the proxy to close the finished connection")


def test_reset_drops_every_connection_and_resets_new_ones(proxy: TcpProxy) -> None:
    first, second = _connect(proxy), _connect(proxy)
    assert _round_trip(first, b"a") == b"a" and _round_trip(second, b"b") == b"b"
    proxy.cut(mode="reset")
    assert proxy.mode == "reset"
    assert _is_dropped(first) and _is_dropped(second)
    assert proxy.connections() == 0
    assert _is_refused(proxy)  # the kernel accepts; the proxy resets at once
    proxy.restore()
    assert proxy.mode is None
    with _connect(proxy) as sock:
        assert _round_trip(sock, b"again") == b"again"
    first.close()
    second.close()


def test_blackhole_keeps_sockets_open_and_moves_nothing_until_restored(proxy: TcpProxy) -> None:
    old = _connect(proxy)
    assert _round_trip(old, b"before") == b"before"
    proxy.cut(mode="blackhole")
    old.sendall(b"during")  # accepted by the kernel: nothing says the other side is gone
    old.settimeout(TIMEOUT)
    with pytest.raises(TimeoutError):
        old.recv(1)
    held = _connect(proxy)  # a new connection is accepted and held, not forwarded
    held.sendall(b"held")
    held.settimeout(TIMEOUT)
    with pytest.raises(TimeoutError):
        held.recv(1)
    assert proxy.connections() == 2
    proxy.restore()  # what was written during the cut arrives, as after a healed partition
    old.settimeout(5)
    held.settimeout(5)
    assert _receive(old, 6) == b"during"
    assert _receive(held, 4) == b"held"
    assert _round_trip(old, b"after") == b"after"
    old.close()
    held.close()


def test_a_reset_after_a_blackhole_drops_what_was_held(proxy: TcpProxy) -> None:
    old = _connect(proxy)
    assert _round_trip(old, b"x") == b"x"
    proxy.cut(mode="blackhole")
    held = _connect(proxy)
    wait_until(lambda: proxy.connections() == 2, what="the proxy to hold the new connection")
    proxy.cut(mode="reset")
    assert _is_dropped(old) and _is_dropped(held)
    old.close()
    held.close()


def test_a_refusing_target_is_a_refusing_proxy() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connections to it are refused
        with TcpProxy("127.0.0.1", port) as proxy:
            assert _is_refused(proxy)


def test_close_stops_listening_and_closes_connections(echo: tuple[str, int]) -> None:
    with TcpProxy(*echo) as proxy:
        sock = _connect(proxy)
        assert _round_trip(sock, b"x") == b"x"
    assert _is_dropped(sock)
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((proxy.host, proxy.port), timeout=5).close()
    with pytest.raises(RuntimeError, match="closed"):
        proxy.cut()


def test_an_unknown_mode_is_refused(proxy: TcpProxy) -> None:
    with pytest.raises(ValueError, match="mode"):
        proxy.cut(mode="drop")  # type: ignore[arg-type]


# ---------------------------------------------------------------- PostgreSQL through the proxy


def _dsn(proxy: TcpProxy) -> str:
    # connect_timeout: libpq's, in whole seconds (2 is its least)
    return f"postgresql://outrig@{proxy.address}/outrig?connect_timeout=2"


def _select_one(connection: psycopg.Connection) -> int:
    row = connection.execute("SELECT 1").fetchone()
    assert row is not None
    return int(row[0])


def test_postgres_through_a_reset_cut(postgres: PostgresServer) -> None:
    with TcpProxy("127.0.0.1", postgres.port) as proxy:
        with psycopg.connect(_dsn(proxy), autocommit=True) as connection:
            assert _select_one(connection) == 1
            proxy.cut(mode="reset")
            with pytest.raises(psycopg.OperationalError):
                _select_one(connection)
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(_dsn(proxy))
        proxy.restore()
        with psycopg.connect(_dsn(proxy), autocommit=True) as connection:
            assert _select_one(connection) == 1


def test_postgres_through_a_blackhole_cut(postgres: PostgresServer) -> None:
    with TcpProxy("127.0.0.1", postgres.port) as proxy, ThreadPoolExecutor(2) as pool:
        connection = psycopg.connect(_dsn(proxy), autocommit=True)
        assert _select_one(connection) == 1
        proxy.cut(mode="blackhole")
        # psycopg's blocking calls have no timeout of their own: the test's is the future's
        stuck = pool.submit(_select_one, connection)
        with pytest.raises(FutureTimeout):
            stuck.result(TIMEOUT)
        with pytest.raises(psycopg.OperationalError, match="timeout"):
            psycopg.connect(_dsn(proxy))  # held: libpq's connect_timeout gives up
        proxy.restore()
        assert stuck.result(10) == 1  # the query sent during the partition is answered after it
        assert _select_one(connection) == 1
        with psycopg.connect(_dsn(proxy), autocommit=True) as fresh:
            assert _select_one(fresh) == 1
        connection.close()
