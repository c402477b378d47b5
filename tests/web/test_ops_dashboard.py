"""The operations dashboard: for operators only; utilisation, fragmentation, auctions, SLA
credits, queue depth and worker health."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from market.models import Clearing, Lease
from market.orders import OrderRequest, place_order
from scheduler.models import SlaCredit
from tests.web.conftest import PASSWORD
from web import operations
from web.operations import NodeFree, fragmentation


def lease_one_node(tenant):
    place_order(tenant=tenant, actor="test", request=OrderRequest(
        gpu_models=["H100-80GB"], gpus=8, hours=2, tier="on_demand",
        max_price_micros=3_000_000, topology={"required": "node"}))
    return Lease.objects.get(tenant=tenant)


def test_a_visitor_is_sent_to_log_in(client, db):
    assert client.get("/ops/")["Location"].startswith("/login/?next=/ops/")


def test_a_tenant_is_told_there_is_no_such_page(tenant_web):
    assert tenant_web.get("/ops/").status_code == 404
    assert tenant_web.get("/ops/health/").status_code == 404
    assert "/ops/" not in tenant_web.get("/app/").content.decode()


def test_staff_see_it_and_the_nav_links_it(client, db):
    staff = get_user_model().objects.create_user("sam", password=PASSWORD, is_staff=True)
    client.force_login(staff)

    page = client.get("/ops/")

    assert page.status_code == 200
    assert 'href="/ops/" aria-current="page">Operations</a>' in page.content.decode()


def test_it_shows_utilisation_and_whole_free_nodes_and_leaves(operator_web, tenant, provider):
    lease_one_node(tenant)  # 8 of 32 GPUs: one node of the two leaves' four

    page = operator_web.get("/ops/").content.decode()

    assert '<div class="value" id="util-now">25.0 %</div>' in page
    assert "(8 of 32)" in page
    assert '<td class="num whole-nodes">3 / 4</td>' in page
    assert '<td class="num whole-leaves">1 / 2</td>' in page
    assert 'class="chart chart-util"' in page and "<polyline" in page


def test_utilisation_counts_the_gpus_held_at_each_hour(tenant, provider):
    lease = lease_one_node(tenant)
    later = timezone.now() + timedelta(hours=3)  # past the lease's end

    samples = operations.utilisation(hours=6, now=later)

    assert len(samples) == 7 and samples[-1].leased == 0
    assert max(s.leased for s in samples) == 8 == lease.gpu_count
    assert samples[-1].total == 32


def test_fragmentation_counts_whole_nodes_and_leaves_per_fabric():
    rows = [NodeFree("lab", "leaf-a", 8, 0, True), NodeFree("lab", "leaf-a", 8, 3, True),
            NodeFree("lab", "leaf-b", 8, 0, True), NodeFree("lab", "leaf-b", 8, 0, True),
            NodeFree("lab", "leaf-c", 8, 0, False), NodeFree("oslo", "x", 4, 0, True)]

    lab, oslo = fragmentation(rows)

    assert (lab.whole_free_nodes, lab.leaves, lab.whole_free_leaves) == (3, 3, 1)
    assert lab.free_gpus == 29 and lab.stranded_gpus == 5
    assert round(lab.fragmentation_percent) == 17
    assert (oslo.whole_free_nodes, oslo.whole_free_leaves) == (1, 1)


def test_it_shows_auctions_and_sla_credits(operator_web, tenant, provider):
    lease = lease_one_node(tenant)
    now = timezone.now()
    for i, price in enumerate([2_100_000, 2_300_000]):
        Clearing.objects.create(gpu_model="H100-80GB", interval_start=now - timedelta(
            minutes=10 - 5 * i), price_micros=price, gpus_sold=16, accepted=[{}], refused=[])
    SlaCredit.objects.create(lease=lease, window_start=now - timedelta(hours=1), window_end=now,
                             down_gpu_seconds=600, lease_gpu_seconds=28_800, owed_micros=1_250_000,
                             amount_micros=1_250_000, reason="availability 97.9 % < 99.5 %")

    page = operator_web.get("/ops/").content.decode()

    assert "$2.10 – $2.30" in page and "<td class=\"num\">32</td>" in page
    assert 'id="sla-credits">$1.25</div>' in page
    assert "availability 97.9 % &lt; 99.5 %" in page


def test_the_health_card_reports_queue_depth_and_refreshes(operator_web):
    import uuid

    from ibex.celery import app as celery_app

    # a queue of its own: no worker of the session may take these three fake messages
    queue = f"ops-{uuid.uuid4().hex[:8]}"
    previous, celery_app.conf.task_default_queue = celery_app.conf.task_default_queue, queue
    client = celery_app.connection_for_write().default_channel.client
    client.rpush(queue, b"a", b"b", b"c")
    client.rpush(f"{queue}.place-0", b"d")
    try:
        card = operator_web.get("/ops/health/").content.decode()
    finally:
        celery_app.conf.task_default_queue = previous
        client.delete(queue, f"{queue}.place-0")

    assert f'data-queue="{queue}">3 waiting</dd>' in card
    assert f'data-queue="{queue}.place-0">1 waiting</dd>' in card
    assert 'hx-trigger="every 10s"' in card


def test_a_running_worker_answers_the_ping_and_the_answer_is_cached(celery_worker_process, db):
    from django.core.cache import cache

    cache.delete(operations.WORKERS_CACHE_KEY)

    found = operations.workers()
    cached = operations.workers()

    assert found.healthy and any(name.startswith("test-") for name in found.names)
    assert cached.checked_at == found.checked_at  # no second broadcast



def test_the_dashboard_costs_a_fixed_number_of_queries(operator_web, tenant, provider,
                                                       django_assert_max_num_queries):
    from django.core.cache import cache

    lease_one_node(tenant)
    cache.set(operations.WORKERS_CACHE_KEY, {"names": ["w@host"], "checked_at": 0.0,
                                             "error": ""}, 30)
    operator_web.get("/ops/")  # warm: sessions, the GPU catalogue

    with django_assert_max_num_queries(16):
        operator_web.get("/ops/")
    cache.delete(operations.WORKERS_CACHE_KEY)
