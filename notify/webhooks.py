"""Webhook endpoints of tenants, and delivering events to them: signed, retried with
exponential backoff, and never delivered twice to one endpoint once it answered 2xx.

Delivery rows are unique per (endpoint, event). A worker claims one with a conditional UPDATE
(pending and due, or a sending claim that expired because its worker died) that moves it to
`sending` and counts the attempt; the HTTP request runs outside any transaction; the answer is
written back with a conditional UPDATE that repeats the claim (state and attempt number).

Signature: `IBEX-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
Receivers recompute it over the raw body, compare in constant time, and refuse old `t`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from requests.adapters import HTTPAdapter

from ibex.accounts.models import Organization
from ibex.errors import Refusal
from notify.core import webhook_targets
from notify.models import Event, WebhookAttempt, WebhookDelivery, WebhookEndpoint

D = WebhookDelivery.State
SIGNATURE_HEADER = "IBEX-Signature"
LOOK_BACK = timedelta(days=1)
CLAIM_TTL = timedelta(seconds=60)  # longer than the request timeout


def _setting(name: str, default: int) -> int:
    return int(getattr(settings, name, default))


class WebhookError(Refusal):
    """An endpoint that cannot be registered or changed; `field` names the input at fault."""


# --- endpoints ------------------------------------------------------------------------------------


def check_target(url: str, *, at_creation: bool = False) -> webhook_targets.Target:
    """The URL's target under the operator's rules (WEBHOOK_ALLOW_HTTP,
    WEBHOOK_ALLOWED_NETWORKS); WebhookError naming the field when it is refused. At creation a
    name that does not resolve (yet) is kept: every delivery resolves and checks again."""
    try:
        return webhook_targets.check_url(
            url, allow_http=settings.WEBHOOK_ALLOW_HTTP,
            allowed=webhook_targets.parse_networks(settings.WEBHOOK_ALLOWED_NETWORKS),
            resolve=webhook_targets.system_resolver,  # looked up here: the tests replace it
            unresolved_ok=at_creation)
    except webhook_targets.RefusedTarget as exc:
        raise WebhookError(str(exc), field="url") from None


def validate_url(url: str) -> str:
    check_target(url, at_creation=True)
    return url.strip()


def new_secret() -> str:
    return f"whsec_{secrets.token_urlsafe(32)}"


@transaction.atomic
def create_endpoint(*, tenant: Organization, url: str, description: str = "") -> WebhookEndpoint:
    """A new endpoint with a fresh secret (the caller shows `secret` once)."""
    return WebhookEndpoint.objects.create(tenant=tenant, url=validate_url(url),
                                          description=description, secret=new_secret())


@transaction.atomic
def update_endpoint(*, endpoint: WebhookEndpoint, url: str | None = None,
                    description: str | None = None, active: bool | None = None
                    ) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    if url is not None:
        endpoint.url = validate_url(url)
    if description is not None:
        endpoint.description = description
    if active is not None:
        endpoint.active = active
    endpoint.save(update_fields=["url", "description", "active"])
    return endpoint


@transaction.atomic
def delete_endpoint(*, endpoint: WebhookEndpoint) -> None:
    WebhookEndpoint.objects.filter(pk=endpoint.pk).delete()


# --- signing ----------------------------------------------------------------------------------------


def signature(secret: str, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, body: bytes, header: str, *, now: int, tolerance_s: int = 300) -> bool:
    """What a receiver does (and our tests): recompute and compare in constant time."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, body, timestamp), f"t={timestamp},v1={fields.get('v1', '')}")


def body_of(event: Event) -> bytes:
    return json.dumps({"id": event.pk, "kind": event.kind, "lease": event.lease_id,
                       "occurred_at": event.occurred_at.isoformat(),
                       "created_at": event.created_at.isoformat(), "payload": event.payload},
                      sort_keys=True, separators=(",", ":")).encode()


# --- fan-out and delivery ---------------------------------------------------------------------------


def backoff(attempt: int) -> timedelta:
    """10 s, 20 s, 40 s ... doubling after each failed attempt, at most an hour."""
    base = _setting("WEBHOOK_BACKOFF_BASE_S", 10)
    cap = _setting("WEBHOOK_BACKOFF_CAP_S", 3600)
    return timedelta(seconds=min(cap, base * 2 ** max(attempt - 1, 0)))


def fan_out(*, now: datetime | None = None) -> list[int]:
    """Create the missing deliveries (each active endpoint gets its tenant's events stored
    since it was registered) and return the ids of those due now."""
    now = now or timezone.now()
    for endpoint in WebhookEndpoint.objects.filter(active=True):
        events = (Event.objects.filter(tenant_id=endpoint.tenant_id,
                                       created_at__gte=max(endpoint.created_at, now - LOOK_BACK))
                  .exclude(deliveries__endpoint=endpoint).values_list("pk", flat=True))
        WebhookDelivery.objects.bulk_create(
            [WebhookDelivery(endpoint=endpoint, event_id=pk, next_attempt_at=now)
             for pk in events], ignore_conflicts=True)
    return list(WebhookDelivery.objects.filter(
        state__in=[D.PENDING, D.SENDING], next_attempt_at__lte=now, endpoint__active=True)
        .order_by("next_attempt_at", "pk").values_list("pk", flat=True))


def claim(*, delivery_id: int, now: datetime) -> WebhookDelivery | None:
    """Take a due delivery for one attempt, or None (not due, being sent, or done)."""
    claimed = WebhookDelivery.objects.filter(
        Q(state__in=[D.PENDING, D.SENDING]), pk=delivery_id, next_attempt_at__lte=now,
    ).update(state=D.SENDING, attempts=F("attempts") + 1, next_attempt_at=now + CLAIM_TTL)
    if not claimed:
        return None
    return WebhookDelivery.objects.select_related("endpoint", "event").get(pk=delivery_id)


@dataclass(frozen=True)
class Outcome:
    state: str
    status_code: int | None = None
    retry_in: timedelta | None = None


def deliver(*, delivery_id: int, now: datetime | None = None) -> Outcome | None:
    """One attempt at one delivery; None when it was not ours to send."""
    now = now or timezone.now()
    delivery = claim(delivery_id=delivery_id, now=now)
    if delivery is None:
        return None
    endpoint = delivery.endpoint
    if not endpoint.active:
        WebhookDelivery.objects.filter(pk=delivery.pk, state=D.SENDING).update(
            state=D.FAILED, error="endpoint disabled")
        return Outcome(D.FAILED)
    body = body_of(delivery.event)
    headers = {"Content-Type": "application/json", "User-Agent": "IBEX-Webhooks/1",
               SIGNATURE_HEADER: signature(endpoint.secret, body, int(now.timestamp())),
               "IBEX-Event-Id": str(delivery.event_id), "IBEX-Event-Kind": delivery.event.kind,
               "IBEX-Delivery-Attempt": str(delivery.attempts)}
    status_code, error = None, ""
    try:
        target = check_target(endpoint.url)
    except WebhookError as exc:  # refused before any traffic; the tenant reads why
        return _record(delivery, now, None, f"refused: {exc.message}"[:500])
    try:
        response = post_to(target, body, headers, timeout=_setting("WEBHOOK_TIMEOUT_S", 10))
        status_code = response.status_code
        if not 200 <= status_code < 300:
            error = f"HTTP {status_code}"
    except requests.RequestException as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    return _record(delivery, now, status_code, error)


class _PinnedTls(HTTPAdapter):
    """TLS to an address we checked, while the certificate and SNI are the URL's host."""

    def __init__(self, host: str, **kwargs):
        self._host = host
        super().__init__(**kwargs)

    def init_poolmanager(self, *args, **kwargs):
        kwargs.update(server_hostname=self._host, assert_hostname=self._host)
        super().init_poolmanager(*args, **kwargs)


def post_to(target: webhook_targets.Target, body: bytes, headers: dict,
            timeout: float) -> requests.Response:
    """POST to the first checked address of the target, never following a redirect."""
    address = target.addresses[0]
    netloc = f"[{address}]:{target.port}" if ":" in address else f"{address}:{target.port}"
    parts = urlsplit(target.url)
    url = parts._replace(netloc=netloc).geturl()
    default_port = {"https": 443, "http": 80}[target.scheme]
    host_header = target.host if target.port == default_port else f"{target.host}:{target.port}"
    with requests.Session() as session:
        session.trust_env = False  # no proxy from the environment: the checked address it is
        if target.scheme == "https":
            session.mount(f"https://{netloc}", _PinnedTls(target.host))
        return session.post(url, data=body, headers={**headers, "Host": host_header},
                            timeout=timeout, allow_redirects=False)


@transaction.atomic
def _record(delivery: WebhookDelivery, now: datetime, status_code: int | None,
            error: str) -> Outcome:
    mine = WebhookDelivery.objects.filter(pk=delivery.pk, state=D.SENDING,
                                          attempts=delivery.attempts)
    if not error:
        mine.update(state=D.SUCCEEDED, status_code=status_code, error="", delivered_at=now)
        outcome = Outcome(D.SUCCEEDED, status_code)
    elif delivery.attempts >= _setting("WEBHOOK_MAX_ATTEMPTS", 8):
        mine.update(state=D.FAILED, status_code=status_code, error=error)
        outcome = Outcome(D.FAILED, status_code)
    else:
        wait = backoff(delivery.attempts)
        mine.update(state=D.PENDING, status_code=status_code, error=error,
                    next_attempt_at=now + wait)
        outcome = Outcome(D.PENDING, status_code, wait)
    WebhookAttempt.objects.create(
        delivery=delivery, number=delivery.attempts, status_code=status_code, error=error,
        next_attempt_at=now + outcome.retry_in if outcome.retry_in else None, at=now)
    return outcome


@transaction.atomic
def redeliver(*, delivery: WebhookDelivery, now: datetime | None = None) -> WebhookDelivery:
    """A tenant asks again for a delivery that gave up (a succeeded one is never re-sent)."""
    now = now or timezone.now()
    WebhookDelivery.objects.filter(pk=delivery.pk, state=D.FAILED).update(
        state=D.PENDING, next_attempt_at=now)
    return WebhookDelivery.objects.get(pk=delivery.pk)
