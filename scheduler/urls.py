from django.urls import path

from scheduler import api

urlpatterns = [
    path("leases/<int:pk>/sla/", api.LeaseSlaView.as_view(), name="lease-sla"),
    path("gateway/heartbeat/", api.GatewayHeartbeatView.as_view(), name="gateway-heartbeat"),
]
