"""Byte relays between TCP ports and Unix sockets: how a sandbox with a network namespace of
its own reaches exactly the endpoints its execution declared, and nothing else.

`network: services` under bubblewrap: the sandbox has its own network namespace (loopback
only, no route out). For every endpoint of the execution (the model gateway, the tool proxy,
HTTP mocks, database services) the worker listens on a Unix socket in a per-execution
directory (`egress.EgressRelay`), and inside the sandbox this file, run as a script before
the agent's command, listens on 127.0.0.1:PORT and relays each connection to the socket for
that port. The agent sees the same URLs and DSNs as on the host; every other address,
the server's own database, Redis, web port or a metadata service, is unreachable.
The worker can also give it "trap" ports (`egress.trap_ports`): relayed like the others to a
socket where the worker records the attempt and closes the connection.

Run inside the sandbox by the sandbox's interpreter with `-I -S`, so it imports nothing but
the standard library:

    python -I -S relay.py SOCKET_DIR PORT [PORT ...] -- COMMAND [ARG ...]

It binds every port first, then forks: the child relays, the parent execs the command, which
stays the sandbox's PID 1, so when it exits the kernel ends the relay with it.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sys
import threading
from collections.abc import Callable

BUFFER = 65536


def pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes one way until the source ends, then tell the sink no more is coming."""
    try:
        while chunk := source.recv(BUFFER):
            sink.sendall(chunk)
    except OSError:
        pass  # either side went away: the other direction notices on its own
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def splice(first: socket.socket, second: socket.socket) -> None:
    """Relay both ways until both directions are done, then close both sockets."""
    back = threading.Thread(target=pipe, args=(second, first), daemon=True)
    back.start()
    pipe(first, second)
    back.join()
    first.close()
    second.close()


def serve(
    listener: socket.socket,
    handle: Callable[[socket.socket], None],
    *,
    stopped: threading.Event | None = None,
) -> None:
    """Accept connections for ever (or until `stopped`), each handled on a thread of its own."""
    while stopped is None or not stopped.is_set():
        try:
            client, _ = listener.accept()
        except OSError:
            return  # the listener was closed: the relay is being torn down
        threading.Thread(target=handle, args=(client,), daemon=True).start()


def _connect_unix(client: socket.socket, path: str) -> socket.socket | None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        upstream.close()
        client.close()  # the worker's side is gone: refuse as a closed port would
        return None
    return upstream


def listeners_on_loopback(port: int) -> list[socket.socket]:
    """Sockets bound to 127.0.0.1:PORT, and [::1]:PORT when the namespace has IPv6, so
    `localhost` works; not listening yet."""
    bound = []
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            sock.close()
            if family == socket.AF_INET:
                raise
            continue
        bound.append(sock)
    return bound


def main(argv: list[str]) -> None:
    separator = argv.index("--")
    socket_dir, ports, command = argv[0], argv[1:separator], argv[separator + 1 :]
    listeners = []
    for port in ports:
        try:
            bound = listeners_on_loopback(int(port))
        except OSError as exc:
            # Said where the agent's own errors are read; the agent still runs, and finds
            # that one endpoint refused like any closed port.
            print(f"keystone relay: cannot listen on 127.0.0.1:{port}: {exc}", file=sys.stderr)
            continue
        listeners += [(sock, os.path.join(socket_dir, f"{port}.sock")) for sock in bound]
    # Listening before the fork: a command that connects before the relay's child runs
    # waits in the backlog instead of being refused.
    for sock, _ in listeners:
        sock.listen(64)
    if os.fork() == 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # never hold the agent's output pipes open
            os.dup2(devnull, fd)
        # One thread accepts on every port (threads count against the sandbox's process
        # limit, and there are many ports: the endpoints and the worker's traps).
        with selectors.DefaultSelector() as selector:
            for sock, path in listeners:
                selector.register(sock, selectors.EVENT_READ, path)
            while selector.get_map():
                for key, _events in selector.select():
                    try:
                        client, _ = key.fileobj.accept()  # type: ignore[union-attr]
                    except OSError:
                        continue
                    # Connected to the worker at once, not on the new thread: the worker
                    # then has the connection even if the command exits right away (and
                    # the kernel ends this relay with it).
                    upstream = _connect_unix(client, key.data)
                    if upstream is not None:
                        threading.Thread(
                            target=splice, args=(client, upstream), daemon=True
                        ).start()
        os._exit(0)
    for sock, _ in listeners:
        sock.close()
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec:
    # the command gets the defaults it would have had without the relay (`yes | head` ends).
    for number in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(number, signal.SIG_DFL)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
