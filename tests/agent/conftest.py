"""Fixtures shared by the agent's tests."""

import os
import signal

import pytest


@pytest.fixture
def sighups(tmp_path):
    """A pid file naming this process, and the SIGHUPs it receives."""
    received = []
    previous = signal.signal(signal.SIGHUP, lambda *_: received.append(1))
    pid_file = tmp_path / "opensm.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    yield pid_file, received
    signal.signal(signal.SIGHUP, previous)
