"""A loopback TCP proxy in front of one Redis master that delays or blackholes its traffic, for
fault tests and benchmarks ("a master slower than its budget", "replies delayed past the TTL").

``DelayProxy(target_port, delay)`` listens on a free 127.0.0.1 port and forwards every connection
to ``127.0.0.1:target_port``, holding each chunk of bytes ``delay`` seconds in each direction.
Delayed data is delivered, never dropped, in order per connection: a request the client gave up
on still reaches the master late, as on a slow network. ``delay`` can be changed while running;
a chunk keeps the delay in force when it was read.

``listen_host``/``listen_port`` choose where it listens (default: a free port on 127.0.0.1);
the bench's separate-hosts harness runs one inside a master's network namespace, listening on that
host's address.

``reset_next_reply()`` lets the next request through but, instead of forwarding the master's
reply, resets the client's connection (a TCP RST): the master applied the request, the client
never hears so ("connection reset after apply").

``blackhole()`` keeps accepting and holding connections but forwards nothing (bytes are read and
discarded, as by a partitioned link). ``heal()`` forwards again and closes the connections that
lost bytes, since their streams can no longer be parsed.

One asyncio event loop in a daemon thread serves every connection.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

__all__ = ["DelayProxy"]

_HOST = "127.0.0.1"
_CHUNK = 65536

T = TypeVar("T")


class _Link:
    """One proxied connection: both writers, and whether a blackhole ate some of its bytes."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.writers = (client, upstream)
        self.deliveries: set[asyncio.Task[None]] = set()
        self.lost_bytes = False

    def close(self) -> None:
        """Close both sides at once, dropping whatever was still being delayed."""
        for delivery in self.deliveries:
            delivery.cancel()
        for writer in self.writers:
            writer.close()


class DelayProxy:
    """Forward ``listen_host``:``port`` to 127.0.0.1:``target_port``, ``delay`` seconds each way."""

    def __init__(
        self,
        target_port: int,
        delay: float = 0.0,
        *,
        listen_host: str = _HOST,
        listen_port: int = 0,
    ) -> None:
        self.target_port = target_port
        self.listen_host = listen_host
        #: Seconds added to every chunk in each direction; settable while running.
        self.delay = delay
        #: Connections accepted so far (a test can prove that no connection was attempted).
        self.accepted = 0
        self.port = listen_port
        self._blackholed = False
        self._resets = 0
        self._links: set[_Link] = set()
        self._serving: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.listen_host}:{self.port}/0"

    @property
    def open_connections(self) -> int:
        """Connections currently proxied (a test can prove that a client closed its sockets)."""
        return len(self._links)

    def __repr__(self) -> str:
        state = "blackholed" if self._blackholed else f"delay={self.delay}s"
        return f"<DelayProxy :{self.port} -> :{self.target_port} {state}>"

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> DelayProxy:
        if self._loop is not None:
            raise RuntimeError(f"{self!r} is already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._stopping = False
        self._thread = threading.Thread(
            target=loop.run_forever, name=f"DelayProxy->{self.target_port}", daemon=True
        )
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._serve, self.listen_host, self.port))
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._call(self._shutdown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- faults ----------------------------------------------------------------------------------

    def blackhole(self) -> None:
        """Forward nothing from now on; connections stay open and new ones are accepted."""
        self._blackholed = True

    def reset_next_reply(self) -> None:
        """The next reply from the master is dropped and its client's connection reset instead
        (the request itself still reaches the master)."""
        self._resets += 1

    def heal(self) -> None:
        """Forward again; close the connections whose bytes the blackhole discarded."""
        self._blackholed = False
        if self._loop is not None:
            self._call(self._close_damaged())

    # --- inside the proxy's event loop -----------------------------------------------------------

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` in the proxy's loop and wait for its result."""
        if self._loop is None:
            raise RuntimeError(f"{self!r} is not started")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        # Never let this task end cancelled or raising: asyncio (3.11) would log the client
        # callback's failure. Stopping closes the links instead, and each pump ends by itself.
        self.accepted += 1
        serving = asyncio.current_task()
        if serving is not None:
            self._serving.add(serving)
            serving.add_done_callback(self._serving.discard)
        try:
            upstream_in, upstream_out = await asyncio.open_connection(_HOST, self.target_port)
        except OSError:
            client_out.close()  # the master is down: the client sees its connection refused late
            return
        link = _Link(client_out, upstream_out)
        if self._stopping:
            link.close()
            return
        self._links.add(link)
        try:
            await asyncio.gather(
                self._pump(client_in, upstream_out, link),
                self._pump(upstream_in, client_out, link, replies=True),
            )
        finally:
            self._links.discard(link)
            link.close()

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        link: _Link,
        *,
        replies: bool = False,
    ) -> None:
        """Copy ``source`` to ``sink``, each chunk ``delay`` seconds after it was read.

        Reading and delivering are separate so that a long delay does not slow reading: every
        chunk is due at its own read time + delay, and chunks go out in the order they came in."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not data:  # end of stream, after everything sent before it
                    return
                try:
                    sink.write(data)
                    await sink.drain()
                except OSError:
                    return  # the receiving side is gone

        delivery = asyncio.create_task(deliver())
        link.deliveries.add(delivery)
        try:
            while True:
                try:
                    data = await source.read(_CHUNK)
                except OSError:
                    data = b""  # a reset ends this direction like an end of stream
                if data and self._blackholed:
                    link.lost_bytes = True
                    continue
                if data and replies and self._resets:
                    self._resets -= 1
                    _reset(sink)
                    link.close()
                    break
                queue.put_nowait((loop.time() + self.delay, data))
                if not data:
                    break
            await asyncio.wait([delivery])  # done, or cancelled by link.close()
        finally:
            delivery.cancel()
            # Closing the sink ends the other direction too (its reader sees end of stream).
            sink.close()

    async def _close_damaged(self) -> None:
        for link in [link for link in self._links if link.lost_bytes]:
            link.close()

    async def _shutdown(self) -> None:
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.close()
        if self._serving:
            await asyncio.wait(set(self._serving), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s socket with a TCP RST rather than an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
