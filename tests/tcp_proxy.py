"""A real TCP proxy that a fault test can cut: put it between an outrig server and PostgreSQL (or
between any client and server) and drop or freeze the network between them on cue.

    with TcpProxy("127.0.0.1", postgres.port) as proxy:
        dsn = f"postgresql://outrig@{proxy.address}/outrig"
        ...                            # traffic flows
        proxy.cut(mode="blackhole")    # a partition: sockets stay open, no byte moves
        proxy.restore()                # the partition heals: held bytes and connections flow on
        proxy.cut(mode="reset")        # every connection dropped at once, new ones reset
        proxy.restore()                # new connections work again

It listens on 127.0.0.1 on a free port (`address`, `port`) and forwards each connection to the
target, both ways, with half-closes passed on. One thread runs it, with non-blocking sockets and a
selector; `cut()` and `restore()` hand their change to that thread and return once it is in
force, so a test needs no sleep between the cut and what it expects of it.

The two ways to cut:

- ``reset``: every connection is closed with a RST on both sides (the client and the target see
  "connection reset" or EOF at once), and a connection made while cut is accepted and reset at
  once (so the port stays the proxy's). Bytes in flight are lost. After `restore()` new
  connections are forwarded again; the old ones stay gone.
- ``blackhole``: every socket stays open and nothing more is read from or written to any of them;
  a connection made while cut is accepted and held, with no connection to the target yet. Each
  peer sees what a network partition looks like to a program: writes succeed (until the buffers
  fill), replies never come. After `restore()` everything flows again, the bytes written during
  the cut included, and held connections are forwarded, as TCP's retransmissions would deliver
  them once a partition heals. One difference from a partition at the IP level: the proxy's
  kernel still acknowledges what reaches it, so TCP keepalives and ``TCP_USER_TIMEOUT`` on the
  peers do not fire; only timeouts in the programs themselves notice the cut.
"""

from __future__ import annotations

import contextlib
import errno
import queue
import selectors
import socket
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Literal, TypeVar

__all__ = ["CutMode", "TcpProxy"]

CutMode = Literal["reset", "blackhole"]
T = TypeVar("T")

_CHUNK = 65536
_HIGH_WATER = 1 << 20  # bytes buffered for a side before the proxy stops reading the other one


def _reset(sock: socket.socket) -> None:
    """Close with a RST instead of a FIN (SO_LINGER on, with a zero timeout)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Side:
    """One socket of a forwarded connection and the bytes waiting to be written to it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = bytearray()
        self.got_eof = False  # its peer finished sending (we read EOF from this socket)
        self.shut = False  # we shut down writing to it (after passing on the other side's EOF)
        self.registered = 0  # the selector events it is registered for now


class _Link:
    """A forwarded connection: the accepted socket (`down`) and the one to the target (`up`, None
    while held during a blackhole cut)."""

    def __init__(self, down: socket.socket) -> None:
        self.down = _Side(down)
        self.up: _Side | None = None
        self.connecting = False
        self.closed = False

    def other(self, side: _Side) -> _Side | None:
        return self.up if side is self.down else self.down


class TcpProxy:
    """A cuttable TCP proxy from 127.0.0.1:`port` to `target_host`:`target_port`, run by a
    thread of this process between `start()` (or entering the context) and `close()`."""

    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server((listen_host, 0))
        self._listener.setblocking(False)
        self.host: str = listen_host
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._links: set[_Link] = set()
        self._mode: CutMode | None = None
        self._accepted = 0
        self._thread = threading.Thread(target=self._run, name=f"tcp-proxy-{self.port}", daemon=True)
        self._stopping = False
        self._started = False
        self._failure: BaseException | None = None

    # ------------------------------------------------------------------ the API

    @property
    def address(self) -> str:
        """``host:port`` to connect to instead of the target."""
        return f"{self.host}:{self.port}"

    @property
    def mode(self) -> CutMode | None:
        """How the proxy is cut now; None while it forwards."""
        return self._mode

    def start(self) -> TcpProxy:
        if not self._started:
            self._started = True
            self._selector.register(self._listener, selectors.EVENT_READ, None)
            self._selector.register(self._wake_read, selectors.EVENT_READ, None)
            self._thread.start()
        return self

    def cut(self, mode: CutMode = "reset") -> None:
        """Cut every connection, now and until `restore()` (see the module's docstring for the
        two modes). A second cut may change the mode: blackhole then reset drops what was held."""
        if mode not in ("reset", "blackhole"):
            raise ValueError(f"mode must be 'reset' or 'blackhole', not {mode!r}")
        self._do(lambda: self._cut(mode))

    def restore(self) -> None:
        """Forward again: held connections and bytes flow on (after a blackhole cut), new
        connections are forwarded."""
        self._do(self._restore)

    def connections(self) -> int:
        """Connections open through the proxy now (held ones included)."""
        return self._do(lambda: len(self._links))

    def accepted(self) -> int:
        """Connections accepted since the start, reset ones included."""
        return self._do(lambda: self._accepted)

    def close(self) -> None:
        """Stop: every connection and the listener closed, the thread joined. Idempotent."""
        if self._started and self._thread.is_alive():
            self._stopping = True
            self._wake()
            self._thread.join(10)
        elif not self._started:
            self._listener.close()
            self._selector.close()
            self._wake_read.close()
            self._wake_write.close()
        if self._failure is not None:
            raise RuntimeError("the TCP proxy's thread failed") from self._failure

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ the thread

    def _do(self, command: Callable[[], T]) -> T:
        if not self._started:
            raise RuntimeError("the proxy is not started (use it as a context manager or call start())")
        if not self._thread.is_alive():
            raise RuntimeError("the proxy is closed") from self._failure
        done: Future[T] = Future()
        self._commands.put((command, done))
        self._wake()
        return done.result(10)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # closed, or the buffer is full of wake-ups already
            self._wake_write.send(b"x")

    def _run(self) -> None:
        try:
            while not self._stopping:
                for key, events in self._selector.select():
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_read:
                        self._commands_due()
                    else:
                        link, side = key.data
                        self._serve(link, side, events)
        except BaseException as err:  # pragma: no cover - a bug in the proxy: close() reports it
            self._failure = err
        finally:
            self._shutdown()

    def _commands_due(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                command, done = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                done.set_result(command())
            except BaseException as err:
                done.set_exception(err)

    def _shutdown(self) -> None:
        for link in list(self._links):
            self._drop(link, reset=False)
        while True:  # nobody waits forever on a command the thread will not run
            try:
                _, done = self._commands.get_nowait()
            except queue.Empty:
                break
            done.set_exception(RuntimeError("the proxy is closed"))
        self._selector.close()
        self._listener.close()
        self._wake_read.close()
        self._wake_write.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # pragma: no cover - out of descriptors: try again later
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return
                raise
            self._accepted += 1
            if self._mode == "reset":
                _reset(sock)
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(sock)
            self._links.add(link)
            if self._mode is None:
                self._connect(link)
            self._refresh(link)

    def _connect(self, link: _Link) -> None:
        up = socket.socket(socket.AF_INET6 if ":" in self.target[0] else socket.AF_INET, socket.SOCK_STREAM)
        up.setblocking(False)
        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link.up = _Side(up)
        link.connecting = True
        code = up.connect_ex(self.target)
        if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            self._drop(link, reset=True)

    def _cut(self, mode: CutMode) -> None:
        self._mode = mode
        for link in list(self._links):
            if mode == "reset":
                self._drop(link, reset=True)
            else:
                self._refresh(link)

    def _restore(self) -> None:
        self._mode = None
        for link in list(self._links):
            if link.up is None:
                self._connect(link)
            if not link.closed:
                self._refresh(link)

    def _serve(self, link: _Link, side: _Side, events: int) -> None:
        if link.closed or self._mode is not None:
            return
        if link.connecting and side is link.up:
            code = side.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                self._drop(link, reset=True)  # the target refused: so does the proxy
                return
            link.connecting = False
        other = link.other(side)
        assert other is not None
        try:
            if events & selectors.EVENT_WRITE and side.pending:
                sent = side.sock.send(side.pending)
                del side.pending[:sent]
            if not side.pending and other.got_eof and not side.shut:
                side.sock.shutdown(socket.SHUT_WR)
                side.shut = True
            if events & selectors.EVENT_READ and not side.got_eof and len(other.pending) < _HIGH_WATER:
                data = side.sock.recv(_CHUNK)
                if data:
                    other.pending += data
                    if not link.connecting:  # write at once; what is left waits for EVENT_WRITE
                        sent = other.sock.send(other.pending)
                        del other.pending[:sent]
                else:
                    side.got_eof = True
                    if not other.pending and not link.connecting and not other.shut:
                        other.sock.shutdown(socket.SHUT_WR)
                        other.shut = True
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # reset or broken: so is the other side
            self._drop(link, reset=True)
            return
        if link.down.got_eof and link.up is not None and link.up.got_eof and link.down.shut and link.up.shut:
            self._drop(link, reset=False)
            return
        self._refresh(link)

    def _refresh(self, link: _Link) -> None:
        """Register each socket of `link` for what it can do now: nothing during a cut."""
        if link.closed:
            return
        for side in (link.down, link.up):
            if side is None:
                continue
            other = link.other(side)
            wanted = 0
            if self._mode is None:
                if link.connecting:
                    if side is link.up:
                        wanted = selectors.EVENT_WRITE
                else:
                    assert other is not None
                    if not side.got_eof and len(other.pending) < _HIGH_WATER:
                        wanted |= selectors.EVENT_READ
                    if side.pending or (other.got_eof and not side.shut):
                        wanted |= selectors.EVENT_WRITE
            if wanted == side.registered:
                continue
            if side.registered and wanted:
                self._selector.modify(side.sock, wanted, (link, side))
            elif wanted:
                self._selector.register(side.sock, wanted, (link, side))
            else:
                self._selector.unregister(side.sock)
            side.registered = wanted

    def _drop(self, link: _Link, *, reset: bool) -> None:
        if link.closed:
            return
        link.closed = True
        self._links.discard(link)
        for side in (link.down, link.up):
            if side is None:
                continue
            if side.registered:
                self._selector.unregister(side.sock)
                side.registered = 0
            if reset:
                _reset(side.sock)
            else:
                side.sock.close()
