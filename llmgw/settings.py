"""One settings module; everything that differs between deployments comes from the environment.

Embedded default (nothing set): SQLite under LLMGW_DATA_DIR, Channels' in-memory layer, Celery tasks run
in-process. Production: DATABASE_URL=postgres://… and REDIS_URL=redis://… (Celery broker and channels-redis).
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def env_number(name: str, default: str, kind: type = float):
    """A number from the environment; one that is not is refused naming the variable (``llmgw`` prints
    it as one ``error:`` line, never a traceback)."""
    from django.core.exceptions import ImproperlyConfigured

    text = os.environ.get(name, default)
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ImproperlyConfigured(f"{name}: {text!r} is not {what}") from None
    if kind is float and value != value:
        raise ImproperlyConfigured(f"{name}: {text!r} is not a number")
    return value


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DATA_DIR = Path(os.environ.get("LLMGW_DATA_DIR", "var")).resolve()


def _secret_key() -> str:
    """SECRET_KEY from the environment, else one made once and kept in the data directory."""
    if os.environ.get("SECRET_KEY"):
        return os.environ["SECRET_KEY"]
    return kept_secret_key(DATA_DIR / "secret_key")


def kept_secret_key(path: Path) -> str:
    """The key kept at ``path``, made there by the first process that needs it.

    Processes started together (web processes, workers, beat) all take the first one's key: it is
    written whole to a file of this process's own, then linked in place, which fails for every process
    but one, so none reads a file half written or keeps a key the others do not share.
    """
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        key = ""
    if key:
        return key
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    mine = path.with_name(f".{path.name}.{os.getpid()}")
    mine.write_text(key)
    mine.chmod(0o600)
    try:
        os.link(mine, path)
    except FileExistsError:
        kept = path.read_text().strip()
        if kept:
            return kept
        os.replace(mine, path)  # an empty file left by a crash: this key takes its place
    finally:
        mine.unlink(missing_ok=True)
    return key


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG")
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]

# Production behind TLS (README, Configuration): all off by default, so `make demo` works over plain HTTP.
# HSTS: browsers use only HTTPS for this many seconds once they have seen it (0: not sent).
SECURE_HSTS_SECONDS = env_number("LLMGW_HSTS_SECONDS", "0", int)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("LLMGW_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = env_bool("LLMGW_HSTS_PRELOAD")
# Plain HTTP requests are redirected to HTTPS.
SECURE_SSL_REDIRECT = env_bool("LLMGW_SSL_REDIRECT")
# Session and CSRF cookies only over HTTPS.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("LLMGW_SECURE_COOKIES")


def _proxy_ssl_header(value: str) -> tuple[str, str] | None:
    """`X-Forwarded-Proto` (or `X-Forwarded-Proto: https`): the header a TLS-terminating proxy sets,
    as Django's SECURE_PROXY_SSL_HEADER (("HTTP_X_FORWARDED_PROTO", "https"))."""
    if not value.strip():
        return None
    name, _, expected = value.partition(":")
    return "HTTP_" + name.strip().upper().replace("-", "_"), expected.strip() or "https"


# Trust this header from the proxy in front to say the request came over HTTPS. Set it only behind a
# proxy that always sets (or strips) it: otherwise a client could claim HTTPS.
SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(os.environ.get("LLMGW_PROXY_SSL_HEADER", ""))

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "servestatic.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files for /api/v1/docs, served from here (no CDN)
    "django_filters",
    "django_htmx",
    "django_prometheus",
    "channels",
    "llmgw",
    "llmgw.access",
    "facility",
    "agents",
    "placement",
    # Failed logins counted by username and by address; a lockout after AXES_FAILURE_LIMIT (llmgw.access.lockout).
    "axes",
]

# What `llmgw ctl` starts Django with (llmgw.ctl), so that a command answers in a fraction of a second
# rather than load the web server. Every command leaves out what only serves requests: the ASGI server
# (Daphne, and Twisted under it), the admin and its log, the console's sessions and messages, static
# files, the API schema, filters, htmx, the metrics middleware and Channels' consumers. A command that
# writes keeps the users and their tokens (`ctl token`, `ctl user`), and its llmgw (LlmgwCtlConfig)
# connects the receivers that tell the console's live pages and loads the Celery app its tasks are sent
# with; no model of the apps left out is written by a command, and none of llmgw's apps refers to them.
CTL_SERVER_ONLY_APPS = {
    "daphne",
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "servestatic.runserver_nostatic",
    "django.contrib.staticfiles",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_filters",
    "django_htmx",
    "django_prometheus",
    "channels",
}
CTL_WRITE_APPS = [
    {"llmgw": "llmgw.apps.LlmgwCtlConfig"}.get(app, app)
    for app in INSTALLED_APPS
    if app not in CTL_SERVER_ONLY_APPS
]
# A listing reads the database and prints: it sends no task and changes nothing the live pages show
# (llmgw.apps.LlmgwReadConfig), and reads no user or token — a tenth of its start was their models and
# the auth machinery they import.
CTL_USER_APPS = {
    "rest_framework",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "rest_framework.authtoken",
    "llmgw.access",
    "axes",
}
CTL_READ_APPS = [
    {"llmgw": "llmgw.apps.LlmgwReadConfig"}.get(app, app)
    for app in INSTALLED_APPS
    if app not in CTL_SERVER_ONLY_APPS | CTL_USER_APPS
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # A NUL in a console path or query: a 4xx before any view hands it to the database.
    "llmgw.textguard.StorableTextMiddleware",
    # Async-capable (WhiteNoise is sync only): with every middleware async-capable, a request under ASGI
    # crosses into a thread once, for the view, instead of three times.
    "llmgw.staticfiles.ContentHashedServeStaticMiddleware",
    # Pages, partials and JSON compressed (static files come compressed already; sockets never pass here).
    # Django pads compressed pages at random against BREACH-style guessing of the CSRF token.
    "django.middleware.gzip.GZipMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # PostgreSQL down: 503 at once; Redis down: the answer says what was not queued (after messages: it adds one).
    "llmgw.dependencies.DependenciesMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
    # Last, as django-axes asks: it answers a locked-out login with llmgw.access.lockout's page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "llmgw.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "llmgw.wsgi.application"
ASGI_APPLICATION = "llmgw.asgi.application"

DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'llmgw.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(DATABASE_URL)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # ASGI runs each request's sync code in its own thread, so per-thread persistent connections would
    # pile up; a pool shares a few connections between them instead.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # Server-side parameters and prepared statements: PostgreSQL keeps the plans of the hot statements
    # (placement's commit among them) instead of parsing and planning each anew. Turn off behind a
    # pooler in transaction mode (pgbouncer), where prepared statements do not survive.
    DATABASES["default"]["OPTIONS"] = (
        {"server_side_binding": True, "prepare_threshold": 2}
        if env_bool("LLMGW_DB_PREPARE", True)
        else {}
    )
    # PostgreSQL down or out of reach costs a request a bounded wait, then a 503 (llmgw.dependencies): a
    # connection is given up after LLMGW_DB_CONNECT_TIMEOUT (refused: at once), a wait for one from the pool
    # after LLMGW_DB_POOL_TIMEOUT.
    DATABASES["default"]["OPTIONS"]["connect_timeout"] = env_number("LLMGW_DB_CONNECT_TIMEOUT", "3", int)
    # READ COMMITTED whatever the server's default: the guarded commit reads under its locks with a
    # snapshot taken after them, and the database refuses a shard's deletion under a kept snapshot
    # (placement migration 0007). The commit's own BEGINs say so too.
    from psycopg import IsolationLevel

    DATABASES["default"]["OPTIONS"]["isolation_level"] = IsolationLevel.READ_COMMITTED
    if env_bool("LLMGW_DB_POOL", True):
        pool_timeout = env_number("LLMGW_DB_POOL_TIMEOUT", "3", float)
        DATABASES["default"]["OPTIONS"]["pool"] = {
            "min_size": 1,
            "max_size": env_number("LLMGW_DB_POOL_SIZE", "10", int),
            "timeout": pool_timeout,
            # The pool stops retrying a failed connection after this long, so the one a request asks for
            # once the database is back is tried at once, not after minutes of growing back-off.
            "reconnect_timeout": pool_timeout,
        }
        # A connection is checked as the pool hands it out (one empty round trip): the ones that died with
        # the database are dropped there, so the first requests after it returns do not fail on them.
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
        # Heartbeats' requests take their connections from a pool of their own (llmgw.postgresql): however
        # many connections an operator's burst holds, a heartbeat still finds one.
        DATABASES["default"]["ENGINE"] = "llmgw.postgresql"
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded default: one writer at a time, waiting rather than failing when the in-process work and
    # a request write together.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 8}},
]
# Logins (the console's and the admin's) through django-axes first: it refuses a locked-out username or address
# before the password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# After this many failed logins for one username, or from one address, logins are refused for
# LLMGW_LOGIN_LOCKOUT_MINUTES (each counted on its own: a guesser moving between names is stopped by address,
# one spread over addresses by name). `llmgw ctl user unlock NAME` lifts it early.
AXES_FAILURE_LIMIT = env_number("LLMGW_LOGIN_FAILURES", "10", int)
AXES_COOLOFF_TIME = timedelta(minutes=env_number("LLMGW_LOGIN_LOCKOUT_MINUTES", "15", float))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "llmgw.access.lockout.lockout_response"
AXES_VERBOSE = False
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"
try:  # ServeStatic warns about a missing STATIC_ROOT even when it serves from the finders.
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
except OSError:
    pass
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # `{% static %}` writes each file's content hash into its address, served immutable (llmgw.staticfiles).
    "staticfiles": {"BACKEND": "llmgw.staticfiles.ContentHashedStaticFilesStorage"},
}
# Served straight from the source folders too, so `make demo` needs no collectstatic.
SERVESTATIC_USE_FINDERS = True
SERVESTATIC_AUTOREFRESH = DEBUG

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "llmgw.access.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["llmgw.permissions.IsViewer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    # DRF's JSON parser, but deep nesting is a 400 before the parser recurses (llmgw.jsonguard).
    "DEFAULT_PARSER_CLASSES": [
        "llmgw.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "llmgw.api.exception_handler",
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "llmgw.negotiation.ContentNegotiation",
    # The API's one version: the schema endpoint writes a ?version= into its answer and its file name only
    # when it is one of these (a newline in it was a 500).
    "ALLOWED_VERSIONS": ["1"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "llmgw API",
    "DESCRIPTION": "Places LLM inference replicas on GPU nodes within rack and PDU power budgets.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/v1/docs: Swagger UI from drf-spectacular-sidecar's files, served with the console's static files.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "SERVE_PERMISSIONS": ["llmgw.permissions.IsViewer"],
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "facility.serializers.strict_request_bodies",
    ],
    # Two lists of states share the field name `state`: name each set once.
    "ENUM_NAME_OVERRIDES": {
        "NodeStateEnum": "agents.filtersets.STATES",
        "ReplicaStateEnum": "placement.serializers.REPLICA_STATES",
        "ConditionEnum": "facility.serializers.CONDITIONS",
    },
}

# A new or rotated API token's lifetime unless one is given (`90d`, `12h`, `never`).
LLMGW_TOKEN_LIFETIME = os.environ.get("LLMGW_TOKEN_LIFETIME", "90d")
# Wrong API tokens from one address: after this many within the window its token requests get 429 until the
# window ends (counted in each web process; 0 counts none).
LLMGW_TOKEN_FAILURES = env_number("LLMGW_TOKEN_FAILURES", "20", int)
LLMGW_TOKEN_FAILURE_WINDOW_SECONDS = env_number("LLMGW_TOKEN_FAILURE_WINDOW_SECONDS", "300", int)

REDIS_URL = os.environ.get("REDIS_URL", "")
LLMGW_SOCKET_GROUP_EXPIRY_SECONDS = env_number("LLMGW_SOCKET_GROUP_EXPIRY_SECONDS", "300", int)
# Console sockets one web process holds at most; one more is closed at once (1013, try again
# later: the page says live updates are paused, and tries again).
LLMGW_MAX_SOCKETS = env_number("LLMGW_MAX_SOCKETS", "500", int)
# Redis down or out of reach costs a request this long at most (connecting, or waiting for an answer): a
# live update is then dropped and a reconcile not queued, and the answer says so (llmgw.dependencies).
LLMGW_REDIS_TIMEOUT_SECONDS = env_number("LLMGW_REDIS_TIMEOUT", "2", float)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # A console socket waits up to 5 s for its next message (BZPOPMIN): a read may take that long.
            # Live updates sent by requests are bounded by LLMGW_REDIS_TIMEOUT on their own (agents.events).
            "CONFIG": {"hosts": [{
                "address": REDIS_URL,
                "socket_connect_timeout": LLMGW_REDIS_TIMEOUT_SECONDS,
                "socket_timeout": LLMGW_REDIS_TIMEOUT_SECONDS + 10,
            }],
            # A socket's membership of a group lapses this long after it last joined: each live socket joins
            # again every third of it (agents.consumers), so only the members of a killed process lapse.
            "group_expiry": LLMGW_SOCKET_GROUP_EXPIRY_SECONDS},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# The Facility page's costly figures (N−1, what shedding would do) are kept here, by the facility's version
# (facility.console_figures): shared by every web process through Redis, in this process embedded.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "llmgw",
            "OPTIONS": {
                "socket_connect_timeout": LLMGW_REDIS_TIMEOUT_SECONDS,
                "socket_timeout": LLMGW_REDIS_TIMEOUT_SECONDS,
            },
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "llmgw"}}
# Figures whose readings (measured draw) changed are worked out again once this old, in seconds.
FACILITY_FIGURES_SECONDS = env_number("LLMGW_FACILITY_FIGURES_SECONDS", "30", float)

# Celery: Redis when REDIS_URL is set; otherwise every task runs in-process where it is sent.
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
# Tasks outside the apps' tasks modules: the Facility page's figures live beside the page that reads them.
CELERY_IMPORTS = ["facility.console_figures"]
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env_number("CELERY_TASK_SOFT_TIME_LIMIT", "120", int)
CELERY_TASK_TIME_LIMIT = env_number("CELERY_TASK_TIME_LIMIT", "180", int)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Sending a task tries once, bounded: with Redis out of reach the sender hears so within the timeout
# (a worker's wait for its next task, BRPOP, answers within 1 s, so an answer may take 2 s).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "socket_connect_timeout": LLMGW_REDIS_TIMEOUT_SECONDS,
    "socket_timeout": max(LLMGW_REDIS_TIMEOUT_SECONDS, 2.0),
}
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 0}
# Two queues: `celery` (reconciles, drains, history, feed caps, NetBox sync) and `conditions` (the
# thermal judgement alone), so a backlog of the first never starves the second. `llmgw worker` consumes
# both; the shipped units and compose also run a worker on `conditions` alone (deploy/), which a backlog
# cannot reach.
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = {"celery": {}, "conditions": {}}
CELERY_TASK_ROUTES = {"facility.tasks.evaluate_conditions": {"queue": "conditions"}}
RECONCILE_INTERVAL_SECONDS = env_number("LLMGW_RECONCILE_INTERVAL", "15", float)
CONDITIONS_INTERVAL_SECONDS = env_number("LLMGW_CONDITIONS_INTERVAL", "15", float)
# One model's share of a reconcile round (its scaling, drain step and plans), in seconds: past it the
# model is skipped for this round, with why, and the others go on (0: no bound).
LLMGW_RECONCILE_MODEL_BUDGET_SECONDS = env_number(
    "LLMGW_RECONCILE_MODEL_BUDGET", str(RECONCILE_INTERVAL_SECONDS / 3), float
)
CELERY_BEAT_SCHEDULE = {
    "reconcile": {
        "task": "placement.tasks.reconcile",
        "schedule": RECONCILE_INTERVAL_SECONDS,
        "options": {"expires": RECONCILE_INTERVAL_SECONDS},
    },
    # Power history: a point per domain and node every minute (facility.history).
    "facility-history": {
        "task": "facility.tasks.history_record",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
    # Thermal conditions: the sources polled (each at its own interval) and every domain judged.
    "facility-conditions": {
        "task": "facility.tasks.evaluate_conditions",
        "schedule": CONDITIONS_INTERVAL_SECONDS,
        "options": {"expires": CONDITIONS_INTERVAL_SECONDS},
    },
    # server.yaml's facility.netbox.sync_every: checked each minute, run when due (facility.netbox_sync).
    "facility-netbox-sync": {
        "task": "facility.tasks.netbox_sync",
        "schedule": 60.0,
        "options": {"expires": 60},
    },
}
HISTORY_INTERVAL_SECONDS = 60.0

LLMGW_CONFIG = os.environ.get("LLMGW_CONFIG", "")
# When set, /metrics asks for `Authorization: Bearer <it>`; Prometheus scrapes it otherwise unauthenticated.
LLMGW_METRICS_TOKEN = os.environ.get("LLMGW_METRICS_TOKEN", "")
# A node is ready while its heartbeats are fresh: three intervals missed and it is not.
LLMGW_MISSED_HEARTBEATS = 3
# Replicas on a node silent this long are replaced elsewhere (replacement first); 0 never.
LLMGW_EVICT_AFTER_SECONDS = env_number("LLMGW_EVICT_AFTER_SECONDS", "300", float)
# Replacements a drain keeps in flight per model (1: one at a time). More moves a lost room faster, at
# the price of as many extra replicas running at once while they come up.
LLMGW_DRAIN_SURGE = max(1, env_number("LLMGW_DRAIN_SURGE", "1", int))
# On PostgreSQL a replica placed alone (a shedding's replacement) is committed in two round trips, its
# statements sent in pipeline mode (placement.commit.single); false: one statement at a time.
LLMGW_COMMIT_PIPELINE = env_bool("LLMGW_COMMIT_PIPELINE", True)
# Measured draw counts for power accounting while the reading is this fresh.
LLMGW_MEASURED_FRESH_SECONDS = 120
# A node's measured draw is the highest reading of this window (server.yaml facility.measured_window).
LLMGW_MEASURED_WINDOW_SECONDS = env_number("LLMGW_MEASURED_WINDOW_SECONDS", "900", float)
# Request limits (llmgw.bodies): a heartbeat's body, any other body (Django's own limit, 2.5 MiB), and
# how long a body may take to arrive; past them the answer is 413 or 408 at once.
LLMGW_HEARTBEAT_MAX_BYTES = env_number("LLMGW_HEARTBEAT_MAX_BYTES", str(256 * 1024), int)
DATA_UPLOAD_MAX_MEMORY_SIZE = env_number("LLMGW_REQUEST_MAX_BYTES", str(2_621_440), int)
LLMGW_BODY_TIMEOUT_SECONDS = env_number("LLMGW_BODY_TIMEOUT_SECONDS", "10", float)
# A web process parses this many operator documents (YAML, JSON bodies) at once; past them, after a second's
# wait, the answer is 429 with Retry-After (llmgw.parselimit). Heartbeats are not counted.
LLMGW_PARSE_CONCURRENCY = env_number("LLMGW_PARSE_CONCURRENCY", "2", int)
# The connections of the heartbeats' own pool in each process (PostgreSQL, with the pool on), besides
# LLMGW_DB_POOL_SIZE's for everything else.
LLMGW_DB_HEARTBEAT_POOL_SIZE = env_number("LLMGW_DB_HEARTBEAT_POOL_SIZE", "4", int)
# Heartbeats on the full path (a node joining or changing) at once in a web process are at most that pool's
# size; one that waits this long for its turn is answered 503 with Retry-After.
LLMGW_HEARTBEAT_WAIT_SECONDS = env_number("LLMGW_HEARTBEAT_WAIT_SECONDS", "20", float)
# WebSocket messages from the console (a list of the rows a page shows) are small; larger ones are refused.
LLMGW_WS_MAX_BYTES = env_number("LLMGW_WS_MAX_BYTES", str(256 * 1024), int)
# The server's own limits (llmgw.serving): a request's head (request line and headers) in bytes, the time
# its headers may take to arrive, how long an idle kept-alive connection stays, and how many connections
# and requests at once (beyond that, 503).
LLMGW_MAX_HEADER_BYTES = env_number("LLMGW_MAX_HEADER_BYTES", str(16 * 1024), int)
LLMGW_HEADER_TIMEOUT_SECONDS = env_number("LLMGW_HEADER_TIMEOUT_SECONDS", "10", float)
LLMGW_KEEP_ALIVE_SECONDS = env_number("LLMGW_KEEP_ALIVE_SECONDS", "5", int)
LLMGW_MAX_CONNECTIONS = env_number("LLMGW_MAX_CONNECTIONS", "2048", int)
# On SIGTERM a web process closes its sockets at once and gives what still runs this long, then cancels it;
# `llmgw serve` ends within this and 8 s more whatever happens (systemd's TimeoutStopSec is 30 s).
LLMGW_SHUTDOWN_SECONDS = env_number("LLMGW_SHUTDOWN_SECONDS", "10", float)

# The NetBox instances the server itself may read for POST /api/v1/facility/import/netbox {"url": …} (a remote
# `llmgw ctl facility import netbox --url`), space or comma separated: none by default, so a client's
# request never makes the server contact an address its admins did not name.
LLMGW_NETBOX_URLS = [u.rstrip("/") for u in os.environ.get("LLMGW_NETBOX_URLS", "").replace(",", " ").split()]

PROMETHEUS_EXPORT_MIGRATIONS = False

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "llmgw.logs.StderrHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # In-process tasks (no REDIS_URL) would log every run and the absent broker.
        "celery.app.trace": {"level": "INFO" if REDIS_URL else "WARNING"},
        "kombu.connection": {"level": "INFO" if REDIS_URL else "ERROR"},
        # django-axes logs every login at INFO; failures and lockouts are WARNING.
        "axes": {"level": "WARNING"},
    },
}
