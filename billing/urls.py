from django.urls import path
from rest_framework.routers import SimpleRouter

from billing import api

router = SimpleRouter()
router.register("account/entries", api.EntryViewSet, basename="entry")
router.register("account/topups", api.TopUpViewSet, basename="topup")
router.register("account/refunds", api.RefundViewSet, basename="refund")
router.register("account/payouts", api.PayoutViewSet, basename="payout")

urlpatterns = [
    path("account/", api.AccountView.as_view(), name="account"),
    path("account/connect/", api.ConnectView.as_view(), name="account-connect"),
    path("account/invoices/", api.InvoiceListView.as_view(), name="invoices"),
    path("account/invoices/<str:month>/", api.InvoiceView.as_view(), name="invoice"),
    path("account/statements/<str:month>/", api.StatementView.as_view(), name="statement"),
    path("stripe/webhook/", api.StripeWebhookView.as_view(), name="stripe-webhook"),
    *router.urls,
]
