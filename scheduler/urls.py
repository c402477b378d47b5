from django.urls import path
from rest_framework.routers import SimpleRouter

from scheduler import api

router = SimpleRouter()
router.register("events", api.EventViewSet, basename="event")
router.register("webhooks", api.WebhookEndpointViewSet, basename="webhook")

urlpatterns = [
    path("leases/<int:pk>/sla/", api.LeaseSlaView.as_view(), name="lease-sla"),
    *router.urls,
]
