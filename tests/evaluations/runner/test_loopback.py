"""evaluations.runner.loopback: the execution's local servers serve on a thread and stop
when asked, however many connections they served or are serving."""

from __future__ import annotations

import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from evaluations.runner.loopback import LoopbackServer, ServerThread


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"hello"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_serves_until_stopped_then_refuses() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    server.daemon_threads = True
    port = server.server_address[1]
    thread = ServerThread(server)
    thread.start()
    for _ in range(20):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
            assert answer.read() == b"hello"
    # A client that connected and says nothing must not hold the stop.
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)
    thread.stop()
    server.server_close()
    idle.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)


def test_one_thread_accepts_for_every_server_and_a_stopped_one_accepts_nothing() -> None:
    """Servers started and stopped one after another, and several at once, as executions
    do: each answers while started, a stopped one takes no connection even before it is
    closed, and the process has one accepting thread for them all."""
    for _ in range(10):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
        server.daemon_threads = True
        alone = ServerThread(server)
        alone.start()
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
            assert answer.read() == b"hello"
        alone.stop()
        servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Hello) for _ in range(3)]
        threads = [ServerThread(s) for s in servers]
        for thread in threads:
            thread.start()
        for s in servers:
            with urllib.request.urlopen(f"http://127.0.0.1:{s.server_address[1]}/") as answer:
                assert answer.read() == b"hello"
        stopped = threads[0]
        stopped.stop()
        # Still listening (not closed), but no longer accepted: the client waits in vain.
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{servers[0].server_address[1]}/", timeout=0.3)
        for thread in threads[1:]:
            thread.stop()
        for s in [server, *servers]:
            s.server_close()
    assert [t.name for t in threading.enumerate()].count("loopback") == 1


def test_stop_before_start_is_harmless() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = ServerThread(server)
    thread.stop()
    server.server_close()


def test_a_server_closed_without_stop_does_not_block_the_next_on_its_descriptor() -> None:
    forgotten = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    ServerThread(forgotten).start()
    descriptor = forgotten.fileno()
    forgotten.server_close()  # its owner never called stop()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    assert server.fileno() == descriptor  # the lowest free descriptor, reused
    thread = ServerThread(server)
    thread.start()
    with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=5) as a:
        assert a.read() == b"hello"
    thread.stop()
    server.server_close()


def test_a_loopback_server_starts_without_asking_the_resolver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTPServer looks up its address's name at every start (the name service switch and
    the hosts file): an execution's servers do not, and still serve."""
    asked: list[str] = []
    monkeypatch.setattr(socket, "getfqdn", lambda name="": asked.append(name) or "looked-up")
    server = LoopbackServer(_Hello)
    thread = ServerThread(server)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.read() == b"hello"
    finally:
        thread.stop()
        server.server_close()
    assert asked == []
    assert (server.server_name, server.server_port) == ("127.0.0.1", server.server_address[1])
    assert server.daemon_threads
