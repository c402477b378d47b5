from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from ibex import health
from ibex.api.views import api_root

api_v1 = [
    path("", api_root, name="api-root"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="docs"),
    path("", include("ibex.accounts.urls")),
    path("", include("fabric.urls")),
    path("", include("pool.urls")),
    path("", include("billing.urls")),
    path("", include("market.urls")),
    path("", include("notify.urls")),
    path("", include("scheduler.urls")),
]

urlpatterns = [
    path("favicon.ico", health.favicon, name="favicon"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("api/v1/", include(api_v1)),
    path("admin/", admin.site.urls),
    path("", include("web.urls")),
]

# HTML pages for people, the API's JSON error shape under /api/ (web.errors decides by path)
handler400 = "web.errors.bad_request"
handler403 = "web.errors.permission_denied"
handler404 = "web.errors.page_not_found"
handler500 = "web.errors.server_error"
