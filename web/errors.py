"""Error pages: HTML for people on the web pages, the API's JSON error shape for programs
(paths under /api/ and the health probes)."""

from django.http import HttpResponse
from django.template import loader

from ibex.api import errors as api_errors

MACHINE_PATHS = ("/api/", "/healthz", "/readyz")


def _for_programs(request) -> bool:
    return request.path.startswith(MACHINE_PATHS)


def _page(request, status: int, title: str, message: str) -> HttpResponse:
    template = loader.get_template("web/error.html")
    context = {"status": status, "title": title, "message": message}
    try:
        body = template.render(context, request)
    except Exception:  # a broken context processor (the database down): render bare
        body = template.render(context)
    return HttpResponse(body, status=status)


def bad_request(request, exception=None):
    if _for_programs(request):
        return api_errors.json_400(request, exception)
    return _page(request, 400, "Bad request", "The request could not be understood.")


def permission_denied(request, exception=None):
    if _for_programs(request):
        return api_errors.json_403(request, exception)
    return _page(request, 403, "Not allowed", "You do not have permission to see this page.")


def page_not_found(request, exception=None):
    if _for_programs(request):
        return api_errors.json_404(request, exception)
    return _page(request, 404, "Page not found",
                 "There is no page at this address, or it is not yours to see.")


def server_error(request):
    if _for_programs(request):
        return api_errors.json_500(request)
    # no request context: whatever failed (the database, a context processor) is not asked again
    body = loader.get_template("web/error.html").render({
        "status": 500, "title": "Something went wrong",
        "message": "The error has been logged. Please try again in a moment."})
    return HttpResponse(body, status=500)
