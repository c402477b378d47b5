"""Security headers Django's SecurityMiddleware does not set: the Content-Security-Policy.

The policy allows scripts, styles, images and fonts from this site only: no inline scripts,
inline styles, event-handler attributes or eval (templates keep JS and CSS in static files).
Pages may not be framed (with X-Frame-Options: DENY for older browsers), forms post only
here, and no plugins load. HSTS, nosniff, Referrer-Policy and the opener policy come from
SecurityMiddleware (settings SECURE_*).
"""

CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "font-src 'self'",
    "connect-src 'self'",
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
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("Permissions-Policy",
                                    "camera=(), microphone=(), geolocation=(), payment=()")
        return response
