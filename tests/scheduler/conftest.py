"""Fixtures of the scheduler's worker tests: a queue of the test's own and real workers on it."""

import socket
import subprocess
import sys
import time
import uuid

import pytest

from ibex.celery import app as celery_app
from scheduler.routing import worker_queues
from tests.conftest import BASE_DIR, WORKER_START_TIMEOUT_S, child_env


@pytest.fixture
def queue():
    name = f"crash-{uuid.uuid4().hex[:8]}"
    previous = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = name  # where this process routes the placements
    yield name
    celery_app.conf.task_default_queue = previous


@pytest.fixture
def workers():
    started: list[subprocess.Popen] = []

    def start(queue: str, name: str, module: str = "celery", **env: str) -> subprocess.Popen:
        """`module`: what `python -m` runs, the plain Celery command or a test's own worker."""
        process = subprocess.Popen(
            [sys.executable, "-m", module, "-A", "ibex", "worker", "--pool", "solo",
             "--queues", ",".join(worker_queues(queue)), "--hostname", f"{name}@%h",
             "--loglevel", "warning", "--without-mingle", "--without-gossip"],
            cwd=BASE_DIR, env=child_env(CELERY_QUEUE=queue, **env))
        started.append(process)
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while not celery_app.control.ping(destination=[f"{name}@{socket.gethostname()}"],
                                          timeout=0.5):
            assert process.poll() is None and time.monotonic() < deadline, "no worker"
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.terminate()
    for process in started:
        process.wait(timeout=30)
