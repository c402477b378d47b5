import pytest
from django.utils import timezone

from market import leasing
from market.models import Allocation, Lease, LeaseEvent
from tests.factories import make_org
from tests.market.inventory import gpus_of, provider_with_nodes
from tests.market.test_leases import lease_on


def active(lease: Lease) -> Lease:
    for state in ("placing", "active"):
        lease = leasing.change_lease_state(lease=lease, to_state=state, actor="t", reason="t")
    return lease


def held(lease) -> set[int]:
    return set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
               .values_list("gpu_id", flat=True))


def test_many_leases_move_at_once_keeping_their_history(db):
    gpus = gpus_of(provider_with_nodes())
    tenant = make_org("acme-ai", "tenant")
    first, second = active(lease_on(tenant, gpus[0:2])), active(lease_on(tenant, gpus[2:4]))

    leasing.move_many(moves=[
        leasing.PlannedMove(lease=first, away_from=[gpus[0].pk],
                            onto=[leasing.GpuChoice(gpus[8].pk, 2_000_000)], reason="test"),
        leasing.PlannedMove(lease=second, away_from=[gpus[2].pk, gpus[3].pk],
                            onto=[leasing.GpuChoice(gpus[9].pk, 2_000_000),
                                  leasing.GpuChoice(gpus[10].pk, 2_000_000)], reason="test")])

    assert held(first) == {gpus[1].pk, gpus[8].pk}
    assert held(second) == {gpus[9].pk, gpus[10].pk}
    cut = Allocation.objects.get(lease=first, gpu=gpus[0])
    assert cut.period.upper is not None and cut.period.upper <= timezone.now()  # kept, ended
    assert LeaseEvent.objects.filter(kind="moved").count() == 2


def test_one_taken_target_moves_nothing(db):
    gpus = gpus_of(provider_with_nodes())
    tenant = make_org("acme-ai", "tenant")
    first, second = active(lease_on(tenant, gpus[0:1])), active(lease_on(tenant, gpus[1:2]))
    lease_on(make_org("rival-ai", "tenant"), gpus[9:10])  # holds the second one's target

    with pytest.raises(leasing.GpusUnavailable):
        leasing.move_many(moves=[
            leasing.PlannedMove(lease=first, away_from=[gpus[0].pk],
                                onto=[leasing.GpuChoice(gpus[8].pk, 2_000_000)], reason="t"),
            leasing.PlannedMove(lease=second, away_from=[gpus[1].pk],
                                onto=[leasing.GpuChoice(gpus[9].pk, 2_000_000)], reason="t")])

    assert held(first) == {gpus[0].pk} and held(second) == {gpus[1].pk}
    assert not LeaseEvent.objects.filter(kind="moved").exists()


def test_a_lease_can_leave_a_gpu_it_came_back_to(db):
    gpus = gpus_of(provider_with_nodes())
    lease = active(lease_on(make_org("acme-ai", "tenant"), gpus[0:1]))

    def move(away, onto):
        leasing.move_many(moves=[leasing.PlannedMove(
            lease=lease, away_from=[away.pk], onto=[leasing.GpuChoice(onto.pk, 2_000_000)],
            reason="test")])

    move(gpus[0], gpus[1])
    move(gpus[1], gpus[0])
    first = Allocation.objects.filter(lease=lease, gpu=gpus[0]).order_by("id").first().period
    move(gpus[0], gpus[1])  # the first stay on gpus[0] is history: left as it was

    assert held(lease) == {gpus[1].pk}
    assert Allocation.objects.filter(lease=lease, gpu=gpus[0]).order_by("id").first().period \
        == first
