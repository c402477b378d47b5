from django.urls import path
from rest_framework.routers import SimpleRouter

from pool import api

router = SimpleRouter()
router.register("nodes", api.NodeViewSet, basename="node")
router.register("gpus", api.GpuViewSet, basename="gpu")
router.register("gpu-models", api.GpuModelViewSet, basename="gpu-model")
router.register("pools", api.PoolViewSet, basename="pool")
router.register("quotas", api.QuotaNodeViewSet, basename="quota")

urlpatterns = [
    path("nodes/<int:pk>/heartbeat/", api.HeartbeatView.as_view(), name="node-heartbeat"),
    path("nodes/<int:pk>/logs/", api.NodeLogsView.as_view(), name="node-logs"),
    *router.urls,
]
