"""`ibex-agent slurm` in front of a real Slurm cluster (slurmctld and four slurmds on this host,
two leaves of two nodes), with the real API over HTTP and a real Celery worker placing leases.

The gateway imports the cluster, reports its nodes, and holds every lease as a Slurm
reservation `ibex-lease-<id>` on exactly the lease's nodes; these tests read Slurm itself to
check it, and run jobs with `srun --reservation`."""

import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta

import pytest
import requests
from django.utils import timezone

from billing import services as money
from fabric.models import Fabric
from ibex.accounts import services as accounts
from market import leasing, prices
from market.auctions import end_preempted_leases
from market.models import Lease
from pool import services as pool
from pool.models import Gpu, Node
from scheduler.moves.remediation import remediate_leases
from tests.agent.slurm.cluster import _program
from tests.factories import make_org

DEADLINE_S = 60
NODES = ("n001", "n002", "n003", "n004")
LEAVES = ({"n001", "n002"}, {"n003", "n004"})


def wait_for(check, what: str, last=lambda: ""):
    deadline = time.monotonic() + DEADLINE_S
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} {last()}")
        time.sleep(0.2)
    return result


class Campus:
    """A provider running `ibex-agent slurm` for its cluster, and a funded tenant's session."""

    def __init__(self, live_server, cluster, tmp_path):
        self.cluster, self.tmp_path = cluster, tmp_path
        self.provider = make_org("campus-hpc", "provider")
        accounts.change_provider_state(organization=self.provider, to_state="verified",
                                       actor="test", reason="audit")
        pool.ensure_gpu_catalogue()
        self.key = accounts.issue_api_key(organization=self.provider,
                                          scopes=["read", "provide"]).raw_key
        tenant = accounts.create_organization(slug="physics-lab", roles=("tenant",))
        money.grant_credit(organization=tenant, amount_micros=500_000_000, reason="t", actor="t")
        self.url = live_server.url
        self.api = requests.Session()
        self.api.headers["Authorization"] = "Bearer " + accounts.issue_api_key(
            organization=tenant, scopes=["read", "trade"]).raw_key
        self.gateway: subprocess.Popen | None = None
        self.runs = 0

    def start_gateway(self) -> None:
        self.runs += 1
        self.log = self.tmp_path / f"gateway-{self.runs}.log"
        with open(self.log, "wb") as out:
            self.gateway = subprocess.Popen(
                [sys.executable, "-m", "agent", "slurm", "--api", self.url, "--key", self.key,
                 "--fabric", "campus", "--interval", "1"],
                env=self.cluster.env, stdout=out, stderr=subprocess.STDOUT)

    def kill_gateway(self) -> None:
        self.gateway.send_signal(signal.SIGKILL)
        self.gateway.wait(timeout=30)

    def gateway_log(self) -> str:
        return self.log.read_text()

    def __enter__(self) -> "Campus":
        self.start_gateway()
        wait_for(lambda: Node.objects.filter(fabric__name="campus", state="active",
                                             runtime="slurm").count() == len(NODES),
                 "the gateway to register and report the four nodes", self.gateway_log)
        prices.set_prices(provider=self.provider, scope={"fabric": "campus"},
                          price_micros=2_000_000, actor="test")
        return self

    def __exit__(self, *exc) -> None:
        if self.gateway.poll() is None:
            self.gateway.terminate()
            self.gateway.wait(timeout=30)
        for name in self.reservations():
            self.cluster.scontrol("delete", f"ReservationName={name}")
        for node, state in self.cluster.node_states().items():
            if "DRAIN" in state or "DOWN" in state:
                self.cluster.scontrol("update", f"NodeName={node}", "State=RESUME")

    # -- the tenant's side --------------------------------------------------------------------

    def order(self, gpus: int, **extra) -> dict:
        body = {"gpu_models": ["H100-80GB"], "gpus": gpus, "hours": 1, "tier": "on_demand",
                "max_price_per_gpu_hour": "2.00", "slurm_account": "physics", **extra}
        answer = self.api.post(f"{self.url}/api/v1/orders/", json=body, timeout=30)
        assert answer.status_code == 201, answer.text
        return answer.json()

    def lease(self, lease_id: int) -> dict:
        return self.api.get(f"{self.url}/api/v1/leases/{lease_id}/", timeout=30).json()

    def active(self, lease_id: int) -> dict:
        return wait_for(lambda: (lease := self.lease(lease_id))["state"] == "active" and lease,
                        f"lease {lease_id} to become active", self.gateway_log)

    # -- Slurm's side --------------------------------------------------------------------------

    def reservations(self) -> dict[str, dict[str, str]]:
        """ibex-lease-* reservation name -> its fields, as Slurm says."""
        found = {}
        for line in self.cluster.scontrol("-o", "show", "reservation").splitlines():
            fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
            if fields.get("ReservationName", "").startswith("ibex-lease-"):
                found[fields["ReservationName"]] = fields
        return found

    def reserved_nodes(self, lease_id: int) -> set[str]:
        fields = self.reservations().get(f"ibex-lease-{lease_id}")
        if fields is None:
            return set()
        return set(self.cluster.scontrol("show", "hostnames", fields["Nodes"]).split())

    def srun(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([_program("srun"), *args], env=self.cluster.env,
                              capture_output=True, text=True, timeout=60)


@pytest.fixture
def campus(slurm_cluster, live_server, celery_worker_process, tmp_path):
    with Campus(live_server, slurm_cluster, tmp_path) as campus:
        yield campus


@pytest.mark.django_db(transaction=True)
def test_the_gateway_imports_the_cluster_with_its_leaves_and_gpu_nodes(campus):
    fabric = Fabric.objects.get(name="campus")
    assert fabric.gateway == "slurm" and fabric.gateway_status == "ok"
    leaves = {}
    for node in Node.objects.filter(fabric=fabric).select_related("host", "gpu_model"):
        leaves.setdefault(node.host.leaf, set()).add(node.hostname)
        assert node.gpu_model.name == "H100-80GB" and node.gpus.count() == 8
        assert set(node.gpus.values_list("health", flat=True)) == {"ok"}
    assert sorted(leaves.values(), key=sorted) == list(LEAVES)


@pytest.mark.django_db(transaction=True)
def test_a_16_gpu_leaf_lease_is_a_reservation_on_two_nodes_of_one_leaf_and_jobs_run_only_there(
        campus):
    lease_id = campus.order(16, topology={"required": "leaf"})["lease"]
    campus.active(lease_id)
    nodes = campus.reserved_nodes(lease_id)
    assert nodes in LEAVES
    fields = campus.reservations()[f"ibex-lease-{lease_id}"]
    assert fields["Accounts"] == "physics"
    access = campus.lease(lease_id)["access"]
    assert {a["node"] for a in access} == nodes
    assert {a["slurm"] for a in access} == {f"srun --reservation=ibex-lease-{lease_id} -A physics"}
    job = campus.srun(f"--reservation=ibex-lease-{lease_id}", "-A", "physics", "-N", "2",
                      "--gres=gpu:8", "printenv", "SLURMD_NODENAME")
    assert job.returncode == 0, job.stderr
    assert set(job.stdout.split()) == nodes

    # terminated: the reservation is gone from Slurm
    answer = campus.api.post(f"{campus.url}/api/v1/leases/{lease_id}/terminate/", timeout=30)
    assert answer.status_code == 200, answer.text
    wait_for(lambda: f"ibex-lease-{lease_id}" not in campus.reservations(),
             "the reservation to be deleted", campus.gateway_log)


def slurm_end(fields: dict[str, str]) -> datetime:
    return datetime.strptime(fields["EndTime"], "%Y-%m-%dT%H:%M:%S").astimezone()


@pytest.mark.django_db(transaction=True)
def test_an_extended_lease_extends_its_reservation(campus):
    lease_id = campus.order(8)["lease"]
    lease = campus.active(lease_id)
    name = f"ibex-lease-{lease_id}"
    fields = wait_for(lambda: campus.reservations().get(name), "the reservation")
    ends_at = datetime.fromisoformat(lease["ends_at"].replace("Z", "+00:00"))
    assert abs(slurm_end(fields) - ends_at) < timedelta(seconds=1)
    answer = campus.api.post(f"{campus.url}/api/v1/leases/{lease_id}/extend/", {"hours": 2},
                             timeout=30)
    assert answer.status_code == 200, answer.text
    wait_for(lambda: abs(slurm_end(campus.reservations()[name]) - ends_at
                         - timedelta(hours=2)) < timedelta(seconds=1),
             "the reservation to end two hours later", campus.gateway_log)


@pytest.mark.django_db(transaction=True)
def test_a_preempted_leases_reservation_ends_with_its_notice_and_goes_when_it_ends(campus):
    lease_id = campus.order(8)["lease"]
    campus.active(lease_id)
    name = f"ibex-lease-{lease_id}"
    wait_for(lambda: campus.reservations().get(name), "the reservation")
    lease = leasing.give_notice(lease=Lease.objects.get(pk=lease_id), reason="outbid",
                                now=timezone.now(), actor="test")
    wait_for(lambda: abs(slurm_end(campus.reservations()[name]) - lease.preempt_at)
             < timedelta(seconds=1), "the reservation to end with the notice", campus.gateway_log)
    assert end_preempted_leases(now=lease.preempt_at) == [lease_id]
    wait_for(lambda: name not in campus.reservations(), "the reservation to be deleted",
             campus.gateway_log)


@pytest.mark.django_db(transaction=True)
def test_a_node_drained_in_slurm_moves_the_lease_and_its_reservation(campus):
    lease_id = campus.order(8)["lease"]
    campus.active(lease_id)
    (before,) = wait_for(lambda: campus.reserved_nodes(lease_id), "the reservation")
    campus.cluster.scontrol("update", f"NodeName={before}", "State=DRAIN", "Reason=fan failure")
    wait_for(lambda: Gpu.objects.filter(node__hostname=before, health="failed").count() == 8,
             "the drained node's GPUs to be failed in IBEX", campus.gateway_log)
    failed = Gpu.objects.filter(node__hostname=before).first()
    event = failed.node.health_events.filter(kind="gpu_health").order_by("-pk").first()
    assert "DRAIN" in event.detail and "fan failure" in event.detail
    assert remediate_leases() == {lease_id: "moved"}
    after = wait_for(lambda: (nodes := campus.reserved_nodes(lease_id)) != {before} and nodes,
                     "the reservation to move", campus.gateway_log)
    assert len(after) == 1 and before not in after
    assert Lease.objects.get(pk=lease_id).state == "active"


@pytest.mark.django_db(transaction=True)
def test_gpus_slurm_runs_jobs_on_outside_ibex_are_not_offered(campus):
    job = campus.cluster.sbatch("-w", "n004", "--gres=gpu:3", "--wrap", "sleep 300")
    try:
        wait_for(lambda: Gpu.objects.filter(node__hostname="n004", health="busy").count() == 3,
                 "three of n004's GPUs to be busy", campus.gateway_log)
        assert set(pool.offered_gpus().filter(node__hostname="n004")
                   .values_list("index", flat=True)).isdisjoint(
            set(Gpu.objects.filter(node__hostname="n004", health="busy")
                .values_list("index", flat=True)))
        assert Node.objects.get(hostname="n004").healthy_since is not None
    finally:
        subprocess.run([_program("scancel"), job], env=campus.cluster.env, check=True)
    wait_for(lambda: not Gpu.objects.filter(node__hostname="n004", health="busy").exists(),
             "n004's GPUs to be free again", campus.gateway_log)


@pytest.mark.django_db(transaction=True)
def test_a_reservation_slurm_refuses_places_the_lease_elsewhere_with_slurms_message(campus):
    # n001 is the cheapest, but Slurm has it reserved for someone else during the lease
    prices.set_prices(provider=campus.provider, scope={"node": "n001"}, price_micros=1_000_000,
                      actor="test")
    campus.cluster.scontrol("create", "reservation", "ReservationName=maint", "Nodes=n001",
                            "StartTime=now+10minutes", "Duration=60", "Users=root")
    try:
        lease_id = campus.order(8)["lease"]
        campus.active(lease_id)
        nodes = wait_for(lambda: campus.reserved_nodes(lease_id), "the reservation")
        assert len(nodes) == 1 and "n001" not in nodes
        history = [e["reason"] for e in campus.lease(lease_id)["events"]]
        assert any("Slurm refused its reservation" in reason and "overlaps" in reason
                   for reason in history), history
    finally:
        campus.cluster.scontrol("delete", "ReservationName=maint")


@pytest.mark.django_db(transaction=True)
def test_a_restarted_gateway_reconciles_the_reservations_with_the_leases(campus):
    kept = campus.order(8)["lease"]
    ended = campus.order(8)["lease"]
    campus.active(kept), campus.active(ended)
    wait_for(lambda: campus.reserved_nodes(kept) and campus.reserved_nodes(ended),
             "both reservations")
    campus.kill_gateway()
    # while it is down: one lease ends, and Slurm loses the other's reservation
    answer = campus.api.post(f"{campus.url}/api/v1/leases/{ended}/terminate/", timeout=30)
    assert answer.status_code == 200
    campus.cluster.scontrol("delete", f"ReservationName=ibex-lease-{kept}")
    campus.start_gateway()
    wait_for(lambda: campus.reserved_nodes(kept)
             and f"ibex-lease-{ended}" not in campus.reservations(),
             "the reservations to be reconciled", campus.gateway_log)
    log = campus.gateway_log()
    assert f"created ibex-lease-{kept}" in log and f"deleted ibex-lease-{ended}" in log
    assert Lease.objects.get(pk=kept).state == "active"


@pytest.mark.django_db(transaction=True)
def test_a_slurmctld_restart_fails_no_lease_and_marks_no_node_down(campus):
    lease_id = campus.order(16, topology={"required": "leaf"})["lease"]
    campus.active(lease_id)
    nodes = wait_for(lambda: campus.reserved_nodes(lease_id), "the reservation")
    campus.cluster.stop_controller()
    try:
        wait_for(lambda: Fabric.objects.get(name="campus").gateway_status.startswith(
            "slurm unreachable"), "the fabric to say Slurm is unreachable", campus.gateway_log)
        time.sleep(3)  # several reports while slurmctld is gone
        assert not Gpu.objects.filter(node__fabric__name="campus").exclude(health="ok").exists()
        assert not Node.objects.filter(fabric__name="campus", health="unreachable").exists()
    finally:
        campus.cluster.start_controller()
    wait_for(lambda: Fabric.objects.get(name="campus").gateway_status == "ok",
             "the fabric to be ok again", campus.gateway_log)
    assert campus.reserved_nodes(lease_id) == nodes
    assert remediate_leases() == {}
    assert Lease.objects.get(pk=lease_id).state == "active"
