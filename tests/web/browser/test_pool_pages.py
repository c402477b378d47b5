"""A university group's member opens its private pool's page: its quotas, what it uses and
borrows, and why its waiting order waits."""

import re

import pytest

from ibex.accounts.models import Organization
from pool.models import Node, Pool
from tests.factories import make_org
from tests.market.inventory import provider_with_nodes
from tests.scheduler.pools.builders import admit, order, queue, run
from tests.web.conftest import PASSWORD, person

pytestmark = pytest.mark.django_db(transaction=True)


def expect(locator):
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def _university() -> tuple[Pool, Organization]:
    """A 64-GPU pool: physics (astro, hep) and biology under `university`, and CS training."""
    owner = provider_with_nodes(slug="uni-hpc", nodes=8, fabric="uni-h100")
    Node.objects.filter(provider=owner).update(state="active")
    pool = Pool.objects.create(name="state-university", owner=make_org("uni-it", "operator"))
    pool.nodes.set(Node.objects.filter(provider=owner))
    physics = Organization.objects.create(slug="uni-physics", name="Physics Department",
                                          is_tenant=True)
    biology, cs = make_org("uni-biology", "tenant"), make_org("uni-cs", "tenant")
    queue(pool, "university", org=make_org("gamma-uni", "tenant"))
    queue(pool, "physics", org=physics, parent="university")
    queue(pool, "physics-astro", org=physics, nominal=16, borrowing_limit=16,
          parent="physics")
    queue(pool, "physics-hep", org=physics, nominal=16, lending_limit=8, parent="physics")
    queue(pool, "biology", org=biology, nominal=16, borrowing_limit=8, parent="university")
    queue(pool, "cs-training", org=cs, nominal=16, parent="university")
    run(physics, pool, 8, 8, 8, queue_name="physics-astro")  # 24: borrows 8
    run(physics, pool, 8, queue_name="physics-hep")
    run(biology, pool, 16)
    return pool, physics


def test_a_university_member_sees_its_quota_and_why_its_order_waits(page, screenshot):
    pool, physics = _university()
    waiting = order(physics, pool, 16, queue_name="physics-astro", priority=5)
    admit(pool)
    waiting.refresh_from_db()
    assert waiting.state == "queued" and waiting.reason
    person("pia", physics)
    page.goto("/login/")
    page.get_by_label("Username").fill("pia")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()

    page.get_by_role("link", name="Pools").click()
    page.get_by_role("link", name="state-university").click()

    expect(page).to_have_url(re.compile("/app/pools/state-university/$"))
    astro = page.locator('tr[data-queue="physics-astro"]')
    expect(astro.locator("td.used")).to_have_text(re.compile(r"^\s*24"))
    expect(astro.locator("td.borrowed")).to_have_text("8")
    row = page.locator(f'#waiting tr[data-order="{waiting.pk}"]')
    expect(row.locator("td.reason")).to_have_text(waiting.reason)
    expect(row.locator("td.position")).to_have_text(str(waiting.queue_position))
    expect(page.locator("#pool-leases tbody tr")).to_have_count(4)
    expect(page.locator('tr[data-queue="biology"]')).to_have_count(0)
    screenshot(page, "quotas", full_page=True)


def test_an_operator_sees_the_whole_pools_tree_and_every_waiting_order(page, screenshot):
    from datetime import timedelta

    from django.utils import timezone

    from pool import quotas
    from pool.models import TidalRun, TidalStep

    pool, physics = _university()
    waiting = order(physics, pool, 16, queue_name="physics-astro", priority=5)
    admit(pool)
    quotas.define_priority_class(pool=pool, name="urgent", value=500)
    step = TidalStep.objects.create(pool=pool, name="night-training", daily_at="19:00",
                                    nominals={"cs-training": {"H100-80GB": 32}})
    now = timezone.now()
    TidalRun.objects.create(step=step, due_at=now - timedelta(hours=1), started_at=now,
                            in_force_at=now + timedelta(seconds=37.2), leases_preempted=2,
                            gpus_to_give_way=16)
    person("olga", make_org("ibex-ops", "operator"))
    page.goto("/login/")
    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()

    page.goto("/app/pools/state-university/")

    expect(page.locator('#quota-tree tr[data-node="biology"] td.used')).to_have_text("16")
    expect(page.locator(f'#waiting tr[data-order="{waiting.pk}"]')).to_contain_text(
        "Physics Department")
    expect(page.locator('table.tidal-runs[data-step="night-training"]')).to_contain_text("37.2")
    screenshot(page, "quotas-operator", full_page=True)
