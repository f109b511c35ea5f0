"""A TCP proxy that slows what it forwards, standing for a server on a loaded machine: each
chunk waits its size over `rate` bytes per second before it goes on, in both directions.

The slowness it adds is counted, not measured: `added_s` is the bytes forwarded over the
rate, so a test can say how far past a timeout the traffic was slowed without reading a
clock. Import it by name (`from slow_proxy_testlib import SlowProxy`).
"""

from __future__ import annotations

import socket
import threading
import time

from services_testlib import free_port

CHUNK = 65536


class SlowProxy:
    def __init__(self, upstream_port: int, rate: float):
        self.upstream = ("127.0.0.1", upstream_port)
        self.rate = rate
        self.port = free_port()
        self.bytes_up = 0  # client to server
        self.bytes_down = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def added_s(self) -> float:
        """The delay the proxy has added to everything it forwarded, in all."""
        return (self.bytes_up + self.bytes_down) / self.rate

    def start(self) -> SlowProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, up: bool) -> None:
        try:
            while chunk := source.recv(CHUNK):
                time.sleep(len(chunk) / self.rate)  # the slowness this proxy stands for
                sink.sendall(chunk)
                with self._lock:
                    if up:
                        self.bytes_up += len(chunk)
                    else:
                        self.bytes_down += len(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
