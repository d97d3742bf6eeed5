"""The services of one execution (`services:` in the spec), started together and torn down
together.

    with ServiceSet(spec.services, spec_dir=..., execution_key=..., postgres_url=...,
                    mysql_url=..., sqlite_dir=...) as services:
        run the agent with services.env
        artifact.http_calls = services.http_log(); artifact.db_writes = services.db_writes()
        checks see services.handles

Server URLs come in as arguments: the runner does not read Django settings.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType
from typing import Any

from checks.artifact import HttpCall
from checks.context import ServiceHandle
from evaluations.runner.databases import (
    DATABASE_TYPES,
    DatabaseService,
    MysqlService,
    PostgresService,
    SqliteService,
    database_name,
    load_seed,
)
from evaluations.runner.http_mock import HttpMockService, ServiceTypeError

logger = logging.getLogger(__name__)

__all__ = ["ServiceError", "ServiceNotConfigured", "ServiceSet", "ServiceTypeError", "env_prefix"]

_SERVER_SETTING = {"postgres": "KEYSTONE_POSTGRES_URL", "mysql": "KEYSTONE_MYSQL_URL"}


class ServiceError(Exception):
    """A service could not be started (bad seed, no server configured, server unreachable)."""

    def __init__(self, service: str, message: str) -> None:
        super().__init__(f"service '{service}': {message}")
        self.service = service
        self.message = message


class ServiceNotConfigured(ServiceError):
    """The spec needs a database server this Keystone has none of: no retry can help."""


def env_prefix(service_name: str) -> str:
    return "KEYSTONE_SERVICE_" + service_name.upper().replace("-", "_") + "_"


_Service = DatabaseService | HttpMockService


class ServiceSet:
    def __init__(
        self,
        services: list[dict[str, Any]],
        *,
        spec_dir: Path,
        execution_key: str,
        postgres_url: str | None,
        mysql_url: str | None,
        sqlite_dir: Path,
    ) -> None:
        self.declared = list(services)
        self.spec_dir = Path(spec_dir)
        self.execution_key = execution_key
        self.server_urls = {"postgres": postgres_url, "mysql": mysql_url}
        self.sqlite_dir = Path(sqlite_dir)
        self.env: dict[str, str] = {}
        self.handles: dict[str, ServiceHandle] = {}
        self._running: list[_Service] = []

    def __enter__(self) -> ServiceSet:
        # Build (and so validate) every service before starting any: a config error must not
        # cost a database creation.
        built = [self._build(service) for service in self.declared]
        try:
            for service in built:
                # Registered before start(): a half-started service is cleaned up as well.
                self._running.append(service)
                try:
                    service.start()
                except Exception as exc:
                    raise ServiceError(service.name, _describe_failure(service, exc)) from exc
        except BaseException:
            self._stop_all()
            raise
        self.handles = {service.name: service for service in built}
        self.env = _agent_env(built)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop_all()

    def _build(self, service: dict[str, Any]) -> _Service:
        name = str(service.get("name") or "")
        kind = str(service.get("type") or "")
        if not name:
            raise ServiceError("?", "a service needs a name")
        if any(other.get("name") == name for other in self.declared if other is not service):
            raise ServiceError(name, "two services have this name")
        if kind == "http_mock":
            return HttpMockService(service)
        if kind not in DATABASE_TYPES:
            raise ServiceError(name, f"unknown service type {kind!r}")
        try:
            seed = load_seed(service, self.spec_dir)
        except (OSError, ValueError) as exc:
            raise ServiceError(name, str(exc)) from exc
        database = database_name(self.execution_key, name)
        if kind == "sqlite":
            return SqliteService(name, seed, directory=self.sqlite_dir, database=database)
        server_url = self.server_urls[kind]
        if not server_url:
            raise ServiceNotConfigured(
                name,
                f"the spec needs a {kind} server and this Keystone has none: set "
                f"{_SERVER_SETTING[kind]} to a server where it may create a database per execution",
            )
        if kind == "postgres":
            return PostgresService(name, seed, server_url=server_url, database=database)
        return MysqlService(name, seed, server_url=server_url, database=database)

    def _stop_all(self) -> None:
        # Always runs to the end: one failed drop must not leave the other services behind.
        while self._running:
            service = self._running.pop()
            try:
                service.stop()
            except Exception:
                logger.exception("could not stop service %r (%s)", service.name, service.type)

    def http_log(self) -> list[HttpCall]:
        """Every request every mock got, in time order (for the audit and `forbidden`)."""
        calls = [
            call
            for handle in self.handles.values()
            if isinstance(handle, HttpMockService)
            for call in handle.http_log()
        ]
        return sorted(calls, key=lambda call: call.time)

    def db_writes(self) -> list[dict[str, Any]]:
        """Tables whose contents changed since the seed, per database service. Call it after
        the agent finished and before leaving the `with` block."""
        writes: list[dict[str, Any]] = []
        for handle in self.handles.values():
            if isinstance(handle, DatabaseService):
                try:
                    writes.extend(handle.db_writes())
                except Exception as exc:  # the agent may have broken its own database
                    logger.warning("db_writes of %r failed: %s", handle.name, exc)
                    writes.append(
                        {
                            "service": handle.name,
                            "table": "(unknown)",
                            "change": "unknown",
                            "error": str(exc),
                        }
                    )
        return writes


def _agent_env(services: list[_Service]) -> dict[str, str]:
    env: dict[str, str] = {}
    for service in services:
        prefix = env_prefix(service.name)
        env.update({prefix + key: value for key, value in service.env().items()})
    databases = [s for s in services if isinstance(s, DatabaseService)]
    if len(databases) == 1:
        env["DATABASE_URL"] = databases[0].dsn
    return env


def _describe_failure(service: _Service, exc: Exception) -> str:
    detail = str(exc).strip() or type(exc).__name__
    if isinstance(service, DatabaseService) and service.seed.scripts and service.created:
        return f"{service.type} seed failed: {detail}"
    return f"{service.type} could not start: {detail}"
