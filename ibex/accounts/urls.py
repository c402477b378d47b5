from django.urls import path
from rest_framework.routers import SimpleRouter

from ibex.accounts import api

router = SimpleRouter()
router.register("orgs", api.OrganizationViewSet, basename="org")
router.register("keys", api.ApiKeyViewSet, basename="key")

urlpatterns = [
    path("me/", api.whoami, name="whoami"),
    path("provider/", api.ProviderProfileView.as_view(), name="provider-profile"),
    *router.urls,
]
