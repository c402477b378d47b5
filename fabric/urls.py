from django.urls import path
from rest_framework.routers import SimpleRouter

from fabric.api import FabricReportView, FabricViewSet
from ibex.api.renderers import PlainTextRenderer

router = SimpleRouter()
router.register("fabrics", FabricViewSet, basename="fabric")

topology_conf = FabricViewSet.as_view({"get": "topology_conf"},
                                      renderer_classes=[PlainTextRenderer])

urlpatterns = [
    path("fabrics/<int:pk>/topology.conf", topology_conf, name="fabric-topology-conf"),
    path("fabrics/<slug:name>/reports/", FabricReportView.as_view(), name="fabric-reports"),
    *router.urls,
]
