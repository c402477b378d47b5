"""Tidal schedules through the services and the beat task: at night training gets most of the
pool, by day inference; the switch gives notice to exactly the leases that must give way and
records how long the new split took to be in force."""

from datetime import UTC, datetime, time, timedelta

import pytest
from django.conf import settings

from market import auctions
from pool.models import Quota, TidalRun, TidalStep
from scheduler import tasks
from scheduler.pools import tides
from tests.factories import client_for, make_org
from tests.scheduler.pools.builders import H100, admit, order, private_pool, queue, run, states


@pytest.fixture
def company(db):
    return make_org("shop-company", "tenant")


@pytest.fixture
def shop(company):
    """32 GPUs split between training (24) and inference (8) at night; by day 8 / 24."""
    pool = private_pool(name="shop", nodes=4)
    queue(pool, "company")
    queue(pool, "training", company, nominal=24, borrowing_limit=0, parent="company")
    queue(pool, "inference", company, nominal=8, borrowing_limit=0, parent="company")
    TidalStep.objects.create(pool=pool, name="day", daily_at=time(8, 0),
                             nominals={"training": {H100: 8}, "inference": {H100: 24}})
    TidalStep.objects.create(pool=pool, name="night", daily_at=time(20, 0),
                             nominals={"training": {H100: 24}, "inference": {H100: 8}})
    return pool


def nominal(pool, name):
    return Quota.objects.get(node__pool=pool, node__name=name).nominal


def test_the_step_due_last_is_the_one_applied():
    step_day = TidalStep(name="day", daily_at=time(8, 0))
    morning = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)

    assert tides.due_at(step_day, morning) == datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    assert tides.due_at(step_day, morning.replace(hour=7)) == datetime(2026, 3, 1, 8, 0,
                                                                       tzinfo=UTC)


def test_a_tidal_switch_gives_notice_to_exactly_what_must_give_way(shop, company,
                                                                   time_machine):
    night = datetime(2026, 3, 1, 21, 0, tzinfo=UTC)
    time_machine.move_to(night, tick=False)  # the leases start at night too
    tides.apply_due_steps(now=night)  # night split: training 24
    training = run(company, shop, 8, 8, 8, queue_name="training")
    serving = order(company, shop, 16, queue_name="inference")
    admit(shop)
    serving.refresh_from_db()
    assert serving.state == "queued"  # inference holds 8 at night

    morning = night + timedelta(hours=11)  # 08:00 passed: the day step is due
    time_machine.move_to(morning, tick=False)
    runs = tides.apply_due_steps(now=morning)
    again = tides.apply_due_steps(now=morning + timedelta(seconds=30))

    assert [r.step.name for r in runs] == ["day"] and again == []
    day = runs[0]
    assert (nominal(shop, "training"), nominal(shop, "inference")) == (8, 24)
    assert day.gpus_to_give_way == 16 and day.leases_preempted == 2
    assert states(training) == ["active", "preempting", "preempting"]
    assert day.in_force_at is None
    ended = morning + timedelta(seconds=settings.PREEMPTION_NOTICE_S + 1)
    time_machine.move_to(ended, tick=False)
    auctions.end_preempted_leases(now=ended)
    admit(shop, now=ended)
    serving.refresh_from_db()
    day.refresh_from_db()
    assert serving.state == "filled"
    assert day.in_force_at == ended
    assert day.seconds_to_force == settings.PREEMPTION_NOTICE_S + 1
    shown = client_for(company).get("/api/v1/pools/shop/").json()["tidal_runs"]
    assert [r["step"] for r in shown] == ["day", "night"]  # newest first
    assert (shown[0]["seconds_to_force"], shown[0]["leases_preempted"]) == (
        settings.PREEMPTION_NOTICE_S + 1, 2)


def test_the_beat_task_applies_a_one_off_step_once(shop, company):
    TidalStep.objects.create(pool=shop, name="sales-event",
                             at=datetime.now(UTC) - timedelta(minutes=1),
                             nominals={"training": {H100: 6}, "inference": {H100: 26}})

    first = tasks.apply_tidal_steps()
    second = tasks.apply_tidal_steps()

    assert len(first) == 1 and second == []
    assert TidalRun.objects.get().step.name == "sales-event"
    assert (nominal(shop, "training"), nominal(shop, "inference")) == (6, 26)


@pytest.mark.django_db(transaction=True)
def test_beats_racing_apply_a_due_step_once():
    """Four beats at once find the same due step: the unique run and the pool's row lock let
    one apply it; the nominals move once and no lease is noticed twice."""
    import threading

    from django.db import connection

    from pool.services import ensure_gpu_catalogue

    ensure_gpu_catalogue()
    company = make_org("racing-company", "tenant")
    pool = private_pool(name="racing-shop", nodes=4)
    queue(pool, "company")
    queue(pool, "training", company, nominal=24, borrowing_limit=0, parent="company")
    queue(pool, "inference", company, nominal=8, borrowing_limit=0, parent="company")
    training = run(company, pool, 8, 8, 8, queue_name="training")
    TidalStep.objects.create(pool=pool, name="sales-event",
                             at=datetime.now(UTC) - timedelta(seconds=5),
                             nominals={"training": {H100: 8}, "inference": {H100: 24}})
    barrier = threading.Barrier(4)
    applied, failures = [], []

    def beat():
        barrier.wait()
        try:
            applied.extend(tides.apply_due_steps())
        except Exception as exc:  # any failure fails the test below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=beat) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    assert len(applied) == 1 and TidalRun.objects.count() == 1
    assert states(training).count("preempting") == 2
    assert nominal(pool, "inference") == 24
