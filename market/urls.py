from rest_framework.routers import SimpleRouter

from market import api

router = SimpleRouter()
router.register("prices", api.PriceViewSet, basename="price")
router.register("leases", api.LeaseViewSet, basename="lease")
router.register("orders", api.OrderViewSet, basename="order")
router.register("markets", api.MarketViewSet, basename="market")
router.register("offers", api.OfferViewSet, basename="offer")
router.register("quote", api.QuoteViewSet, basename="quote")

urlpatterns = router.urls
