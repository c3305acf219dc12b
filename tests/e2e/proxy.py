"""A TCP proxy on localhost that a test can cut and heal: a network partition
between one process and a server, without touching the server. It can also
stall: keep connections open but hold every byte, like a link that went silent
(the peers see timeouts, not resets)."""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttableProxy:
    """Forwards 127.0.0.1:<port> to ``target``; ``cut()`` drops and refuses connections,
    ``stall()`` holds all bytes in both directions until ``unstall()``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self._cut = threading.Event()
        self._flowing = threading.Event()  # cleared while stalled
        self._flowing.set()
        self._closed = threading.Event()
        threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
                    connection.close()
            self._connections.clear()

    def heal(self) -> None:
        self._cut.clear()

    def stall(self) -> None:
        """Hold every byte from now on (connections stay open; new ones are accepted)."""
        self._flowing.clear()

    def unstall(self) -> None:
        """Deliver what was held and forward again."""
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()  # release pumps held by a stall so they see the closed sockets
        self.cut()
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            # The timeout was for connecting only: an idle connection (a LISTEN, a
            # pooled one) must stay open however long it is quiet.
            upstream.settimeout(None)
            with self._lock:
                self._connections.extend([client, upstream])
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                # A stall holds these bytes here and, by not reading on, those behind them.
                self._flowing.wait()
                sink.sendall(data)
        # Either side ended: end both (the other pump then ends too) and close them.
        with self._lock:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()
                if end in self._connections:
                    self._connections.remove(end)
