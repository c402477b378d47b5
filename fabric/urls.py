from rest_framework.routers import SimpleRouter

from fabric.api import FabricViewSet

router = SimpleRouter()
router.register("fabrics", FabricViewSet, basename="fabric")

urlpatterns = router.urls
