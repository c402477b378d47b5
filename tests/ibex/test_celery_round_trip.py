from ibex.tasks import ping

ROUND_TRIP_TIMEOUT_S = 30


def test_it_runs_a_task_in_a_real_worker_process_and_returns_its_result(celery_worker_process):
    result = ping.delay("hello from the test")

    answer = result.get(timeout=ROUND_TRIP_TIMEOUT_S)

    assert answer["payload"] == "hello from the test"
    assert result.successful()
    assert celery_worker_process.poll() is None  # a separate process, still alive


def test_it_runs_tasks_in_the_worker_not_eagerly(celery_worker_process, settings):
    assert not getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False)
    results = [ping.delay(str(n)) for n in range(5)]

    answers = [r.get(timeout=ROUND_TRIP_TIMEOUT_S)["payload"] for r in results]

    assert answers == ["0", "1", "2", "3", "4"]
