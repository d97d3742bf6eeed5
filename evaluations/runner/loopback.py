"""Serving one of the execution's local servers (model gateway, tool proxy, HTTP mocks) on a
thread, and stopping it at once.

socketserver's serve_forever() notices shutdown() only at its next poll timeout, and every
execution stops its servers: a short poll costs CPU while the server runs, a long one costs
every execution that wait. Here the loop also watches one end of a socket pair, so stop()
wakes it immediately."""

from __future__ import annotations

import selectors
import socket
import socketserver
import threading


class ServerThread:
    def __init__(self, server: socketserver.TCPServer, name: str) -> None:
        self._server = server
        server.timeout = 0  # handle_request() below is called only when a connection waits
        self._stop = threading.Event()
        self._wake_read, self._wake_write = socket.socketpair()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in selector.select():
                    if key.fileobj is self._server and not self._stop.is_set():
                        self._server.handle_request()  # accept; a handler thread serves it

    def stop(self) -> None:
        """Stop accepting (connections being served finish on their own threads)."""
        self._stop.set()
        if self._thread.is_alive():
            self._wake_write.send(b"\0")
            self._thread.join(timeout=5)
        self._wake_read.close()
        self._wake_write.close()
