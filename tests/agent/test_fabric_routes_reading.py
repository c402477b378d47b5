"""The fabric agent's routes: one `dump_fts -n` a poll beside the discovery, sent as a snapshot
with its hash; a dump_fts that fails leaves the routes out of the report and says why, and the
rest of the poll stands."""

from agent.fabric_agent import DiagsFailed, FabricReader
from fabric.core.diags import parse_discovery
from tests.fabric.core.diags_samples import IBNETDISCOVER

DISCOVERY = parse_discovery(IBNETDISCOVER)
LEAF = next(guid for guid, node in DISCOVERY.nodes.items() if node.kind == "switch")


def runner(dump_fts: str | None):
    """A diagnostics runner: the captured ibnetdiscover, `dump_fts` (None: it fails), and no
    counters or port states (their failures are tolerated and reported)."""
    calls = []

    def run(argv, timeout_s, env):
        calls.append(argv[0])
        if argv[0] == "ibnetdiscover":
            return IBNETDISCOVER
        if argv[0] == "dump_fts" and dump_fts is not None:
            return dump_fts
        raise DiagsFailed(f"{argv[0]} failed (exit 1): no answer")

    return run, calls


def test_a_poll_reads_every_switch_table_once_and_reports_its_hash():
    table = (f"Unicast lids [0x0-0x2] of switch Lid 1 guid {LEAF} (leaf01):\n"
             "  Lid  Out   Destination\n       Port     Info\n0x0001 000\n0x0002 003\n")
    run, calls = runner(table)
    reader = FabricReader(run=run, counters_tool="perfquery")

    header, topology = reader.read()

    assert header["reachable"] is True and topology is not None
    assert calls.count("dump_fts") == 1
    assert reader.routes["switches"] == {LEAF: "ff0003"}
    assert reader.routes["lids"][LEAF] == DISCOVERY.nodes[LEAF].lid
    assert header["routes_hash"].startswith("sha256:") and "routes_error" not in header


def test_a_failed_dump_fts_leaves_the_routes_out_and_says_why():
    run, _calls = runner(None)
    reader = FabricReader(run=run, counters_tool="perfquery")

    header, topology = reader.read()

    assert header["reachable"] is True and topology is not None
    assert reader.routes is None and "routes_hash" not in header
    assert header["routes_error"].startswith("dump_fts failed")
