"""`Authorization: Bearer <key>` authentication for the API."""

import hmac
from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions

from ibex.accounts.models import ApiKey
from ibex.accounts.services import KEY_PREFIX, hash_key

LAST_USED_RESOLUTION = timedelta(minutes=1)  # avoid a write on every request


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace")
        if not header.startswith(f"{self.keyword} "):
            return None
        raw_key = header[len(self.keyword) + 1:].strip()
        parts = raw_key.split("_", 2)
        if len(parts) != 3 or parts[0] != KEY_PREFIX:
            raise exceptions.AuthenticationFailed("Malformed API key.")
        api_key = (
            ApiKey.objects.select_related("user", "organization").filter(prefix=parts[1]).first()
        )
        if api_key is None or not hmac.compare_digest(api_key.key_hash, hash_key(raw_key)):
            raise exceptions.AuthenticationFailed("Unknown API key.")
        now = timezone.now()
        if api_key.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This API key has been revoked.")
        if api_key.expires_at is not None and api_key.expires_at <= now:
            raise exceptions.AuthenticationFailed("This API key has expired.")
        if api_key.last_used_at is None or now - api_key.last_used_at > LAST_USED_RESOLUTION:
            ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        return api_key.user, api_key

    def authenticate_header(self, request):
        return self.keyword
