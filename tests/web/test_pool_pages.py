"""The private-pool pages: an organisation sees its quotas, usage, waiting orders (position
and reason) and leases, and orders in quota; operators see the whole pool."""

import re

from market.models import Order
from pool.models import TidalRun, TidalStep
from tests.scheduler.pools.builders import admit, order, run
from tests.web.conftest import person


def test_a_member_sees_its_quotas_and_not_the_other_queues(pool_member_web, campus_pool):
    page = pool_member_web.get("/app/pools/campus/").content.decode()

    assert 'data-queue="acme-train" data-model="H100-80GB"' in page
    assert 'data-queue="physics"' not in page
    assert 'id="quota-tree"' not in page and "Tidal schedule" not in page
    assert 'href="/app/pools/"' in page  # the nav link


def test_the_pools_list_shows_the_members_pools_and_queues(pool_member_web, campus_pool):
    page = pool_member_web.get("/app/pools/").content.decode()

    assert 'data-pool="campus"' in page and "<code>acme-train</code>" in page


def test_a_member_sees_usage_borrowing_and_a_waiting_orders_reason(pool_member_web, tenant,
                                                                  campus_pool):
    run(tenant, campus_pool, 8, 4)  # 12 of its 8 nominal: borrows 4 of physics's idle 8
    waiting = order(tenant, campus_pool, 8)
    admit(campus_pool)
    waiting.refresh_from_db()
    assert waiting.state == "queued"

    page = pool_member_web.get("/app/pools/campus/live/").content.decode()

    row = re.search(r'<tr data-queue="acme-train".*?</tr>', page, re.S).group(0)
    assert re.findall(r'<td class="num used">(\d+)', row) == ["12"]
    assert re.search(r'<td class="num borrowed">4</td>', row)
    waiting_row = re.search(rf'<tr data-order="{waiting.pk}">.*?</tr>', page, re.S).group(0)
    assert f'<td class="num position">{waiting.queue_position}</td>' in waiting_row
    assert waiting.reason and waiting.reason in waiting_row.replace("&#x27;", "'")
    assert page.count("<tr data-lease=") == 2


def test_a_member_queues_an_order_from_the_form(pool_member_web, campus_pool):
    response = pool_member_web.post("/app/pools/campus/", {
        "idempotency_key": "web-1", "pool": "campus", "queue": "acme-train",
        "gpu_model": "H100-80GB", "gpus": 4, "hours": 2, "priority": 7})

    assert response.status_code == 302
    placed = Order.objects.get(idempotency_key="web-1")
    assert (placed.state, placed.quota_node.name, placed.priority, placed.max_price_micros) == (
        "queued", "acme-train", 7, 0)
    assert f"Order {placed.pk} queued" in pool_member_web.get(response.url).content.decode()


def test_the_order_form_shows_the_services_error_next_to_the_field(pool_member_web,
                                                                   campus_pool):
    response = pool_member_web.post("/app/pools/campus/", {
        "pool": "campus", "queue": "acme-train", "gpu_model": "H100-80GB", "gpus": 64,
        "hours": 2, "priority": 0})

    assert response.status_code == 400
    page = response.content.decode()
    assert re.search(r'id="id_gpus_error">pool campus has 16 H100-80GB GPUs<', page)
    assert not Order.objects.exists()


def test_a_priority_out_of_range_is_refused_on_its_field(pool_member_web, campus_pool):
    response = pool_member_web.post("/app/pools/campus/", {
        "pool": "campus", "queue": "acme-train", "gpu_model": "H100-80GB", "gpus": 1,
        "hours": 2, "priority": 5000})

    assert response.status_code == 400
    assert 'id="id_priority_error"' in response.content.decode()


def test_an_organisation_without_quota_sees_no_pool(client, db, campus_pool):
    from tests.factories import make_org

    client.force_login(person("nina", make_org("nobody-inc", "tenant")))

    assert client.get("/app/pools/campus/").status_code == 404
    assert 'data-pool="campus"' not in client.get("/app/pools/").content.decode()
    assert client.post("/app/pools/campus/", {}).status_code == 404


def test_an_operator_sees_the_tree_every_waiting_order_and_the_tidal_runs(
        pool_operator_web, tenant, campus_pool):
    from datetime import timedelta

    from django.utils import timezone

    run(tenant, campus_pool, 8, 8)
    waiting = order(tenant, campus_pool, 8)
    admit(campus_pool)
    now = timezone.now()
    TidalRun.objects.create(step=TidalStep.objects.get(name="night"), due_at=now,
                            started_at=now, in_force_at=now + timedelta(seconds=42.5),
                            leases_preempted=1, gpus_to_give_way=4)

    page = pool_operator_web.get("/app/pools/campus/").content.decode()

    assert 'id="quota-tree"' in page and "Cohort <code>uni</code>" in page
    assert 'data-node="physics" data-model="H100-80GB"' in page
    assert f'<tr data-order="{waiting.pk}">' in page and "Acme AI" in page
    runs = re.search(r'<table class="tidal-runs" data-step="night">.*?</table>', page, re.S)
    assert ">42.5<" in runs.group(0)
    assert 'id="order-title"' not in page  # the operator holds no quota here


def test_a_member_orders_with_one_of_the_pools_priority_classes(pool_member_web, campus_pool):
    from pool import quotas

    quotas.define_priority_class(pool=campus_pool, name="urgent", value=500)
    assert '<option value="urgent">urgent (500)</option>' in pool_member_web.get(
        "/app/pools/campus/").content.decode()

    pool_member_web.post("/app/pools/campus/", {
        "idempotency_key": "web-2", "pool": "campus", "queue": "acme-train",
        "gpu_model": "H100-80GB", "gpus": 4, "hours": 2, "priority": 0,
        "priority_class": "urgent"})

    placed = Order.objects.get(idempotency_key="web-2")
    assert (placed.priority, placed.priority_class.name) == (500, "urgent")


def test_a_member_cancels_its_waiting_order_through_htmx(pool_member_web, tenant, campus_pool):
    run(tenant, campus_pool, 8, 8)
    waiting = order(tenant, campus_pool, 8)
    admit(campus_pool)

    response = pool_member_web.post(f"/app/pools/campus/orders/{waiting.pk}/cancel/",
                                    HTTP_HX_REQUEST="true")

    waiting.refresh_from_db()
    assert waiting.state == "cancelled"
    page = response.content.decode()
    assert f"Order {waiting.pk} cancelled." in page and "No orders waiting." in page


def test_another_organisations_waiting_order_cannot_be_cancelled(pool_member_web,
                                                                 campus_pool):
    from ibex.accounts.models import Organization

    physics = Organization.objects.get(slug="physics-lab")
    waiting = order(physics, campus_pool, 8, queue_name="physics")
    admit(campus_pool)

    answer = pool_member_web.post(f"/app/pools/campus/orders/{waiting.pk}/cancel/")

    assert answer.status_code == 404
    waiting.refresh_from_db()
    assert waiting.state != "cancelled"
