"""A local fake of the Stripe API for tests: the endpoints IBEX uses, Stripe's object shapes
(built from recorded responses in `recorded/`), its error responses and idempotency keys.

Driven by the real `stripe` library pointed at it (settings.STRIPE_API_BASE). Tests move
objects along (`succeed_payment`, `fail_payout`, ...), which returns the event Stripe would
send, and `signed_delivery` signs it with Stripe's webhook signature scheme.

For the browser it also serves a minimal Stripe.js at `/v3/` (`Stripe(pk).elements()
.create('card')` and `confirmCardPayment(client_secret, ...)`), which confirms a PaymentIntent
with the publishable key as Stripe.js does; once `deliver_webhooks_to` names IBEX's webhook URL,
the fake then sends the signed `payment_intent.succeeded` (or `payment_failed`) there itself.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import itertools
import json
import re
import secrets
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl

RECORDED = Path(__file__).parent / "recorded"
API_KEY_PATTERN = re.compile(r"^Bearer sk_test_\w+$")
PUBLISHABLE_KEY_PATTERN = re.compile(r"^Bearer pk_test_\w+$")
CONFIRM_PATH = re.compile(r"/v1/payment_intents/(pi_\w+)/confirm")
STRIPE_JS = Path(__file__).parent / "stripe_v3.js"
DECLINED_CARD = "4000000000000002"


def recorded(name: str) -> dict:
    return json.loads((RECORDED / f"{name}.json").read_text())


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def form_to_dict(body: str) -> dict:
    """Stripe's form encoding (`metadata[a]=1&items[0][x]=2`) back into nested values."""
    result: dict = {}
    for key, value in parse_qsl(body, keep_blank_values=True):
        parts = re.findall(r"[^\[\]]+", key)
        node = result
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return result


def _error(status: int, kind: str, message: str, param: str | None = None, **extra) -> tuple:
    body = {"error": {"type": kind, "message": message, **extra}}
    if param:
        body["error"]["param"] = param
    return status, body


class FakeStripe:
    """The state of the fake: objects by id, idempotency keys, requests seen."""

    def __init__(self):
        self.lock = threading.Lock()
        self.webhook_url: str | None = None
        self.webhook_secret: str | None = None
        self._deliveries: list[threading.Thread] = []
        self._deliveries_lock = threading.Lock()  # taken inside `lock` (handle → _send_later)
        self.reset()

    def deliver_webhooks_to(self, url: str | None, secret: str | None) -> None:
        """Send the events a card confirmation causes to this URL, signed, as Stripe does."""
        self.webhook_url, self.webhook_secret = url, secret

    def wait_for_deliveries(self, timeout: float = 15.0) -> None:
        """Return once every webhook sent so far has been answered (or has given up).

        A delivery is a request to the live server, whose handler writes to the test database;
        one still in flight when the test's flush TRUNCATEs the tables deadlocks with it (the
        declined-card test ends on the page's error, before the `payment_failed` webhook that
        the fake sends 0.2 s later has been handled)."""
        with self._deliveries_lock:
            deliveries, self._deliveries = self._deliveries, []
        for delivery in deliveries:
            delivery.join(timeout)
            if delivery.is_alive():
                raise RuntimeError(f"a webhook to {self.webhook_url} is still unanswered "
                                   f"after {timeout} s")

    def reset(self):
        self.objects: dict[str, dict] = {}
        self.idempotent: dict[str, tuple[str, int, dict]] = {}
        self.requests: list[dict] = []
        self.failures: list[tuple[str, int, dict]] = []  # (path prefix, status, body)
        self._clock = itertools.count(1_764_468_000)

    # --- what tests call ----------------------------------------------------------------------

    def fail_next(self, path_prefix: str, status: int, body: dict) -> None:
        """The next request to a path starting with this answers with this error."""
        self.failures.append((path_prefix, status, body))

    def calls(self, method: str, path_prefix: str) -> list[dict]:
        return [r for r in self.requests
                if r["method"] == method and r["path"].startswith(path_prefix)]

    def event(self, type_: str, obj: dict, account: str | None = None) -> dict:
        event = recorded("event")
        event.update(id=_new_id("evt"), type=type_, created=next(self._clock),
                     data={"object": copy.deepcopy(obj)})
        if account:
            event["account"] = account
        return event

    def succeed_payment(self, payment_intent_id: str) -> dict:
        intent = self.objects[payment_intent_id]
        charge = recorded("charge")
        charge.update(id=_new_id("ch"), amount=intent["amount"], amount_captured=intent["amount"],
                      payment_intent=intent["id"], metadata=intent["metadata"])
        self.objects[charge["id"]] = charge
        intent.update(status="succeeded", amount_received=intent["amount"],
                      latest_charge=charge["id"], last_payment_error=None)
        return self.event("payment_intent.succeeded", intent)

    def fail_payment(self, payment_intent_id: str) -> dict:
        intent = self.objects[payment_intent_id]
        error = recorded("error_card_declined")["error"]
        intent.update(status="requires_payment_method",
                      last_payment_error={k: error[k] for k in ("code", "decline_code",
                                                                "message", "type")})
        return self.event("payment_intent.payment_failed", intent)

    def charge_refunded(self, refund_id: str) -> dict:
        refund = self.objects[refund_id]
        charge = self.objects[refund["charge"]]
        refunds = [r for r in self.objects.values()
                   if r.get("object") == "refund" and r["charge"] == charge["id"]]
        charge.update(amount_refunded=sum(r["amount"] for r in refunds),
                      refunded=sum(r["amount"] for r in refunds) == charge["amount"])
        charge["refunds"] = {"object": "list", "data": copy.deepcopy(refunds), "has_more": False,
                             "total_count": len(refunds),
                             "url": f"/v1/charges/{charge['id']}/refunds"}
        return self.event("charge.refunded", charge)

    def complete_onboarding(self, account_id: str) -> dict:
        account = self.objects[account_id]
        account.update(details_submitted=True, charges_enabled=True, payouts_enabled=True,
                       capabilities={"transfers": "active"})
        return self.event("account.updated", account, account=account_id)

    def pay_out(self, payout_id: str) -> dict:
        payout = self.objects[payout_id]
        payout["status"] = "paid"
        return self.event("payout.paid", payout, account=payout["_account"])

    def fail_payout(self, payout_id: str) -> dict:
        payout = self.objects[payout_id]
        payout.update(status="failed", failure_code="account_closed",
                      failure_message="The bank account has been closed.")
        return self.event("payout.failed", payout, account=payout["_account"])

    # --- the API ---------------------------------------------------------------------------------

    def handle(self, method: str, path: str, headers: dict, params: dict) -> tuple[int, dict]:
        with self.lock:
            self.requests.append({"method": method, "path": path, "params": params,
                                  "idempotency_key": headers.get("idempotency-key"),
                                  "stripe_account": headers.get("stripe-account")})
            confirm = CONFIRM_PATH.fullmatch(path) if method == "POST" else None
            if confirm and PUBLISHABLE_KEY_PATTERN.match(headers.get("authorization", "")):
                return self._confirm_payment_intent(confirm.group(1), params)
            if not API_KEY_PATTERN.match(headers.get("authorization", "")):
                return _error(401, "invalid_request_error", "Invalid API Key provided.")
            for position, (prefix, status, body) in enumerate(self.failures):
                if path.startswith(prefix):
                    del self.failures[position]
                    return status, body
            key = headers.get("idempotency-key") if method == "POST" else None
            fingerprint = json.dumps([path, params], sort_keys=True)
            if key and key in self.idempotent:
                seen_fingerprint, status, body = self.idempotent[key]
                if seen_fingerprint != fingerprint:
                    return _error(400, "idempotency_error",
                                  "Keys for idempotent requests can only be used with the same "
                                  "parameters they were first used with.")
                return status, copy.deepcopy(body)
            status, body = self._route(method, path, params, headers.get("stripe-account"))
            if key and status < 500:
                self.idempotent[key] = (fingerprint, status, copy.deepcopy(body))
            return status, body

    def _route(self, method, path, params, account) -> tuple[int, dict]:
        routes = {
            ("POST", "/v1/payment_intents"): self._create_payment_intent,
            ("POST", "/v1/refunds"): self._create_refund,
            ("POST", "/v1/accounts"): self._create_account,
            ("POST", "/v1/account_links"): self._create_account_link,
            ("POST", "/v1/transfers"): self._create_transfer,
            ("POST", "/v1/payouts"): self._create_payout,
        }
        if (method, path) in routes:
            return routes[(method, path)](params, account)
        match = re.fullmatch(r"/v1/(payment_intents|refunds|accounts|transfers|payouts)/(\w+)",
                             path)
        if method == "GET" and match:
            found = self.objects.get(match.group(2))
            if found is None:
                return _error(404, "invalid_request_error",
                              f"No such {match.group(1)[:-1]}: '{match.group(2)}'",
                              param="id", code="resource_missing")
            return 200, self._public(found)
        return _error(404, "invalid_request_error",
                      f"Unrecognized request URL ({method}: {path}).")

    @staticmethod
    def _public(obj: dict) -> dict:
        return {k: v for k, v in obj.items() if not k.startswith("_")}

    def _amount(self, params) -> tuple[int, dict] | int:
        raw = params.get("amount")
        if raw is None:
            return _error(400, "invalid_request_error", "Missing required param: amount.",
                          param="amount", code="parameter_missing")
        if not raw.isdigit() or int(raw) < 50:
            return _error(400, "invalid_request_error",
                          "Amount must be at least $0.50 usd", param="amount",
                          code="amount_too_small")
        return int(raw)

    def _create_payment_intent(self, params, account):
        amount = self._amount(params)
        if isinstance(amount, tuple):
            return amount
        intent = recorded("payment_intent")
        intent_id = _new_id("pi")
        intent.update(id=intent_id, amount=amount, currency=params.get("currency", "usd"),
                      client_secret=f"{intent_id}_secret_{secrets.token_hex(12)}",
                      created=next(self._clock), metadata=params.get("metadata", {}),
                      customer=params.get("customer"),
                      payment_method=params.get("payment_method"))
        if params.get("confirm") == "true":
            if params.get("payment_method") == "pm_card_chargeDeclined":
                error = recorded("error_card_declined")
                error["error"]["payment_intent"] = {"id": intent_id, "object": "payment_intent",
                                                    "status": "requires_payment_method"}
                self.objects[intent_id] = intent
                return 402, error
            intent["status"] = "processing"
        self.objects[intent_id] = intent
        return 200, self._public(intent)

    def _confirm_payment_intent(self, intent_id: str, params: dict) -> tuple[int, dict]:
        """What Stripe.js's confirmCardPayment asks (publishable key + client secret): the
        test card 4000 0000 0000 0002 is declined, any other number pays."""
        intent = self.objects.get(intent_id)
        if intent is None or params.get("client_secret") != intent["client_secret"]:
            return _error(400, "invalid_request_error",
                          "The client_secret provided does not match this PaymentIntent.",
                          param="client_secret")
        number = re.sub(r"\D", "", ((params.get("payment_method") or {}).get("card") or {})
                        .get("number", ""))
        if len(number) < 12:
            return _error(400, "card_error", "Your card number is incomplete.",
                          code="incomplete_number")
        if number == DECLINED_CARD:
            event = self.fail_payment(intent_id)
            self._send_later(event)
            error = recorded("error_card_declined")
            error["error"]["payment_intent"] = self._public(intent)
            return 402, error
        event = self.succeed_payment(intent_id)
        self._send_later(event)
        return 200, self._public(intent)

    def _send_later(self, event: dict) -> None:
        """Stripe sends the webhook on its own, after answering the browser."""
        if not self.webhook_url:
            return
        payload, signature = signed_delivery(event, self.webhook_secret or "")
        request = urllib.request.Request(self.webhook_url, data=payload, method="POST", headers={
            "Content-Type": "application/json", "Stripe-Signature": signature})

        def send():
            time.sleep(0.2)
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - local
                    answer.read()
            except OSError:  # the test (and its live server) ended first; Stripe would retry
                pass

        delivery = threading.Thread(target=send, daemon=True)
        with self._deliveries_lock:
            self._deliveries.append(delivery)
        delivery.start()

    def _create_refund(self, params, account):
        intent = self.objects.get(params.get("payment_intent", ""))
        if intent is None or intent["status"] != "succeeded":
            return _error(400, "invalid_request_error",
                          "This PaymentIntent does not have a successful charge to refund.",
                          param="payment_intent", code="charge_not_refundable")
        charge = self.objects[intent["latest_charge"]]
        amount = self._amount(params)
        if isinstance(amount, tuple):
            return amount
        already = sum(r["amount"] for r in self.objects.values()
                      if r.get("object") == "refund" and r["charge"] == charge["id"])
        if already + amount > charge["amount"]:
            return _error(400, "invalid_request_error",
                          f"Refund amount (${amount / 100:.2f}) is greater than unrefunded "
                          f"amount on charge (${(charge['amount'] - already) / 100:.2f})",
                          param="amount", code="amount_too_large")
        refund = recorded("refund")
        refund.update(id=_new_id("re"), amount=amount, charge=charge["id"],
                      payment_intent=intent["id"], created=next(self._clock),
                      metadata=params.get("metadata", {}), status="succeeded")
        self.objects[refund["id"]] = refund
        return 200, self._public(refund)

    def _create_account(self, params, account):
        if params.get("type") not in ("express", "standard", "custom"):
            return _error(400, "invalid_request_error", "Invalid type: must be one of "
                          "custom, express, or standard", param="type")
        created = recorded("account")
        created.update(id=f"acct_{secrets.token_hex(8)}", created=next(self._clock),
                       metadata=params.get("metadata", {}))
        self.objects[created["id"]] = created
        return 200, self._public(created)

    def _create_account_link(self, params, account):
        if params.get("account") not in self.objects:
            return _error(400, "invalid_request_error",
                          f"No such account: '{params.get('account')}'", param="account")
        link = recorded("account_link")
        link["url"] = f"https://connect.stripe.com/setup/e/{params['account']}/" \
                      f"{secrets.token_urlsafe(9)}"
        return 200, link

    def _create_transfer(self, params, account):
        destination = self.objects.get(params.get("destination", ""))
        if destination is None:
            return _error(400, "invalid_request_error", "No such destination: "
                          f"'{params.get('destination')}'", param="destination")
        if destination["capabilities"].get("transfers") != "active":
            return _error(400, "invalid_request_error",
                          "Your destination account needs to have at least one of the following "
                          "capabilities enabled: transfers, crypto_transfers, legacy_payments",
                          code="insufficient_capabilities_for_transfer")
        amount = self._amount(params)
        if isinstance(amount, tuple):
            return amount
        transfer = recorded("transfer")
        transfer.update(id=_new_id("tr"), amount=amount, destination=destination["id"],
                        created=next(self._clock), metadata=params.get("metadata", {}))
        self.objects[transfer["id"]] = transfer
        return 200, self._public(transfer)

    def _create_payout(self, params, account):
        if account not in self.objects:
            return _error(400, "invalid_request_error",
                          "Payouts here are made on a connected account (Stripe-Account).")
        amount = self._amount(params)
        if isinstance(amount, tuple):
            return amount
        payout = recorded("payout")
        payout.update(id=_new_id("po"), amount=amount, created=next(self._clock),
                      metadata=params.get("metadata", {}), _account=account)
        self.objects[payout["id"]] = payout
        return 200, self._public(payout)


def signed_delivery(event: dict, secret: str, timestamp: int | None = None) -> tuple[bytes, str]:
    """The body and `Stripe-Signature` header Stripe would send for this event."""
    payload = json.dumps(event).encode()
    timestamp = int(time.time()) if timestamp is None else timestamp
    signature = hmac.new(secret.encode(), f"{timestamp}.".encode() + payload,
                         hashlib.sha256).hexdigest()
    return payload, f"t={timestamp},v1={signature}"


class _Handler(BaseHTTPRequestHandler):
    fake: FakeStripe

    def _answer(self, method: str):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        path, _, query = self.path.partition("?")
        params = form_to_dict(body or query)
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, answer = self.fake.handle(method, path, headers, params)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Request-Id", f"req_{secrets.token_hex(7)}")
        if headers.get("idempotency-key"):
            self.send_header("Idempotency-Key", headers["idempotency-key"])
        self.end_headers()
        self.wfile.write(data)

    def _cors(self):
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Access-Control-Allow-Headers", "Authorization, Content-Type")
        self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")

    def end_headers(self):
        self._cors()  # the browser calls the fake from the app's origin, as it calls Stripe
        super().end_headers()

    def do_OPTIONS(self):
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        if self.path.split("?")[0] in ("/v3", "/v3/"):
            script = STRIPE_JS.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/javascript")
            self.send_header("Content-Length", str(len(script)))
            self.end_headers()
            self.wfile.write(script)
            return
        self._answer("GET")

    def do_POST(self):
        self._answer("POST")

    def log_message(self, *args):
        pass


class FakeStripeServer:
    """`with FakeStripeServer() as server:` serves on 127.0.0.1 at `server.url`."""

    def __init__(self):
        self.fake = FakeStripe()
        handler = type("Handler", (_Handler,), {"fake": self.fake})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> FakeStripeServer:
        self.thread.start()
        return self

    def __enter__(self) -> FakeStripeServer:
        return self.start()

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
