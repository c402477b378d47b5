from rest_framework.routers import SimpleRouter

from notify import api

router = SimpleRouter()
router.register("events", api.EventViewSet, basename="event")
router.register("webhooks", api.WebhookEndpointViewSet, basename="webhook")

urlpatterns = router.urls
