"""Keystone's one settings file. Everything comes from the environment.

With no environment at all Keystone runs on its embedded default: SQLite and artifacts
under var/ (or $KEYSTONE_HOME), tasks executed in-process, DEBUG off, a secret key made
once under $KEYSTONE_HOME. Production sets DATABASE_URL, CELERY_BROKER_URL, SECRET_KEY (the
same on every host) and ALLOWED_HOSTS.
The table of variables is in README.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from evaluations.runner import local_uids as _local_uids

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true or false)")


def env_int(name: str, default: int) -> int:
    raw = env_str(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from exc


def env_float(name: str, default: float) -> float:
    raw = env_str(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from exc


def env_list(name: str, default: list[str]) -> list[str]:
    raw = env_str(name)
    if not raw:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


# --- Core -------------------------------------------------------------------------------

# DEBUG is off unless asked for (DEBUG=true, for working on Keystone itself): no traceback
# ever reaches a user, and no query log slows the workers down.
DEBUG = env_bool("DEBUG", False)

# Where the embedded default keeps its state (database, artifacts, sandboxes' scratch).
KEYSTONE_HOME = Path(env_str("KEYSTONE_HOME") or BASE_DIR / "var").expanduser().resolve()
KEYSTONE_HOME.mkdir(parents=True, exist_ok=True)


def _generated_secret_key(path: Path) -> str:
    """The key of this KEYSTONE_HOME: made once (random, readable by its owner only) and
    kept, so sessions and signed values survive restarts. Several hosts sharing one database
    must set SECRET_KEY instead (docker-compose.yml does)."""
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        key = _new_secret_key(path)
    if not key:
        raise ImproperlyConfigured(
            f"{path} holds no key: delete it to have a new one made (sessions signed with the "
            "old one end), or set SECRET_KEY"
        )
    return key


def _new_secret_key(path: Path) -> str:
    """A key written to a file of its own, then linked into place: the key file appears whole
    or not at all (a file created empty, then written, was read empty by a process starting
    at the same moment, or stayed empty when its writer was stopped in between), and when
    processes of a fresh install start together, every one of them keeps the first key."""
    key = secrets.token_urlsafe(50)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    handle = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(handle, "w") as file:
            file.write(key)
        os.link(partial, path)
    except FileExistsError:  # another process of this install made it meanwhile
        return path.read_text().strip()
    finally:
        os.unlink(partial)
    return key


SECRET_KEY = env_str("SECRET_KEY") or _generated_secret_key(KEYSTONE_HOME / "secret_key")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    # SimpleAdminConfig: the admin modules are imported by keystone_web/urls.py, which only
    # the web server loads, not at every command's start-up (~20 M instructions).
    "django.contrib.admin.apps.SimpleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # Before staticfiles so runserver serves static files through WhiteNoise too.
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    # SimpleAppConfig: the partials loader is configured explicitly in TEMPLATES below
    # instead of being patched in at start-up.
    "template_partials.apps.SimpleAppConfig",
    "evaluations",
]

# django-ninja's own templates and static files: /api/docs serves Swagger UI from this
# server, not a CDN, so it works on an offline or firewalled host (keystone_web.api.Docs).
# Found by path rather than by listing "ninja" in INSTALLED_APPS: an installed app is
# imported by django.setup(), and ninja pulls in pydantic, which every CLI command would
# then pay for (~150 ms) without serving a page. find_spec locates it without importing.
_ninja_spec = importlib.util.find_spec("ninja")
if _ninja_spec is None or not _ninja_spec.submodule_search_locations:
    raise ImproperlyConfigured("django-ninja is not installed")
_NINJA_DIR = Path(list(_ninja_spec.submodule_search_locations)[0])

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "keystone_web.middleware.RefuseNulMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "keystone_web.urls"
WSGI_APPLICATION = "keystone_web.wsgi.application"
ASGI_APPLICATION = "keystone_web.asgi.application"

TEMPLATES: list[dict[str, Any]] = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", _NINJA_DIR / "templates"],
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.debug",
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            # `{% partialdef %}` everywhere without `{% load partials %}`.
            "builtins": ["template_partials.templatetags.partials"],
            "loaders": [
                (
                    "template_partials.loader.Loader",
                    [
                        (
                            "django.template.loaders.cached.Loader",
                            [
                                "django.template.loaders.filesystem.Loader",
                                "django.template.loaders.app_directories.Loader",
                            ],
                        )
                    ],
                )
            ],
        },
    }
]

# --- Database ---------------------------------------------------------------------------

DATABASE_URL = env_str("DATABASE_URL")
SQLITE_PATH = KEYSTONE_HOME / "keystone.sqlite3"


def _owner_only(path: Path, *, directory: bool = False) -> None:
    """Make `path` (created if missing) readable by its owner only. KEYSTONE_HOME stays
    traversable: a local agent running as nobody reaches its workspace through it (under
    KEYSTONE_HOME/work), and would otherwise read the embedded database (sessions, password
    and token hashes, every project's results) or the artifacts by their path."""
    if directory:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    elif not path.exists():
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    if path.stat().st_mode & 0o077:  # an older KEYSTONE_HOME's, or made under another umask
        try:
            os.chmod(path, 0o700 if directory else 0o600)
        except PermissionError as exc:
            raise ImproperlyConfigured(
                f"{path} is readable by other users and cannot be made private: {exc} "
                "(run Keystone as the owner of KEYSTONE_HOME)"
            ) from exc


if DATABASE_URL:
    # postgresql:// uses django.db.backends.postgresql, which picks psycopg 3.
    DATABASES = {
        "default": dj_database_url.parse(
            DATABASE_URL,
            conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
            conn_health_checks=True,
        )
    }
else:
    # SQLite makes its -wal and -shm files with the database file's mode.
    for _sqlite_file in (SQLITE_PATH, *(Path(f"{SQLITE_PATH}{x}") for x in ("-wal", "-shm"))):
        if _sqlite_file == SQLITE_PATH or _sqlite_file.exists():
            _owner_only(_sqlite_file)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(SQLITE_PATH),
            "OPTIONS": {
                # The embedded server writes from the web process and its worker at once:
                # WAL lets readers proceed, IMMEDIATE takes the write lock up front so two
                # writers wait on the busy timeout instead of failing mid-transaction.
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth -------------------------------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

# Cookies only over HTTPS when the server says it is reached over HTTPS (KEYSTONE_BASE_URL),
# so that the zero-configuration `keystone serve` on http://127.0.0.1 can log people in.
_HTTPS = env_str("KEYSTONE_BASE_URL").startswith("https://")
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", _HTTPS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", _HTTPS)
if SESSION_COOKIE_SECURE:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- I18N -------------------------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

# --- Static files and artifacts ---------------------------------------------------------

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static", _NINJA_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT") or KEYSTONE_HOME / "staticfiles")
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Serve straight from static/ too, so the embedded default needs no collectstatic step even
# with DEBUG off; the Docker image still runs collectstatic for the compressed copies.
WHITENOISE_USE_FINDERS = True

KEYSTONE_ARTIFACT_ROOT = Path(
    env_str("KEYSTONE_ARTIFACT_ROOT") or KEYSTONE_HOME / "artifacts"
).resolve()
if not env_str("KEYSTONE_ARTIFACT_ROOT"):
    # Next to the workspaces: only the server reads them (an operator's own root is theirs).
    _owner_only(KEYSTONE_ARTIFACT_ROOT, directory=True)
MEDIA_ROOT = KEYSTONE_ARTIFACT_ROOT
MEDIA_URL = "artifacts/"

STORAGES = {
    # Artifact blobs (stdout, traces, diffs) live here, never in database rows.
    "default": {
        "BACKEND": "evaluations.storage.ArtifactStorage",
        "OPTIONS": {"location": KEYSTONE_ARTIFACT_ROOT, "base_url": "/artifacts/"},
    },
    # Compressed, but not manifest-hashed: the embedded default runs without collectstatic.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --- Celery -----------------------------------------------------------------------------
# Read by keystone_web/celery.py through config_from_object(namespace="CELERY").

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL")
# True while `keystone serve` runs its database-polling worker (no broker): queued runs are
# left for that worker instead of being executed eagerly inside the request that made them.
KEYSTONE_EMBEDDED_WORKER = False

# No broker = the embedded default: tasks run in the calling process, errors propagate.
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
if CELERY_TASK_ALWAYS_EAGER:
    CELERY_BROKER_URL = "memory://"  # never used for eager tasks; spares kombu's warning
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND") or None
CELERY_TASK_IGNORE_RESULT = CELERY_RESULT_BACKEND is None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# Tasks are idempotent (they claim rows with a conditional UPDATE), so a task whose worker
# died is safer redelivered than lost.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fix-up closes a worker's database connections after every task: each
# message paid a new PostgreSQL session (a server process forked, ~5 ms of connecting).
# With this set it closes them only every this many tasks; keystone_web/celery.py closes
# them around each task as Django's request cycle does: when broken, or older than
# DATABASE_CONN_MAX_AGE (0 closes them after every task, as before).
CELERY_DB_REUSE_MAX = 1000
# A pool process whose peak resident memory went above this many KiB during a task (it
# finalised a run of tens of thousands of executions, say) is replaced by a fresh one once
# the task is done, instead of keeping that memory for the rest of the worker's life (Python
# seldom hands freed memory back). A worker's process is ~90 MB after ordinary tasks.
# 0 turns this off.
CELERY_WORKER_MAX_MEMORY_PER_CHILD = env_int("CELERY_WORKER_MAX_MEMORY_PER_CHILD", 200 * 1024)
if CELERY_WORKER_MAX_MEMORY_PER_CHILD < 0:
    raise ImproperlyConfigured("CELERY_WORKER_MAX_MEMORY_PER_CHILD must be 0 (off) or more KiB")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# One execution: setup + agent (default 600 s) + checks; the hard limit kills a stuck worker.
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 1800)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 1900)
if CELERY_TASK_TIME_LIMIT <= CELERY_TASK_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured("CELERY_TASK_TIME_LIMIT must be above CELERY_TASK_SOFT_TIME_LIMIT")
# Redis redelivers an unacknowledged task after the visibility timeout: it must outlast the
# longest task, or a slow execution would be started a second time while still running.
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {
    "visibility_timeout": max(
        env_int("CELERY_VISIBILITY_TIMEOUT", 7200), CELERY_TASK_TIME_LIMIT + 600
    )
}

# --- Keystone ---------------------------------------------------------------------------

# Both switches run arbitrary code on the server: off unless the operator opts in.
KEYSTONE_ALLOW_PYTHON_HOOKS = env_bool("KEYSTONE_ALLOW_PYTHON_HOOKS", False)
KEYSTONE_ALLOW_HOST_SCRIPTS = env_bool("KEYSTONE_ALLOW_HOST_SCRIPTS", False)
# An execution that cannot start (a database service or the Docker engine away) is tried
# this many times, waiting longer each time, then ends as `error` with the reason.
KEYSTONE_EXECUTION_MAX_ATTEMPTS = env_int("KEYSTONE_EXECUTION_MAX_ATTEMPTS", 5)
KEYSTONE_EXECUTION_RETRY_BASE_SECONDS = env_float("KEYSTONE_EXECUTION_RETRY_BASE_SECONDS", 2.0)
# How many executions the deployment's Celery workers run at once (the sum of their
# --concurrency), at most: a run's executions go to the workers a few per message (up to 16),
# but in at least this many messages when the run has that many, so every slot gets work.
KEYSTONE_EXECUTION_SLOTS = env_int("KEYSTONE_EXECUTION_SLOTS", 64)
# "" = auto: bubblewrap when it works, else local processes with a visible warning.
KEYSTONE_SANDBOX_BACKEND = env_str("KEYSTONE_SANDBOX_BACKEND")
# The operator's policy (evaluations/policy.py): what a spec may ask of this server.
# Weakest sandbox backend a spec may use or get: local, bwrap or docker; empty = bwrap where
# bubblewrap works on this host, else local (with the usual warning on every run).
KEYSTONE_POLICY_MIN_BACKEND = env_str("KEYSTONE_POLICY_MIN_BACKEND")
if KEYSTONE_POLICY_MIN_BACKEND not in {"", "local", "bwrap", "docker"}:
    raise ImproperlyConfigured(
        f"KEYSTONE_POLICY_MIN_BACKEND={KEYSTONE_POLICY_MIN_BACKEND!r}: use local, bwrap, docker or empty"
    )
# With Keystone running as root, each `local` execution's agent runs as a uid of its own from
# this range (FIRST-LAST), held for the execution's life through a lock file per uid under
# /run/keystone/local-uids (unique across every Keystone process of the host) and given back
# afterwards; its workspace is that uid's, mode 0700. The default lies above every account's,
# service's, container's and subordinate id's range; it bounds how many local executions run
# at once on one host (evaluations/runner/local_uids.py, docs/security.md).
KEYSTONE_LOCAL_UIDS = env_str("KEYSTONE_LOCAL_UIDS", _local_uids.DEFAULT_RANGE)
try:
    _local_uids.parse_range(KEYSTONE_LOCAL_UIDS)
except ValueError as _exc:
    raise ImproperlyConfigured(str(_exc)) from None
# Comma-separated names a spec may list under `secrets`; unset = any name that is not one of
# the server's own settings (those are never passed, whatever this says).
_allowed_secrets = os.environ.get("KEYSTONE_POLICY_ALLOWED_SECRETS")
KEYSTONE_POLICY_ALLOWED_SECRETS: list[str] | None = (
    None
    if _allowed_secrets is None
    else [n.strip() for n in _allowed_secrets.split(",") if n.strip()]
)
KEYSTONE_POLICY_MAX_TIMEOUT = env_float("KEYSTONE_POLICY_MAX_TIMEOUT", 3600.0)
KEYSTONE_POLICY_MAX_OUTPUT_BYTES = env_int("KEYSTONE_POLICY_MAX_OUTPUT_BYTES", 64 * 1024 * 1024)
KEYSTONE_POLICY_MAX_MEMORY_MB = env_int("KEYSTONE_POLICY_MAX_MEMORY_MB", 8192)
KEYSTONE_POLICY_MAX_CPUS = env_float("KEYSTONE_POLICY_MAX_CPUS", 8.0)
KEYSTONE_POLICY_MAX_EXECUTIONS = env_int("KEYSTONE_POLICY_MAX_EXECUTIONS", 10_000)
KEYSTONE_POLICY_MAX_PROCESSES = env_int("KEYSTONE_POLICY_MAX_PROCESSES", 4096)
KEYSTONE_POLICY_MAX_DISK_MB = env_int("KEYSTONE_POLICY_MAX_DISK_MB", 10240)
# `sandbox.network: host` hands the agent the worker's own network (the server's database,
# Redis, web port): only when the operator says so.
KEYSTONE_POLICY_ALLOW_HOST_NETWORK = env_bool("KEYSTONE_POLICY_ALLOW_HOST_NETWORK", False)
if KEYSTONE_SANDBOX_BACKEND not in {"", "local", "bwrap", "docker"}:
    raise ImproperlyConfigured(
        f"KEYSTONE_SANDBOX_BACKEND={KEYSTONE_SANDBOX_BACKEND!r}: use local, bwrap, docker or empty"
    )
KEYSTONE_WORK_DIR = Path(env_str("KEYSTONE_WORK_DIR") or KEYSTONE_HOME / "work")
# Servers on which a fresh database is created per execution for `type: postgres|mysql`
# services, e.g. postgresql://postgres@127.0.0.1:5432/postgres, mysql://root@127.0.0.1:3306/.
KEYSTONE_POSTGRES_URL = env_str("KEYSTONE_POSTGRES_URL")
KEYSTONE_MYSQL_URL = env_str("KEYSTONE_MYSQL_URL")
# With no KEYSTONE_POSTGRES_URL, a throwaway cluster of the machine's own initdb/pg_ctl
# (evaluations/runner/local_postgres.py), so a demo spec with a postgres service runs as is.
KEYSTONE_POSTGRES_LOCAL_CLUSTER = env_bool("KEYSTONE_POSTGRES_LOCAL_CLUSTER", True)
# Default judge for llm_as_judge checks whose spec has no `judge:` block.
KEYSTONE_JUDGE_PROVIDER = env_str("KEYSTONE_JUDGE_PROVIDER", "openai")
KEYSTONE_JUDGE_MODEL = env_str("KEYSTONE_JUDGE_MODEL", "gpt-4o-mini")
KEYSTONE_JUDGE_BASE_URL = env_str("KEYSTONE_JUDGE_BASE_URL")
KEYSTONE_JUDGE_API_KEY_ENV = env_str("KEYSTONE_JUDGE_API_KEY_ENV", "OPENAI_API_KEY")
KEYSTONE_JUDGE_TEMPERATURE = env_float("KEYSTONE_JUDGE_TEMPERATURE", 0.0)
KEYSTONE_JUDGE_TIMEOUT = env_float("KEYSTONE_JUDGE_TIMEOUT", 60.0)
# Judge calls: retries of timeouts / 429 / 5xx (backoff from BACKOFF seconds, doubling, with
# jitter), calls in flight per judge endpoint in one process, the model behind `embed`.
KEYSTONE_JUDGE_MAX_RETRIES = env_int("KEYSTONE_JUDGE_MAX_RETRIES", 3)
KEYSTONE_JUDGE_BACKOFF = env_float("KEYSTONE_JUDGE_BACKOFF", 0.5)
KEYSTONE_JUDGE_CONCURRENCY = env_int("KEYSTONE_JUDGE_CONCURRENCY", 4)
KEYSTONE_JUDGE_EMBEDDING_MODEL = env_str("KEYSTONE_JUDGE_EMBEDDING_MODEL", "text-embedding-3-small")
# Cap on Execution.final_output kept in the row; the full text stays in the artifact blob.
KEYSTONE_FINAL_OUTPUT_MAX_CHARS = env_int("KEYSTONE_FINAL_OUTPUT_MAX_CHARS", 65536)
# A worker renews its execution's lease every third of this; an execution whose lease ran
# out (its worker died) is run again by another worker.
KEYSTONE_EXECUTION_LEASE_SECONDS = env_int("KEYSTONE_EXECUTION_LEASE_SECONDS", 60)
# How long a reviewer holds a claimed review item before someone else may take it.
KEYSTONE_REVIEW_CLAIM_SECONDS = env_int("KEYSTONE_REVIEW_CLAIM_SECONDS", 600)

# API: requests per minute one token may make (0: no limit), counted in the default cache.
# That cache is per process unless KEYSTONE_CACHE_URL names a Redis all processes share.
KEYSTONE_API_TOKEN_RATE_PER_MINUTE = env_int("KEYSTONE_API_TOKEN_RATE_PER_MINUTE", 600)
KEYSTONE_CACHE_URL = env_str("KEYSTONE_CACHE_URL")
CACHES: dict[str, Any] = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": KEYSTONE_CACHE_URL}
        if KEYSTONE_CACHE_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}
# Alerts: links in messages start with KEYSTONE_BASE_URL (e.g. https://keystone.example.com);
# a delivery is tried KEYSTONE_ALERT_MAX_ATTEMPTS times on connection errors and 5xx, waiting
# KEYSTONE_ALERT_BACKOFF seconds, doubling, between tries.
KEYSTONE_BASE_URL = env_str("KEYSTONE_BASE_URL").rstrip("/")
KEYSTONE_ALERT_MAX_ATTEMPTS = env_int("KEYSTONE_ALERT_MAX_ATTEMPTS", 4)
KEYSTONE_ALERT_BACKOFF = env_float("KEYSTONE_ALERT_BACKOFF", 2.0)
KEYSTONE_ALERT_TIMEOUT = env_float("KEYSTONE_ALERT_TIMEOUT", 10.0)

# --- Email (alert channels) --------------------------------------------------------------
# SMTP when EMAIL_HOST is set, else the console backend (messages are logged, not sent).
EMAIL_HOST = env_str("EMAIL_HOST")
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "keystone@localhost")

# The weekly digest goes out on this day at this hour (UTC) to every channel that takes it.
KEYSTONE_DIGEST_DAY = env_str("KEYSTONE_DIGEST_DAY", "monday").lower()
KEYSTONE_DIGEST_HOUR = env_int("KEYSTONE_DIGEST_HOUR", 8)
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
if KEYSTONE_DIGEST_DAY not in _WEEKDAYS:
    raise ImproperlyConfigured(
        f"KEYSTONE_DIGEST_DAY={KEYSTONE_DIGEST_DAY!r}: use one of {', '.join(_WEEKDAYS)}"
    )
if not 0 <= KEYSTONE_DIGEST_HOUR <= 23:
    raise ImproperlyConfigured(f"KEYSTONE_DIGEST_HOUR={KEYSTONE_DIGEST_HOUR}: use 0 to 23")
CELERY_BEAT_SCHEDULE = {
    "requeue-expired-executions": {
        "task": "evaluations.tasks.requeue_expired_executions",
        "schedule": max(1.0, KEYSTONE_EXECUTION_LEASE_SECONDS / 2),
    },
    # Every 10 minutes the task asks whether a digest is due; the Digest table's unique
    # constraint sends each week's once, even with the embedded worker asking too.
    "weekly-digest": {"task": "evaluations.tasks.digests_send_due", "schedule": 600.0},
}

# --- Logging ----------------------------------------------------------------------------

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # Kaleido's browser driver logs every step of a digest chart at INFO.
        "choreographer": {"level": "WARNING"},
        "kaleido": {"level": "WARNING"},
        "logistro": {"level": "WARNING"},
        # The openai SDK's HTTP client logs every request at INFO: a line per judge call on
        # a `keystone run`'s terminal and in the server's log.
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        "openai": {"level": "WARNING"},
    },
}
if CELERY_TASK_ALWAYS_EAGER:
    # With no broker the tasks run in the calling process: kombu's warning about the unused
    # memory:// transport and Celery's line per finished task are noise on a local run.
    LOGGING["loggers"].update(  # type: ignore[attr-defined]
        {"kombu": {"level": "ERROR"}, "celery.app.trace": {"level": "WARNING"}}
    )
