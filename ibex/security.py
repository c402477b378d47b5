"""Security headers Django's SecurityMiddleware does not set: the Content-Security-Policy.

The policy allows scripts, styles, images and fonts from this site only (and Stripe.js from
Stripe, where configured): no inline scripts, inline styles, event-handler attributes or eval
(templates keep JS and CSS in static files).
Pages may not be framed (with X-Frame-Options: DENY for older browsers), forms post only
here, and no plugins load. HSTS, nosniff, Referrer-Policy and the opener policy come from
SecurityMiddleware (settings SECURE_*).
"""

from urllib.parse import urlsplit

from django.conf import settings

STRIPE_HOOKS = "https://hooks.stripe.com"  # 3-D Secure frames (Stripe's CSP guide)
STRIPE_API = "https://api.stripe.com"


def _origin(url: str) -> str:
    parts = urlsplit(url or "")
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


def content_security_policy() -> str:
    """The policy; where Stripe.js is configured (the top-up page's card element), its origin
    may serve scripts and frames and be called, as Stripe requires, and nothing else may."""
    stripe = _origin(settings.STRIPE_JS_URL)
    extra_script = f" {stripe}" if stripe else ""
    frames = f"frame-src 'self' {stripe} {STRIPE_HOOKS}" if stripe else "frame-src 'none'"
    connect = "connect-src 'self'" + (f" {stripe} {STRIPE_API}" if stripe else "")
    return "; ".join([
        "default-src 'self'",
        f"script-src 'self'{extra_script}",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        connect,
        frames,
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ])


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", content_security_policy())
        response.headers.setdefault("Permissions-Policy",
                                    "camera=(), microphone=(), geolocation=(), payment=()")
        return response
