"""One JSON shape for every API error: {"error": {"code", "message", "fields"}}."""

from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ibex.errors import Refusal, http_status


def error_body(code: str, message: str, fields: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def _flatten(detail) -> list[str]:
    if isinstance(detail, dict):
        return [f"{key}: {msg}" for key, value in detail.items() for msg in _flatten(value)]
    if isinstance(detail, list):
        return [msg for item in detail for msg in _flatten(item)]
    return [str(detail)]


def _fields(detail) -> dict:
    """Field name → list of messages; nested serializers keep dotted names."""
    if not isinstance(detail, dict):
        return {}
    fields: dict[str, list[str]] = {}
    for key, value in detail.items():
        if isinstance(value, dict):
            for sub, messages in _fields(value).items():
                fields[f"{key}.{sub}"] = messages
        elif isinstance(value, list) and any(isinstance(item, dict) for item in value):
            # a list of nested objects: name each failing item by its position
            for position, item in enumerate(value):
                for sub, messages in _fields(item).items() if isinstance(item, dict) else ():
                    fields[f"{key}.{position}.{sub}"] = messages
        else:
            fields[str(key)] = _flatten(value)
    return fields


def refusal_exception(refusal: Refusal) -> exceptions.APIException:
    """A service's refusal as the API answers it: 400 naming the field, else its code's status."""
    status_code = http_status(refusal.code)
    if refusal.field and status_code == status.HTTP_400_BAD_REQUEST:
        return exceptions.ValidationError({refusal.field: [refusal.message]})
    return ApiError(refusal.message, code=refusal.code, status_code=status_code)


def exception_handler(exc, context):
    if isinstance(exc, Refusal):
        exc = refusal_exception(exc)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # an unexpected error: Django's 500 handler answers and it is logged
    detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
    if isinstance(exc, exceptions.ValidationError):
        fields = _fields(detail)
        non_field = fields.pop("non_field_errors", None)
        message = "; ".join(non_field) if non_field else "Invalid input."
        if not isinstance(detail, dict):
            message = "; ".join(_flatten(detail))
        body = error_body("invalid", message, fields)
    else:
        code = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
        body = error_body(code if isinstance(code, str) else "error", "; ".join(_flatten(detail)))
    response.data = body
    return response


def json_400(request, exception=None):
    # Django's own refusals, before any view: a Host not in ALLOWED_HOSTS, a body too large.
    return JsonResponse(error_body("bad_request", "Bad request."),
                        status=status.HTTP_400_BAD_REQUEST)


def json_403(request, exception=None):
    return JsonResponse(error_body("permission_denied", "Forbidden."),
                        status=status.HTTP_403_FORBIDDEN)


def json_404(request, exception=None):
    return JsonResponse(error_body("not_found", f"No such page: {request.path}"),
                        status=status.HTTP_404_NOT_FOUND)


def json_500(request):
    return JsonResponse(error_body("server_error", "Internal server error; it has been logged."),
                        status=status.HTTP_500_INTERNAL_SERVER_ERROR)


class ApiError(exceptions.APIException):
    """A business-rule refusal with its own code and HTTP status (409 pool short, ...)."""

    def __init__(self, message: str, *, code: str, status_code: int = 400):
        self.status_code = status_code
        super().__init__(detail=message, code=code)


__all__ = ["ApiError", "Response", "error_body", "exception_handler", "json_400", "json_403",
           "json_404", "json_500", "refusal_exception"]
