"""Serving the execution's local servers (model gateway, tool proxy, HTTP mocks), and
stopping one at once.

One thread per process accepts the connections of every server started here; each
connection is then served on its own thread, as the server's ThreadingMixIn does. A thread
per server cost every execution a thread start and a join, each waiting for the GIL (a
tenth of an execution's time when its process was busy, issue 18); and socketserver's own
serve_forever() notices shutdown() only at its next poll timeout, where a short poll costs
CPU and a long one delays every execution's stop. Here `stop` takes the server out of the
loop's selector under the loop's lock, so once it returns no connection is accepted.
"""

from __future__ import annotations

import logging
import os
import selectors
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

logger = logging.getLogger(__name__)


class _AcceptLoop:
    """The process's accepting thread, started with the first server."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.selector = selectors.DefaultSelector()
        self.thread: threading.Thread | None = None

    def add(self, server: socketserver.TCPServer) -> None:
        with self.lock:
            stale = self.selector.get_map().get(server.fileno())
            if stale is not None:  # a server closed without stop() had this descriptor
                self.selector.unregister(stale.fileobj)
            # An epoll set takes new members while another thread waits on it.
            self.selector.register(server, selectors.EVENT_READ)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="loopback", daemon=True)
                self.thread.start()

    def remove(self, server: socketserver.TCPServer) -> None:
        with self.lock:
            self.selector.unregister(server)

    def _run(self) -> None:
        while True:
            ready = self.selector.select()
            with self.lock:
                for key, _ in ready:
                    # Removed meanwhile (its descriptor may even be another server's now).
                    if self.selector.get_map().get(key.fd) is not key:
                        continue
                    try:
                        key.fileobj.handle_request()  # type: ignore[union-attr]  # accept
                    except Exception:  # one server's failure must not stop the others'
                        logger.exception("a loopback server failed to accept")


_loop = _AcceptLoop()


def _loop_of_a_forked_process() -> None:
    """A forked process starts with no accepting thread and none of its parent's servers."""
    global _loop
    _loop = _AcceptLoop()


os.register_at_fork(after_in_child=_loop_of_a_forked_process)


class LoopbackServer(ThreadingHTTPServer):
    """An HTTP server of an execution's, on 127.0.0.1 at a port the kernel picks; each
    connection is served on a thread of its own, which does not keep the process alive."""

    daemon_threads = True

    def __init__(self, handler_class: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler_class)

    def server_bind(self) -> None:
        # Not HTTPServer's, which asks the resolver for the address's name (getfqdn: the
        # name service switch and the hosts file, at every execution's start) to fill in a
        # name that only CGI reads.
        socketserver.TCPServer.server_bind(self)
        host, self.server_port = self.server_address[:2]
        self.server_name = str(host)


class ServerThread:
    """A server served by the process's accepting thread from `start` to `stop`. (The name
    says what it was: a thread of its own.)"""

    def __init__(self, server: socketserver.TCPServer) -> None:
        self._server = server
        server.timeout = 0  # handle_request() is called only when a connection waits
        self._serving = False

    def start(self) -> None:
        _loop.add(self._server)
        self._serving = True

    def stop(self) -> None:
        """Stop accepting (connections being served finish on their own threads)."""
        if self._serving:
            _loop.remove(self._server)
            self._serving = False
