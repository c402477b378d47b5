from django.contrib.auth import views as auth_views
from django.urls import path

from web import (
    views_account,
    views_billing,
    views_lease,
    views_market,
    views_ops,
    views_pools,
    views_provider,
    views_tenant,
    views_webhooks,
)
from web.login import LoginView

app_name = "web"

urlpatterns = [
    path("", views_market.market, name="market"),
    path("markets/cards/", views_market.market_cards, name="market-cards"),
    path("markets/<str:gpu_model>/", views_market.history, name="market-history"),
    path("signup/", views_account.signup, name="signup"),
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("home/", views_account.home, name="home"),
    path("app/", views_tenant.dashboard, name="dashboard"),
    path("app/activity/", views_tenant.activity, name="activity"),
    path("app/leases/<int:lease_id>/", views_lease.lease_detail, name="lease"),
    path("app/leases/<int:lease_id>/log/", views_lease.lease_log, name="lease-log"),
    path("app/leases/<int:lease_id>/terminate/", views_lease.terminate, name="terminate"),
    path("app/leases/<int:lease_id>/extend/", views_lease.extend, name="extend"),
    path("app/orders/<int:order_id>/cancel/", views_lease.cancel_order, name="cancel-order"),
    path("app/account/", views_billing.account, name="account"),
    path("app/account/top-ups/<int:top_up_id>/", views_billing.top_up_status, name="top-up"),
    path("app/account/invoices/<str:month>/", views_billing.invoice, name="invoice"),
    path("app/keys/", views_tenant.api_keys, name="api-keys"),
    path("app/keys/<int:key_id>/revoke/", views_tenant.revoke_key, name="revoke-key"),
    path("app/webhooks/", views_webhooks.webhooks_page, name="webhooks"),
    path("app/webhooks/<int:endpoint_id>/toggle/", views_webhooks.toggle_endpoint,
         name="webhook-toggle"),
    path("app/webhooks/<int:endpoint_id>/delete/", views_webhooks.delete_endpoint,
         name="webhook-delete"),
    path("app/webhooks/deliveries/<int:delivery_id>/redeliver/", views_webhooks.redeliver,
         name="webhook-redeliver"),
    path("app/pools/", views_pools.pools, name="pools"),
    path("app/pools/<slug:name>/", views_pools.pool_detail, name="pool"),
    path("app/pools/<slug:name>/live/", views_pools.pool_live, name="pool-live"),
    path("app/pools/<slug:name>/orders/<int:order_id>/cancel/", views_pools.cancel_waiting,
         name="pool-cancel-order"),
    path("provider/", views_provider.fleet, name="provider"),
    path("provider/prices/", views_provider.set_price, name="set-price"),
    path("provider/fabrics/", views_provider.import_fabric, name="import-fabric"),
    path("provider/fabrics/<int:fabric_id>/health/", views_provider.fabric_health_part,
         name="fabric-health"),
    path("provider/earnings/", views_provider.earnings, name="earnings"),
    path("ops/", views_ops.dashboard, name="ops"),
    path("ops/health/", views_ops.health, name="ops-health"),
]
