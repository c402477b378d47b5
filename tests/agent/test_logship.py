"""Shipping a lease's log: whole lines, cut long ones, bounded requests, resumed after a restart."""

import pytest

from agent.client import ApiClient
from agent.logship import MAX_LINE, MAX_REQUEST, LogShipper, read_lines
from tests.agent.fake_ibex import FakeIbex


def test_only_complete_lines_while_running_and_the_last_partial_line_once_ended(tmp_path):
    log = tmp_path / "1.1.log"
    log.write_bytes(b"one\r\ntwo\nthr")

    running = read_lines(log, 0, False, ended=False)
    assert running.lines == ["one", "two"] and running.offset == len(b"one\r\ntwo\n")

    ended = read_lines(log, running.offset, False, ended=True)
    assert ended.lines == ["thr"] and ended.offset == log.stat().st_size


def test_a_long_line_is_cut_at_64_kib_and_its_rest_dropped(tmp_path):
    log = tmp_path / "1.1.log"
    log.write_bytes(b"x" * (MAX_LINE + 10) + b"\nnext\n" + "é".encode() * MAX_LINE + b"\n")

    chunk = read_lines(log, 0, False, ended=False)

    assert [len(line.encode()) for line in chunk.lines] == [MAX_LINE, 4, MAX_LINE]
    assert chunk.lines[1] == "next" and set(chunk.lines[2]) == {"é"}  # never half a character


def test_a_line_still_growing_past_64_kib_is_cut_once(tmp_path):
    log = tmp_path / "1.1.log"
    log.write_bytes(b"y" * (MAX_LINE + 5))
    first = read_lines(log, 0, False, ended=False)
    with open(log, "ab") as handle:
        handle.write(b"yyy\nafter\n")
    second = read_lines(log, first.offset, first.in_long_line, ended=False)

    assert [len(line) for line in first.lines] == [MAX_LINE] and first.in_long_line
    assert second.lines == ["after"] and not second.in_long_line


def test_a_request_carries_at_most_2_mib_of_lines(tmp_path):
    log = tmp_path / "1.1.log"
    log.write_bytes((b"z" * 1000 + b"\n") * 5000)  # 5 MB

    chunk = read_lines(log, 0, False, ended=False, chunk=8 * 1024 * 1024)

    assert sum(len(line) for line in chunk.lines) <= MAX_REQUEST
    assert chunk.offset == len(chunk.lines) * 1001


@pytest.fixture
def ibex():
    with FakeIbex() as server:
        yield server


def test_the_shipper_sends_numbered_lines_and_resumes_where_the_server_is(ibex, tmp_path):
    node = ibex.add_node("gpu01")
    log = tmp_path / "42.1.log"
    log.write_text("a\nb\nc\n")
    ended = False
    shipper = LogShipper(ApiClient(ibex.url), node.id, node.token, lambda: [("42", 1, log, ended)])

    shipper.ship_all()
    assert node.log_lines("42") == ["a", "b", "c"]
    assert not shipper.drained("42")

    # a restarted agent: a new shipper learns next_line and sends only what is new
    with open(log, "a") as handle:
        handle.write("d\ne")
    ended = True
    restarted = LogShipper(ApiClient(ibex.url), node.id, node.token, lambda: [("42", 1, log, ended)])
    restarted.ship_all()

    assert node.log_lines("42") == ["a", "b", "c", "d", "e"]
    sent = [r.body for r in ibex.requests if r.path.endswith("/logs/")]
    assert sent[0] == {"lease": "42", "generation": 1, "from_line": 0, "lines": []}  # the probe
    assert sent[-1] == {"lease": "42", "generation": 1, "from_line": 3, "lines": ["d", "e"]}
    assert restarted.drained("42")
