"""What an execution's sandbox may reach over the network, and the worker's end of the relay.

An `Endpoint` is one address the execution declared: the model gateway, the tool proxy, an
HTTP mock, a database service. Under `network: services` (bubblewrap) the sandbox has no
route anywhere; `EgressRelay` listens on one Unix socket per endpoint, in a directory the
sandbox sees, and connects each accepted connection to the real address (`relay.py` is the
sandbox's end). A database endpoint also checks the login before a byte reaches the server:
only the execution's own role and database pass, so even a server that trusts every local
login (PostgreSQL's `trust`, MariaDB's password-less root) hands the agent nothing else.

Refused egress is evidence: on "trap" ports (every TCP port the worker's own host listens on,
and the usual ports of databases, caches and web servers) the sandbox's loopback accepts a
connection, the worker records the attempt (`EgressRelay.refused`) and closes it. An attempt
to any other address fails in the sandbox's empty network namespace (ENETUNREACH, or
ECONNREFUSED on an untrapped loopback port) without leaving a trace anywhere we can read.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from evaluations.runner.relay import listeners_on_loopback, serve, splice

CONNECT_TIMEOUT = 10.0
_LOGIN_TIMEOUT = 30.0  # a client that opens a database connection and says nothing


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A TCP address the sandbox may connect to, at the same host and port as on the host.
    `protocol` "postgres" or "mysql" admits only `user` (and, for PostgreSQL, `database`)."""

    host: str
    port: int
    protocol: str = "tcp"
    user: str = ""
    database: str = ""

    @classmethod
    def from_url(cls, url: str, **login: str) -> Endpoint | None:
        parts = urlsplit(url)
        if not parts.hostname:
            return None
        default = {"http": 80, "https": 443, "postgresql": 5432, "postgres": 5432, "mysql": 3306}
        port = parts.port or default.get(parts.scheme)
        return None if port is None else cls(parts.hostname, port, **login)


# Where servers usually listen: databases, caches, queues, web servers, the Docker and
# Kubernetes APIs. Trapped even when nothing listens there on this host.
WELL_KNOWN_PORTS = (
    22, 80, 443, 2375, 2376, 2379, 3000, 3306, 5000, 5432, 5672, 6379, 8000, 8080, 8443,
    8888, 9000, 9092, 9200, 10250, 11211, 15672, 27017,
)  # fmt: skip
# Each trap is a socket on both ends; enough for any host's listeners, never thousands.
MAX_TRAP_PORTS = 96
# Attempts kept per command: an agent that loops on a closed port is not worth megabytes.
MAX_REFUSED_RECORDED = 1000


def host_listening_ports() -> set[int]:
    """TCP ports something listens on in the worker's own network namespace."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def trap_ports(endpoints: Sequence[Endpoint], *, lowest: int = 1) -> list[int]:
    """The ports to trap for an execution: the host's listeners and the well-known ones, but
    not its endpoints' (those are relayed) nor any below `lowest` (a sandbox whose relay has
    no capability cannot bind ports below 1024)."""
    relayed = {endpoint.port for endpoint in endpoints}
    wanted = (host_listening_ports() | set(WELL_KNOWN_PORTS)) - relayed
    # The well-known ports first, so a host with many listeners never crowds them out.
    ordered = sorted(wanted, key=lambda port: (port not in WELL_KNOWN_PORTS, port))
    return sorted(port for port in ordered[:MAX_TRAP_PORTS] if port >= lowest)


class LoginRefused(Exception):
    """A database login other than the execution's own; the message goes back to the client."""


# --------------------------------------------------------------------------- PostgreSQL

_PG_PROTOCOL_3 = 196608
_PG_SSL_REQUEST = 80877103
_PG_GSS_REQUEST = 80877104


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the client closed the connection during login")
        data += chunk
    return data


def _postgres_startup(client: socket.socket, endpoint: Endpoint) -> bytes:
    """Read the client's startup message (declining TLS, which would hide it), check the
    login, and return the message to send on to the server."""
    while True:
        header = _recv_exactly(client, 8)
        length, code = struct.unpack("!ii", header)
        if not 8 <= length <= 10_000:
            raise LoginRefused("malformed startup message")
        body = _recv_exactly(client, length - 8)
        if code in (_PG_SSL_REQUEST, _PG_GSS_REQUEST):
            client.sendall(b"N")  # no encryption: the client goes on in the clear, on loopback
            continue
        if code != _PG_PROTOCOL_3:
            raise LoginRefused("only protocol 3.0 logins are relayed")
        words = body.split(b"\0")
        params = dict(zip(words[0::2], words[1::2], strict=False))
        user = params.get(b"user", b"").decode(errors="replace")
        database = params.get(b"database", b"").decode(errors="replace") or user
        if user != endpoint.user or database != endpoint.database:
            raise LoginRefused(
                f"this sandbox may log in only as {endpoint.user!r} to {endpoint.database!r}"
                f" (asked for {user!r} to {database!r})"
            )
        return header + body


def _postgres_refusal(message: str) -> bytes:
    fields = b"SFATAL\0VFATAL\0C28000\0M" + f"keystone: {message}".encode() + b"\0\0"
    return b"E" + struct.pack("!i", len(fields) + 4) + fields


# --------------------------------------------------------------------------- MySQL / MariaDB

_MYSQL_CLIENT_SSL = 0x0800


def _mysql_packet(sock: socket.socket) -> tuple[int, bytes]:
    header = _recv_exactly(sock, 4)
    length = header[0] | header[1] << 8 | header[2] << 16
    return header[3], _recv_exactly(sock, length)


def _mysql_send(sock: socket.socket, sequence: int, payload: bytes) -> None:
    sock.sendall(len(payload).to_bytes(3, "little") + bytes([sequence]) + payload)


def _mysql_login(client: socket.socket, server: socket.socket, endpoint: Endpoint) -> None:
    """Pass the server's greeting on without the TLS capability (a TLS client would hide its
    login), then let the client's login through only for the execution's own user."""
    sequence, greeting = _mysql_packet(server)
    if greeting[:1] == b"\xff":  # the server refused us (too many connections, ...): pass it on
        _mysql_send(client, sequence, greeting)
        raise ConnectionError("the database server refused the connection")
    version_end = greeting.index(b"\0", 1)
    flags_at = version_end + 1 + 4 + 8 + 1  # thread id, scramble part 1, filler
    flags = int.from_bytes(greeting[flags_at : flags_at + 2], "little") & ~_MYSQL_CLIENT_SSL
    greeting = greeting[:flags_at] + flags.to_bytes(2, "little") + greeting[flags_at + 2 :]
    _mysql_send(client, sequence, greeting)
    sequence, response = _mysql_packet(client)
    user = response[32 : response.index(b"\0", 32)].decode(errors="replace")
    if user != endpoint.user:
        message = (
            f"keystone: this sandbox may log in only as {endpoint.user!r} (asked for {user!r})"
        )
        error = b"\xff" + (1045).to_bytes(2, "little") + b"#28000" + message.encode()
        _mysql_send(client, sequence + 1, error)
        raise LoginRefused(message)
    _mysql_send(server, sequence, response)


# --------------------------------------------------------------------------- the relay

_CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot enter the network namespace: {os.strerror(errno)}")


class EgressRelay:
    """The worker's end of the relay: listeners for the execution's endpoints, each accepted
    connection checked (database logins) and relayed to the real address. Two ways to listen:
    Unix sockets in `directory` for a sandbox that runs `relay.py` inside (bubblewrap), or
    TCP listeners made directly inside a container's network namespace (docker)."""

    def __init__(self, endpoints: Sequence[Endpoint], *, traps: Sequence[int] = ()) -> None:
        by_port: dict[int, Endpoint] = {}
        for endpoint in endpoints:
            by_port.setdefault(endpoint.port, endpoint)
        self.endpoints = by_port
        self.traps = sorted(set(traps) - set(by_port))
        # Every connection the sandbox made to a trap: {"host", "port", "time"}.
        self.refused: list[dict[str, object]] = []
        self.directory: Path | None = None
        self._listeners: list[socket.socket] = []
        self._stopped = threading.Event()
        self._lock = threading.Lock()

    @property
    def ports(self) -> list[int]:
        """Every port the sandbox's end listens on: the endpoints' and the traps."""
        return sorted([*self.endpoints, *self.traps])

    @property
    def host_names(self) -> list[str]:
        """The endpoints' host names other than loopback: inside, they must name 127.0.0.1
        (a DSN's `db` in a compose deployment)."""
        return sorted({e.host for e in self.endpoints.values()} - {"127.0.0.1", "::1", "localhost"})

    def __enter__(self) -> EgressRelay:
        return self

    def listen_unix(self) -> Path:
        """One Unix socket per endpoint, `PORT.sock`, and a `hosts` file, in a new directory
        the sandbox's user can reach (nobody, or the worker's uid mapped)."""
        self.directory = Path(tempfile.mkdtemp(prefix="keystone-egress-"))
        os.chmod(self.directory, 0o755)
        hosts = "127.0.0.1 localhost " + " ".join(self.host_names) + "\n::1 localhost\n"
        (self.directory / "hosts").write_text(hosts)
        for port in self.ports:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            path = self.directory / f"{port}.sock"
            listener.bind(str(path))
            os.chmod(path, 0o777)
            self._serve(listener, self._handler_for(port))
        return self.directory

    def listen_in_namespace(self, pid: int) -> None:
        """TCP listeners on the endpoints' ports inside the network namespace of process
        `pid`. A thread enters the namespace, makes them and leaves: a socket belongs to the
        namespace it was made in, wherever it is used from. Needs CAP_SYS_ADMIN (root)."""
        made: list[tuple[socket.socket, int]] = []
        failure: list[OSError] = []

        def enter_and_listen() -> None:
            own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                _setns(target)
                try:
                    for port in self.ports:
                        made.extend((sock, port) for sock in listeners_on_loopback(port))
                finally:
                    _setns(own)
            except OSError as exc:
                failure.append(exc)
            finally:
                os.close(own)
                os.close(target)

        thread = threading.Thread(target=enter_and_listen)
        thread.start()
        thread.join()
        for listener, port in made:
            self._serve(listener, self._handler_for(port))
        if failure:
            raise failure[0]

    def _serve(self, listener: socket.socket, handle: Callable[[socket.socket], None]) -> None:
        listener.listen(64)
        self._listeners.append(listener)
        threading.Thread(
            target=serve,
            args=(listener, handle),
            kwargs={"stopped": self._stopped},
            daemon=True,
        ).start()

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept()
            listener.close()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _handler_for(self, port: int) -> Callable[[socket.socket], None]:
        endpoint = self.endpoints.get(port)
        return self._handler(endpoint) if endpoint is not None else self._trap(port)

    def _trap(self, port: int) -> Callable[[socket.socket], None]:
        def handle(client: socket.socket) -> None:
            # A Unix socket (bubblewrap's relay) says no address; a TCP one (docker) does.
            address = client.getsockname()
            host = address[0] if isinstance(address, tuple) else "localhost"
            with self._lock:
                if len(self.refused) < MAX_REFUSED_RECORDED:
                    self.refused.append({"host": host, "port": port, "time": time.time()})
            client.close()

        return handle

    def _handler(self, endpoint: Endpoint) -> Callable[[socket.socket], None]:
        def handle(client: socket.socket) -> None:
            try:
                self._relay(client, endpoint)
            except (OSError, ConnectionError, LoginRefused, ValueError):
                client.close()

        return handle

    def _relay(self, client: socket.socket, endpoint: Endpoint) -> None:
        first = b""
        if endpoint.protocol == "postgres":
            client.settimeout(_LOGIN_TIMEOUT)
            try:
                first = _postgres_startup(client, endpoint)
            except LoginRefused as refused:
                client.sendall(_postgres_refusal(str(refused)))
                raise
            client.settimeout(None)
        try:
            server = socket.create_connection(
                (endpoint.host, endpoint.port), timeout=CONNECT_TIMEOUT
            )
        except OSError:
            client.close()
            return
        try:
            if endpoint.protocol == "mysql":
                client.settimeout(_LOGIN_TIMEOUT)
                _mysql_login(client, server, endpoint)
                client.settimeout(None)
            server.settimeout(None)
            server.sendall(first)
        except BaseException:
            server.close()
            raise
        splice(client, server)
