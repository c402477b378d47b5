"""A tenant opens a lease from the dashboard, extends and terminates it; tops up by card."""

import re

import pytest

from billing import services as money
from billing.models import TopUp
from ibex.accounts.models import Organization
from market.models import Lease
from market.orders import OrderRequest, place_order
from tests.web.browser.market_data import lively_market
from tests.web.conftest import PASSWORD, person

pytestmark = pytest.mark.django_db(transaction=True)


def expect(locator):
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def _tenant_logged_in(page) -> Organization:
    tenant = Organization.objects.create(slug="acme-ai", name="Acme AI", is_tenant=True)
    money.grant_credit(organization=tenant, amount_micros=5_000 * 1_000_000,
                       reason="welcome credit", actor="test")
    person("tess", tenant)
    page.goto("/login/")
    page.get_by_label("Username").fill("tess")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile("/app/$"))
    return tenant


def test_a_tenant_opens_a_lease_extends_it_and_terminates_it(page, screenshot):
    lively_market()
    tenant = _tenant_logged_in(page)
    place_order(tenant=tenant, actor="tess", request=OrderRequest(
        gpu_models=["H100-80GB"], gpus=16, hours=4, tier="on_demand",
        max_price_micros=2_500_000, topology={"required": "leaf"}))
    lease = Lease.objects.get(tenant=tenant)
    page.reload()

    page.locator(f'tr[data-lease="{lease.pk}"]').get_by_role("link").click()

    expect(page).to_have_url(re.compile(f"/app/leases/{lease.pk}/$"))
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Lease #{lease.pk}")
    expect(page.locator("#events tbody tr").first).to_be_visible()
    page.get_by_label("Extend by (hours)").fill("2")
    page.evaluate("htmx.ajax('GET', location.pathname, {target: '#lease', swap: 'innerHTML'})"
                  ".then(() => document.body.dataset.refreshed = 'yes')")  # as the 5 s poll
    expect(page.locator("body[data-refreshed=yes]")).to_have_count(1)
    expect(page.get_by_label("Extend by (hours)")).to_have_value("2")  # kept by hx-preserve
    page.get_by_role("button", name="Extend").click()  # htmx swaps the lease
    expect(page.get_by_role("status").filter(has_text="extended by 2 h")).to_be_visible()
    expect(page.locator("#events")).to_contain_text("extended by 2 h")
    screenshot(page, "lease-detail", full_page=True)

    page.once("dialog", lambda dialog: dialog.accept())  # "End lease N now?"
    page.get_by_role("button", name="Terminate lease").click()

    expect(page.get_by_role("status").filter(has_text="terminated.")).to_be_visible()
    expect(page.locator("#lease-facts").locator("xpath=..").locator(".badge")).to_have_text(
        "terminated")
    expect(page.get_by_role("button", name="Terminate lease")).to_have_count(0)
    lease.refresh_from_db()
    assert lease.state == "terminated"


def _training_output(rank: int, steps: range) -> list[str]:
    return [f"[rank {rank}] step {step:>4}/1000  loss {2.31 / (1 + step / 40):.4f}  "
            f"{412 + rank * 3 + step % 7} samples/s" for step in steps]


def test_a_tenant_watches_a_two_node_workload_and_tails_each_ranks_output(page, screenshot):
    from django.utils import timezone

    from market import leasing
    from market.models import Allocation
    from pool import services as pool_services
    from pool import workloads
    from pool.models import Binding, Node

    lively_market()
    tenant = _tenant_logged_in(page)
    place_order(tenant=tenant, actor="tess", request=OrderRequest(
        gpu_models=["H100-80GB"], gpus=16, hours=4, tier="on_demand",
        max_price_micros=2_500_000, topology={"required": "leaf"}))
    lease = Lease.objects.get(tenant=tenant)
    work = {"command": ["torchrun", "--nnodes=2", "--nproc-per-node=8", "train.py",
                        "--config", "configs/llama-8b.yaml"],
            "env": {"WANDB_MODE": "offline"}, "workdir": "runs/llama-8b"}
    keys = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBSZbW8fOUQdfAixS8gJLuMnG2I1xyGx0c1ld0VHzvFw"
            " tess@acme"]
    Lease.objects.filter(pk=lease.pk).update(workload=work, ssh_keys=keys)
    for state, reason in (("placing", "bound to its nodes"), ("active", "every node serves it")):
        lease = leasing.change_lease_state(lease=lease, to_state=state, actor="scheduler",
                                           reason=reason)
    wanted: dict[int, list[int]] = {}
    for node_id, index in Allocation.objects.filter(lease=lease).values_list(
            "gpu__node_id", "gpu__index"):
        wanted.setdefault(node_id, []).append(index)
    pool_services.set_lease_bindings(wanted={lease.reference: wanted},
                                     launches={lease.reference: {**work, "ssh_keys": keys}})
    ranks = list(Binding.objects.filter(lease_ref=lease.reference).select_related("node")
                 .order_by("node_rank"))
    started = timezone.now()
    for rank in ranks:
        Binding.objects.filter(pk=rank.pk).update(workload_state="running", started_at=started)
        Node.objects.filter(pk=rank.node_id).update(
            runtime="ssh", address=f"10.8.0.{11 + rank.node_rank}", ssh_port=2222)
        workloads.append_log(node=rank.node, lease_ref=lease.reference,
                             generation=rank.generation, from_line=0,
                             lines=_training_output(rank.node_rank, range(0, 240, 10)))

    page.goto(f"/app/leases/{lease.pk}/")

    expect(page.locator("#workload .badge").first).to_have_text("running")
    expect(page.locator("#ranks tbody tr")).to_have_count(2)
    expect(page.locator("#access code.copyable").first).to_have_text(
        re.compile(r"^ssh -p 2222 \S+@10\.8\.0\.11$"))
    expect(page.locator("#log")).to_contain_text("[rank 0] step  230/1000")
    # the agent ships more lines: the tail (polling every 2 s) appends them
    workloads.append_log(node=ranks[0].node, lease_ref=lease.reference,
                         generation=ranks[0].generation, from_line=24,
                         lines=_training_output(0, range(240, 300, 10)))
    expect(page.locator("#log")).to_contain_text("[rank 0] step  290/1000", timeout=10_000)
    expect(page.locator("#log")).not_to_contain_text("[rank 0] step  240/1000[rank 0]")
    screenshot(page, "lease-workload", full_page=True)
    workloads.append_log(node=ranks[0].node, lease_ref=lease.reference,
                         generation=ranks[0].generation, from_line=30, lines=["<b>not bold</b>"])
    expect(page.locator("#log")).to_contain_text("<b>not bold</b>", timeout=10_000)  # not run
    expect(page.locator("#log b")).to_have_count(0)

    page.locator(".rank-tabs").get_by_role("link", name=re.compile("Rank 1")).click()

    expect(page.locator("#log")).to_contain_text("[rank 1] step  230/1000")
    expect(page.locator("#log")).not_to_contain_text("[rank 0]")
    expect(page.locator(".rank-tabs [aria-current=true]")).to_contain_text("Rank 1")


def test_a_tenant_tops_up_and_the_page_waits_for_the_payment(page, screenshot, settings):
    settings.STRIPE_API_KEY = "sk_test_ibex"  # this exchange takes cards
    tenant = _tenant_logged_in(page)
    page.get_by_role("link", name="Account").click()
    expect(page.locator("#balance-available")).to_have_text("$5,000.00")

    page.get_by_label("Amount (USD)").fill("250")
    page.get_by_role("button", name="Start top-up").click()

    top_up = TopUp.objects.get(tenant=tenant)
    if not top_up.payment_intent_id:
        # A Celery worker of another test of this session may already have asked the fake
        # Stripe; if not, do what the task does.
        money.record_payment_intent(top_up=top_up, payment_intent_id="pi_3Demo0000000001",
                                    client_secret="pi_3Demo0000000001_secret_x")
    top_up.refresh_from_db()
    expect(page.locator("#top-up")).to_contain_text("ready to confirm the card")  # polled
    expect(page.locator("#top-up")).to_contain_text(top_up.payment_intent_id)
    screenshot(page, "account", full_page=True)


def test_a_tenant_pays_by_card_and_the_balance_rises(page, screenshot, celery_worker_process,
                                                     stripe_in_the_browser):
    tenant = _tenant_logged_in(page)
    page.get_by_role("link", name="Account").click()
    page.get_by_label("Amount (USD)").fill("250")
    page.get_by_role("button", name="Start top-up").click()

    # a real worker asks (the fake) Stripe for the PaymentIntent; the page then mounts the card
    expect(page.get_by_label("Card number")).to_be_visible(timeout=30_000)
    page.reload()  # a page that loads with the card form mounts it too
    expect(page.get_by_label("Card number")).to_have_count(1)
    page.get_by_label("Card number").fill("4242 4242 4242 4242")
    page.get_by_label("Expiry date (MM / YY)").fill("12 / 34")
    page.get_by_label("Security code (CVC)").fill("123")
    screenshot(page, "top-up-card")
    page.get_by_role("button", name="Pay $250.00").click()

    # Stripe's webhook credits the balance; the page polls until it has
    expect(page.locator("#top-up")).to_contain_text("paid", timeout=30_000)
    expect(page.locator("#balance-available")).to_have_text("$5,250.00")
    top_up = TopUp.objects.get(tenant=tenant)
    assert top_up.state == "succeeded"
    (confirm,) = stripe_in_the_browser.calls("POST", f"/v1/payment_intents/{top_up.payment_intent_id}/confirm")
    assert confirm["params"]["client_secret"] == top_up.client_secret


def test_a_declined_card_says_so_and_adds_nothing(page, celery_worker_process,
                                                   stripe_in_the_browser):
    tenant = _tenant_logged_in(page)
    page.get_by_role("link", name="Account").click()
    page.get_by_label("Amount (USD)").fill("80")
    page.get_by_role("button", name="Start top-up").click()
    expect(page.get_by_label("Card number")).to_be_visible(timeout=30_000)

    page.get_by_label("Card number").fill("4000 0000 0000 0002")
    page.get_by_role("button", name="Pay $80.00").click()

    expect(page.locator("#card-errors")).to_contain_text("Your card has insufficient funds.")
    expect(page.get_by_role("button", name="Pay $80.00")).to_be_enabled()
    assert money.balances_of(tenant).available_micros == 5_000 * 1_000_000
