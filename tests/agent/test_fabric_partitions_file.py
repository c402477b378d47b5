"""The fabric agent's partitions.conf writer: IBEX's block between its markers, the provider's
lines kept as they are, the file replaced atomically, and OpenSM signalled only on a change."""


import pytest

from agent import fabric_agent
from agent.fabric_agent import write_partitions_file
from fabric.core import partitions as partition_file

NODE_A, NODE_B, NODE_C = "0x000000000000000a", "0x000000000000000b", "0x000000000000000c"
PORTS = {(NODE_A, 1): "0x000000000000010a", (NODE_B, 1): "0x000000000000010b"}
LEASE = {"pkey": "0x1000", "lease": "L-7",
         "members": [{"guid": NODE_A, "port": 1}, {"guid": NODE_B, "port": 1}]}
PROVIDER = ("# site partitions\nDefault=0x7fff, ipoib : ALL=full ;\n"
            "storage=0x8002,\n  ipoib : ALL=limited ; # spans lines\n")


def port_guid(guid, port):
    return PORTS.get((guid, port))


def test_a_new_file_gets_the_default_partition_and_ibexs_block(tmp_path, sighups):
    pid_file, received = sighups

    written = write_partitions_file(tmp_path, [LEASE], port_guid, pid_file)

    assert (tmp_path / "partitions.conf").read_text() == (
        "Default=0x7fff, ipoib : ALL=full ;\n" + partition_file.BEGIN + "\n# L-7\n"
        "ibex_1000=0x1000 : 0x000000000000010a=full, 0x000000000000010b=full ;\n# END IBEX\n")
    assert written.changed and written.signalled and received == [1]


def test_the_providers_lines_are_kept_and_only_the_block_is_rewritten(tmp_path, sighups):
    pid_file, _ = sighups
    (tmp_path / "partitions.conf").write_text(PROVIDER)
    write_partitions_file(tmp_path, [LEASE], port_guid, pid_file)
    with (tmp_path / "partitions.conf").open("a") as out:
        out.write("late=0x0003 : ALL=limited ;\n")  # the provider adds a line after the block

    write_partitions_file(tmp_path, [], port_guid, pid_file)

    text = (tmp_path / "partitions.conf").read_text()
    assert text == (PROVIDER + "late=0x0003 : ALL=limited ;\n" + partition_file.BEGIN
                    + "\n# END IBEX\n")


def test_an_unchanged_answer_writes_nothing_and_sends_no_signal(tmp_path, sighups):
    pid_file, received = sighups
    write_partitions_file(tmp_path, [LEASE], port_guid, pid_file)
    before = (tmp_path / "partitions.conf").stat()

    again = write_partitions_file(tmp_path, [LEASE], port_guid, pid_file)

    assert not again.changed and not again.signalled and received == [1]
    assert (tmp_path / "partitions.conf").stat().st_ino == before.st_ino


def test_the_file_is_replaced_whole_or_not_at_all(tmp_path, sighups, monkeypatch):
    pid_file, received = sighups
    (tmp_path / "partitions.conf").write_text(PROVIDER)

    def crash(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(fabric_agent.os, "replace", crash)
    with pytest.raises(OSError):
        write_partitions_file(tmp_path, [LEASE], port_guid, pid_file)

    assert (tmp_path / "partitions.conf").read_text() == PROVIDER
    assert sorted(path.name for path in tmp_path.iterdir()) == ["opensm.pid", "partitions.conf"]
    assert received == []


def test_a_member_port_not_in_the_discovery_is_left_out_and_named(tmp_path, sighups):
    pid_file, _ = sighups
    lease = {**LEASE, "members": [*LEASE["members"], {"guid": NODE_C, "port": 1}]}

    written = write_partitions_file(tmp_path, [lease], port_guid, pid_file)

    assert written.missing == [f"{NODE_C}[1]"]
    assert NODE_C not in (tmp_path / "partitions.conf").read_text()


def test_without_a_pid_file_the_file_is_written_and_the_missing_signal_said(tmp_path):
    written = write_partitions_file(tmp_path, [LEASE], port_guid, None)

    assert written.changed and not written.signalled and "pid" in written.error


def test_the_providers_pkeys_are_read_outside_ibexs_block_without_the_full_member_bit():
    text = partition_file.render(PROVIDER, ["ibex_1000=0x1000 : 0x1=full ;"])

    assert partition_file.provider_pkeys(text) == [0x0002, 0x7FFF]
    assert partition_file.provider_pkeys("# nothing\nnamed : ALL=full ;\n") == []
