"""The lease page shows what the lease's nodes run: the command, each rank's state, the SSH
line per node, and a live tail of each rank's output (an htmx fragment after a cursor)."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from market.models import Allocation, Lease
from pool import services as pool_services
from pool import workloads
from pool.models import Binding, Node
from tests.web.conftest import person
from tests.web.test_dashboard import ORDER

TWO_NODES = {**ORDER, "gpus": "16", "level": "leaf", "idempotency_key": "k-two-nodes"}
WORK = {"command": ["torchrun", "--nproc-per-node=8", "train.py", "--note", "it's <fine>"],
        "env": {"EPOCHS": "3"}, "workdir": "runs"}
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBSZbW8fOUQdfAixS8gJLuMnG2I1xyGx0c1ld0VHzvFw tess@acme"


def _lease(tenant_web, tenant, order=TWO_NODES) -> Lease:
    tenant_web.post("/app/", order)
    return Lease.objects.get(tenant=tenant)


def _run(lease: Lease, work: dict | None = WORK, keys=(KEY,)) -> list[Binding]:
    """Give the lease a workload (and keys) and launch it on its nodes, as placing does."""
    Lease.objects.filter(pk=lease.pk).update(workload=work, ssh_keys=list(keys))
    lease.refresh_from_db()
    wanted: dict[int, list[int]] = {}
    for node_id, index in Allocation.objects.filter(lease=lease).values_list(
            "gpu__node_id", "gpu__index"):
        wanted.setdefault(node_id, []).append(index)
    pool_services.set_lease_bindings(
        wanted={lease.reference: wanted},
        launches={lease.reference: {**(work or {"command": None, "env": {}, "workdir": ""}),
                                    "ssh_keys": list(keys)}})
    return list(Binding.objects.filter(lease_ref=lease.reference).select_related("node")
                .order_by("node_rank"))


def _ssh(node: Node, port=2222) -> None:
    Node.objects.filter(pk=node.pk).update(runtime="ssh", address=f"{node.hostname}.example",
                                           ssh_port=port)


def _log(binding: Binding, lines, from_line=0) -> None:
    workloads.append_log(node=binding.node, lease_ref=binding.lease_ref,
                         generation=binding.generation, from_line=from_line, lines=list(lines))


@pytest.fixture
def running(tenant_web, tenant, provider):
    """A 2-node lease running WORK: rank 0 runs, rank 1 exited 3; rank 0's node offers SSH."""
    lease = _lease(tenant_web, tenant)
    rank0, rank1 = _run(lease)
    started = timezone.now() - timedelta(minutes=5)
    Binding.objects.filter(pk=rank0.pk).update(workload_state="running", started_at=started,
                                               master_port=29500)
    Binding.objects.filter(pk=rank1.pk).update(workload_state="failed", exit_code=3,
                                               started_at=started, ended_at=timezone.now())
    _ssh(rank0.node)
    return lease, rank0, rank1


def test_the_lease_page_shows_the_command_each_ranks_state_and_the_ssh_lines(tenant_web,
                                                                            running):
    lease, rank0, rank1 = running

    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()

    assert 'id="workload"' in page
    # the argv as one shell line, escaped for HTML
    assert ("torchrun --nproc-per-node=8 train.py --note &#x27;it&#x27;&quot;&#x27;&quot;"
            "&#x27;s &lt;fine&gt;&#x27;") in page
    assert "EPOCHS=3" in page and "<code>runs</code>" in page
    ranks = dict(re.findall(r'<tr data-rank="(\d)">(.*?)</tr>', page, re.S))
    assert set(ranks) == {"0", "1"}
    assert rank0.node.hostname in ranks["0"] and ">running<" in ranks["0"]
    assert rank1.node.hostname in ranks["1"] and ">failed<" in ranks["1"]
    assert '<td class="num">3</td>' in ranks["1"]  # its exit code
    assert ">failed<" in page.split('id="workload-title"')[1].split("</div>")[0]  # the lease's
    assert 'id="access"' in page
    line = workloads.access_view(workloads.bindings_by_lease([lease.reference])[lease.reference],
                                 lease.reference, True)
    ssh = next(a["ssh"] for a in line if a["node"] == rank0.node.hostname)
    assert ssh.startswith("ssh -p 2222 ") and ssh.endswith(f"@{rank0.node.hostname}.example")
    assert f'<code class="copyable">{ssh}</code>' in page
    assert "This node offers no SSH." in page  # rank 1's node runs commands without SSH


def test_the_page_refresh_keeps_the_workload_and_the_output_tail_is_outside_it(tenant_web,
                                                                              running):
    lease, rank0, _ = running

    fragment = tenant_web.get(f"/app/leases/{lease.pk}/", HTTP_HX_REQUEST="true")
    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()

    assert 'id="ranks"' in fragment.content.decode() and 'id="output"' not in \
        fragment.content.decode()  # the 5 s refresh would restart the tail
    assert 'id="output"' in page and 'id="lease-log"' in page
    assert page.index('id="output"') > page.index('id="lease"')
    assert f'hx-get="/app/leases/{lease.pk}/log/?node_rank=1"' in page  # the rank tabs


def test_the_tail_returns_the_lines_after_the_cursor_escaped(tenant_web, running):
    lease, rank0, _ = running
    _log(rank0, ["epoch 1", "<script>alert('pwned')</script>"])
    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()
    first = re.search(r'<pre class="log" id="log"[^>]*>(.*?)</pre>', page, re.S).group(1)
    assert first.startswith("epoch 1\n&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;\n")
    assert "<script>alert" not in page
    cursor = re.search(r'since=([^"&]+)"', first).group(1)
    assert 'hx-trigger="every 2s"' in first

    _log(rank0, ["epoch 2", "done & dusted"], from_line=2)
    response = tenant_web.get(f"/app/leases/{lease.pk}/log/",
                              {"node_rank": "0", "since": cursor}, HTTP_HX_REQUEST="true")

    tail = response.content.decode()
    assert response.status_code == 200
    assert tail.startswith("epoch 2\ndone &amp; dusted\n<span class=\"log-tail\"")
    assert "epoch 1" not in tail
    assert re.search(r'since=([^"&]+)"', tail).group(1) != cursor


def test_the_tail_says_how_many_lines_were_dropped(tenant_web, running):
    lease, rank0, _ = running
    _log(rank0, ["a"])
    _log(rank0, ["f"], from_line=5)  # 4 lines the agent lost

    tail = tenant_web.get(f"/app/leases/{lease.pk}/log/", {"node_rank": "0", "since": ""})

    assert "[4 earlier lines were dropped]" in tail.content.decode()


def test_the_rank_tabs_show_each_ranks_output(tenant_web, running):
    lease, rank0, rank1 = running
    _log(rank0, ["from rank zero"])
    _log(rank1, ["from rank one"])

    panel = tenant_web.get(f"/app/leases/{lease.pk}/log/", {"node_rank": "1"},
                           HTTP_HX_REQUEST="true").content.decode()
    page = tenant_web.get(f"/app/leases/{lease.pk}/", {"rank": "1"}).content.decode()

    for html in (panel, page):
        assert "from rank one" in html and "from rank zero" not in html
        assert re.search(r'aria-current="true">Rank 1 ', html)


def test_the_tail_stops_once_the_lease_ended_and_no_lines_are_left(tenant_web, running):
    lease, rank0, _ = running
    _log(rank0, ["last words"])
    tenant_web.post(f"/app/leases/{lease.pk}/terminate/", {"next": "lease"})

    first = tenant_web.get(f"/app/leases/{lease.pk}/log/",
                           {"node_rank": "0", "since": ""}).content.decode()
    cursor = re.search(r'since=([^"&]+)"', first).group(1)  # one more look for late lines
    last = tenant_web.get(f"/app/leases/{lease.pk}/log/",
                          {"node_rank": "0", "since": cursor}).content.decode()

    assert "last words" in first
    assert last == ""  # no lines, no further poll


def test_a_bad_cursor_or_rank_is_a_404(tenant_web, running):
    lease, _, _ = running
    url = f"/app/leases/{lease.pk}/log/"

    assert tenant_web.get(url, {"node_rank": "0", "since": "nonsense"}).status_code == 404
    assert tenant_web.get(url, {"node_rank": "7", "since": ""}).status_code == 404
    assert tenant_web.get(url, {"node_rank": "-1"}).status_code == 404


def test_another_tenants_lease_log_is_not_found(client, running):
    from ibex.accounts import services as accounts

    lease, rank0, _ = running
    _log(rank0, ["secret sauce"])
    rival = accounts.create_organization(slug="rival-labs", roles=("tenant",))
    client.force_login(person("rita-rival", rival))

    assert client.get(f"/app/leases/{lease.pk}/log/", {"node_rank": "0"}).status_code == 404
    assert client.get(f"/app/leases/{lease.pk}/log/",
                      {"node_rank": "0", "since": ""}).status_code == 404


def test_a_lease_that_runs_nothing_shows_no_workload_access_or_output(tenant_web, tenant,
                                                                      provider):
    lease = _lease(tenant_web, tenant)

    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()

    assert 'id="workload"' not in page and 'id="access"' not in page
    assert 'id="output"' not in page and 'id="runs-nothing"' in page
    assert tenant_web.get(f"/app/leases/{lease.pk}/log/").status_code == 404


def test_a_lease_with_keys_only_shows_its_ssh_lines_but_no_workload(tenant_web, tenant,
                                                                    provider):
    lease = _lease(tenant_web, tenant)
    bindings = _run(lease, work=None)
    for binding in bindings:
        _ssh(binding.node, port=2200)

    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()

    assert 'id="workload"' not in page and 'id="output"' not in page
    assert page.count('<code class="copyable">ssh -p 2200 ') == 2


def test_a_workload_not_started_yet_waits_for_its_ranks(tenant_web, tenant, provider):
    lease = _lease(tenant_web, tenant)
    Lease.objects.filter(pk=lease.pk).update(workload=WORK)  # not bound to its nodes yet

    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()

    assert 'id="workload"' in page and "once the lease is on its nodes" in page
    assert 'id="log-waiting"' in page
    assert f'hx-get="/app/leases/{lease.pk}/log/?node_rank=0" hx-trigger="every 2s"' in page


def test_a_lease_on_a_slurm_cluster_shows_the_srun_for_its_reservation(tenant_web, tenant,
                                                                       provider):
    lease = _lease(tenant_web, tenant)
    Lease.objects.filter(pk=lease.pk).update(slurm_account="physics")
    bindings = _run(lease, work=None, keys=())
    Node.objects.filter(pk__in=[b.node_id for b in bindings]).update(runtime="slurm")

    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()

    assert f"srun --reservation=ibex-lease-{lease.pk} -A physics" in page
    hosts = sorted(b.node.hostname for b in bindings)
    assert f"run on {hosts[0]}, {hosts[1]} and nowhere else" in page
