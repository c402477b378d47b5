"""Django settings for IBEX, read from the environment (see README, "Configuration").

With DATABASE_URL or REDIS_URL unset, IBEX starts its embedded PostgreSQL or Redis
(ibex/runtime.py) and exports their URLs, so the processes it starts use the same ones.
"""

import os
import secrets
from pathlib import Path

from kombu import Exchange, Queue

from ibex.config import (
    ConfigError,
    check_redis_url,
    database_from_url,
    env_bool,
    env_int,
    env_list,
)
from ibex.runtime import use_embedded_services, var_dir

BASE_DIR = Path(__file__).resolve().parent.parent

os.environ.update(
    use_embedded_services(
        database=not os.environ.get("DATABASE_URL"),
        broker=not os.environ.get("REDIS_URL"),
    )
)
DATABASE_URL = os.environ["DATABASE_URL"]
REDIS_URL = check_redis_url(os.environ["REDIS_URL"])

DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    """SECRET_KEY from the environment, else one generated once and kept under var/."""
    if os.environ.get("SECRET_KEY"):
        return os.environ["SECRET_KEY"]
    path = var_dir() / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
if len(SECRET_KEY) < 50:
    raise ConfigError("SECRET_KEY is shorter than 50 characters: generate one with "
                      "python -c 'import secrets; print(secrets.token_urlsafe(50))'")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "ibex.accounts",
    "ibex.audit",
    "ibex.outbox",
    "fabric",
    "pool",
    "billing",
    "market",
    "notify",
    "scheduler",
    "web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "ibex.security.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "ibex.audit.context.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "ibex.urls"
WSGI_APPLICATION = "ibex.wsgi.application"

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
                "web.context.web_org",
            ],
        },
    },
]

DATABASES = {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "ibex",
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", var_dir() / "static"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "ibex" / "static"]
# Serve static files straight from the apps when collectstatic has not been run (demo, tests).
WHITENOISE_USE_FINDERS = env_bool("WHITENOISE_USE_FINDERS", True)

# --- security: safe by default; DEBUG=1 (the demo) relaxes what needs HTTPS ---------------
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]  # probes speak plain HTTP inside a pod
if env_bool("SECURE_PROXY_SSL_HEADER", True):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "strict-origin-when-cross-origin"
SECURE_CONTENT_TYPE_NOSNIFF = True

# Web forms outside DRF (ibex/ratelimit.py): failed log-ins per address+user and per address.
IBEX_RATE_LIMITS = {
    "login": os.environ.get("RATE_LIMIT_LOGIN", "10/5m"),
    "login-address": os.environ.get("RATE_LIMIT_LOGIN_ADDRESS", "50/5m"),
    "keys": os.environ.get("THROTTLE_KEYS", "30/hour"),
    "orders": os.environ.get("THROTTLE_ORDERS", "300/min"),  # the web order form's own count
}

# --- web marketplace (web/) ---------------------------------------------------------------
LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "web:home"
LOGOUT_REDIRECT_URL = "web:market"

# --- REST API -----------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "ibex.accounts.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "ibex.api.pagination.CursorPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "ibex.api.errors.exception_handler",
    # `format` is ours (e.g. topology.conf?format=slurm-block), not a renderer override
    "URL_FORMAT_OVERRIDE": None,
    "DEFAULT_THROTTLE_CLASSES": [
        "ibex.api.throttles.AnonRateThrottle",
        "ibex.api.throttles.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "anon": os.environ.get("THROTTLE_ANON", "120/min"),
        "user": os.environ.get("THROTTLE_USER", "3000/min"),
        "orders": os.environ.get("THROTTLE_ORDERS", "300/min"),  # per organisation
        "keys": os.environ.get("THROTTLE_KEYS", "30/hour"),  # key creation, per organisation
        # per node; a node beats every second while a lease starts on it (BINDING_ACK_INTERVAL_S)
        "heartbeat": os.environ.get("THROTTLE_HEARTBEAT", "120/min"),
        # per node: one shipment a second for each of its running leases
        "node_logs": os.environ.get("THROTTLE_NODE_LOGS", "1200/min"),
    },
}

SPECTACULAR_SETTINGS = {
    "TITLE": "IBEX API",
    "DESCRIPTION": "The InfiniBand-aware GPU exchange: fabrics, pools, orders, auctions, leases.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "ibex.api.schema.document_errors",
    ],
    "ENUM_NAME_OVERRIDES": {
        "ApiKeyScope": "ibex.accounts.models.ApiKey.Scope",
        "ProviderState": "ibex.accounts.models.ProviderProfile.State",
        "NodeState": "pool.models.Node.State",
        "NodeHealth": "pool.models.Node.Health",
        "NodeDrainMode": "pool.models.Node.DrainMode",
        "GpuHealth": "pool.models.Gpu.Health",
        "LocalityLevel": "fabric.core.locality.CONSTRAINT_LEVELS",
        "WorkloadState": "pool.core.workloads.WORKLOAD_STATES",
        "RankState": "pool.core.workloads.RANK_STATES",
    },
}

# --- Celery ---------------------------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "ibex")
CELERY_TASK_ACKS_LATE = True
# An unacknowledged message (its worker killed) is delivered again after this long; workers
# look for such messages every CELERY_RESTORE_INTERVAL_S (one cheap sorted-set range query).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT_S", 3600),
    "unacked_restore_interval": env_int("CELERY_RESTORE_INTERVAL_S", 10),
    "unacked_restore_throttle": 1,
}
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
# `celery -A ibex beat` (or `worker -B`) keeps its schedule state under var/, not in the checkout
CELERY_BEAT_SCHEDULE_FILENAME = str(var_dir() / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "record-beat": {"task": "ibex.record_beat", "schedule": 30.0},
    "relay-outbox": {"task": "ibex.relay_outbox", "schedule": 10.0},
}

# --- Stripe ---------------------------------------------------------------------------------
STRIPE_API_KEY = os.environ.get("STRIPE_API_KEY", "")
STRIPE_WEBHOOK_SECRET = os.environ.get("STRIPE_WEBHOOK_SECRET", "")
STRIPE_API_BASE = os.environ.get("STRIPE_API_BASE", "https://api.stripe.com")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

# --- pool -------------------------------------------------------------------------------------
NODE_HEARTBEAT_INTERVAL_S = env_int("NODE_HEARTBEAT_INTERVAL_S", 15)
# Reserved orders must start within this many days (the market's horizon).
MARKET_HORIZON_DAYS = env_int("MARKET_HORIZON_DAYS", 90)
# A node silent for longer than its interval plus this is not chosen for new placements.
HEARTBEAT_GRACE_S = env_int("HEARTBEAT_GRACE_S", 10)
# A heartbeat answer that asks a node to start a lease asks for the next heartbeat this soon.
BINDING_ACK_INTERVAL_S = env_int("BINDING_ACK_INTERVAL_S", 1)
# A heartbeat that says `wait_s` is held at most this long, until work arrives for its node;
# each web process holds at most HEARTBEAT_MAX_WAITERS at once (the others answer at once).
HEARTBEAT_MAX_WAIT_S = env_int("HEARTBEAT_MAX_WAIT_S", 30)
HEARTBEAT_MAX_WAITERS = env_int("HEARTBEAT_MAX_WAITERS", 8)
# What a lease's rank keeps of its command's output (older lines are dropped).
WORKLOAD_LOG_BYTES = env_int("WORKLOAD_LOG_BYTES", 10 * 1024 * 1024)
# ... and for this many days after its node stopped serving the lease (then it is deleted).
WORKLOAD_LOG_RETENTION_DAYS = env_int("WORKLOAD_LOG_RETENTION_DAYS", 7)
PROVIDER_BURN_IN_S = env_int("PROVIDER_BURN_IN_S", 600)
CELERY_BEAT_SCHEDULE.update({
    "mark-unreachable-nodes": {"task": "pool.mark_unreachable_nodes", "schedule": 15.0},
    "verify-burned-in-providers": {"task": "pool.verify_burned_in_providers", "schedule": 60.0},
    "delete-old-workload-logs": {"task": "pool.delete_old_workload_logs", "schedule": 3600.0},
})

# --- money (market/) --------------------------------------------------------------------------
MARKET_COMMISSION_BP = env_int("MARKET_COMMISSION_BP", 1000)  # platform fee: 10 % of usage
PROVIDER_HOLD_BACK_BP = env_int("PROVIDER_HOLD_BACK_BP", 500)  # of the provider's share
PAYOUT_MINIMUM_MICROS = env_int("PAYOUT_MINIMUM_MICROS", 25_000_000)
TOP_UP_MIN_MICROS = env_int("TOP_UP_MIN_MICROS", 5_000_000)
TOP_UP_MAX_MICROS = env_int("TOP_UP_MAX_MICROS", 10_000_000_000)
STRIPE_PUBLISHABLE_KEY = os.environ.get("STRIPE_PUBLISHABLE_KEY", "")
# Stripe.js, for the card element of the top-up page. Stripe requires it be loaded from
# js.stripe.com, so it is, but only when real keys are configured; with none (offline, demos)
# the page loads nothing from outside. Tests point it at the fake Stripe's /v3/.
STRIPE_JS_URL = os.environ.get(
    "STRIPE_JS_URL",
    "https://js.stripe.com/v3/" if STRIPE_PUBLISHABLE_KEY.startswith(("pk_live_", "pk_test_"))
    else "")
STRIPE_CONNECT_RETURN_URL = os.environ.get("STRIPE_CONNECT_RETURN_URL",
                                           "https://ibex.example/provider/payouts/done")
STRIPE_CONNECT_REFRESH_URL = os.environ.get("STRIPE_CONNECT_REFRESH_URL",
                                            "https://ibex.example/provider/payouts/retry")
CELERY_BEAT_SCHEDULE.update({
    "meter-usage": {"task": "market.meter_usage", "schedule": 60.0},
    "start-automatic-top-ups": {"task": "market.start_automatic_top_ups", "schedule": 60.0},
    "schedule-payouts": {"task": "market.schedule_payouts", "schedule": 86_400.0},
    "resend-unsent-payouts": {"task": "market.resend_unsent_payouts", "schedule": 300.0},
})
METERING_CATCH_UP_MINUTES = env_int("METERING_CATCH_UP_MINUTES", 10)
PAYOUT_RESEND_AFTER_S = env_int("PAYOUT_RESEND_AFTER_S", 600)
PLACING_TIMEOUT_S = env_int("PLACING_TIMEOUT_S", 300)
PLACEMENT_ATTEMPTS = env_int("PLACEMENT_ATTEMPTS", 5)  # then the lease fails, refunded
PLACEMENT_BACKOFF_BASE_S = env_int("PLACEMENT_BACKOFF_BASE_S", 2)  # 2, 4, 8, 16 s ...
PLACEMENT_BACKOFF_CAP_S = env_int("PLACEMENT_BACKOFF_CAP_S", 60)
PLACEMENT_REQUEUE_S = env_int("PLACEMENT_REQUEUE_S", 60)  # pending this long: queue again
# Placement queues, by fabric: <default queue>.place-<fabric id mod N> (scheduler/routing.py).
PLACEMENT_PARTITIONS = env_int("PLACEMENT_PARTITIONS", 4)
CELERY_TASK_ROUTES = ("scheduler.routing.route_task",)
CELERY_TASK_QUEUES = [Queue(name, Exchange(name), routing_key=name) for name in [
    CELERY_TASK_DEFAULT_QUEUE,
    *(f"{CELERY_TASK_DEFAULT_QUEUE}.place-{k}" for k in range(PLACEMENT_PARTITIONS))]]
CELERY_BEAT_SCHEDULE.update({
    # the safety net: the last heartbeat acknowledgement activates a lease at once
    "activate-acknowledged-leases": {"task": "scheduler.activate_acknowledged_leases",
                                     "schedule": 5.0},
    "requeue-unplaced-leases": {"task": "scheduler.requeue_unplaced_leases", "schedule": 30.0},
    "fail-stuck-leases": {"task": "scheduler.fail_stuck_leases", "schedule": 30.0},
    "replace-unacknowledged-leases": {"task": "scheduler.replace_unacknowledged_leases",
                                      "schedule": 10.0},
    "remediate-leases": {"task": "scheduler.remediate_leases", "schedule": 15.0},
    "recheck-guarantees": {"task": "scheduler.recheck_guarantees", "schedule": 60.0},
    "drain-nodes": {"task": "scheduler.drain_nodes", "schedule": 15.0},
    "defragment": {"task": "scheduler.defragment",
                   "schedule": float(env_int("DEFRAG_INTERVAL_S", 300))},
})
DEFRAG_MAX_MOVES = env_int("DEFRAG_MAX_MOVES", 20)  # leases moved per defragmentation pass

# --- market -------------------------------------------------------------------------------------
AUCTION_INTERVAL_S = env_int("AUCTION_INTERVAL_S", 60)
# the winner determination's budget per clearing (market.core.winners), on one core
AUCTION_TIME_LIMIT_S = float(os.environ.get("AUCTION_TIME_LIMIT_S", "5"))
PREEMPTION_NOTICE_S = env_int("PREEMPTION_NOTICE_S", 120)
CELERY_BEAT_SCHEDULE.update({
    "clear-markets": {"task": "market.clear_markets", "schedule": float(AUCTION_INTERVAL_S)},
    "end-preempted-leases": {"task": "market.end_preempted_leases", "schedule": 10.0},
    "retry-resting-orders": {"task": "market.retry_resting_orders", "schedule": 15.0},
    "complete-ended-leases": {"task": "market.complete_ended_leases", "schedule": 30.0},
})

# --- SLAs (scheduler/), tenant events and webhooks (notify/) --------------------------------------
SLA_CREDIT_MULTIPLIER = env_int("SLA_CREDIT_MULTIPLIER", 5)  # × down GPU-hours × price
SLA_ENDED_GRACE_S = env_int("SLA_ENDED_GRACE_S", 3600)  # ended leases are re-checked this long
WEBHOOK_MAX_ATTEMPTS = env_int("WEBHOOK_MAX_ATTEMPTS", 8)
WEBHOOK_BACKOFF_BASE_S = env_int("WEBHOOK_BACKOFF_BASE_S", 10)
WEBHOOK_BACKOFF_CAP_S = env_int("WEBHOOK_BACKOFF_CAP_S", 3600)
WEBHOOK_TIMEOUT_S = env_int("WEBHOOK_TIMEOUT_S", 10)
# Webhooks go to public https URLs only (notify/core/webhook_targets.py). Exceptions, for tests
# and private installations: http, and networks in CIDR form ("127.0.0.1/32,10.8.0.0/16").
WEBHOOK_ALLOW_HTTP = env_bool("WEBHOOK_ALLOW_HTTP", False)
WEBHOOK_ALLOWED_NETWORKS = os.environ.get("WEBHOOK_ALLOWED_NETWORKS", "")
CELERY_BEAT_SCHEDULE.update({
    "evaluate-slas": {"task": "scheduler.evaluate_slas", "schedule": 60.0},
    "sync-events": {"task": "scheduler.sync_events", "schedule": 10.0},
    "fan-out-events": {"task": "scheduler.fan_out_events", "schedule": 15.0},
})

# Private pools: quota admission and tidal schedules.
CELERY_BEAT_SCHEDULE.update({
    "admit-pools": {"task": "scheduler.admit_pools", "schedule": 10.0},
    "apply-tidal-steps": {"task": "scheduler.apply_tidal_steps", "schedule": 30.0},
})
