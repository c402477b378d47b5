"""Fuzz the fabric importers with random and mutated ibnetdiscover and topology.conf files.

The contract: a parser returns a FabricSpec or raises FabricFormatError whose message is
``PATH:LINE: ...`` with LINE inside the file; nothing else. Through the database, an import
either succeeds or raises FabricImportError and leaves every fabric table as it was.

Bounded for the suite; a long campaign:
    IBEX_FUZZ_EXAMPLES=5000 pytest tests/security/test_importer_fuzz.py
"""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabric.core import generators
from fabric.core.errors import FabricFormatError
from fabric.core.ibnetdiscover import parse_ibnetdiscover
from fabric.core.slurm import export_slurm_block, export_slurm_tree, parse_slurm_topology
from fabric.core.spec import FabricSpec
from fabric.models import Fabric, Hca, Host, Link, Port, Switch
from fabric.services import FabricImportError, import_fabric_file, save_fabric
from tests.factories import make_org

EXAMPLES = int(os.environ.get("IBEX_FUZZ_EXAMPLES", "150"))
DATA = Path(__file__).resolve().parent.parent / "fabric" / "data"

IBNETDISCOVER_SEEDS = [(DATA / "two_leaves_two_spines.ibnetdiscover").read_text()]
SLURM_SEEDS = [
    export_slurm_tree(generators.fat_tree(8, 8)),
    export_slurm_tree(generators.fat_tree(16, 8, tiers=3)),
    export_slurm_block(generators.fat_tree(16, 8)),
    "SwitchName=s0 Nodes=tux[0-3] LinkSpeed=900\nSwitchName=s1 Nodes=tux[4-7]\n"
    "SwitchName=s3 Switches=s[0-1] \\\n LinkSpeed=1800\n",
]
TABLES = (Fabric, Switch, Host, Hca, Link, Port)

# Pieces that mean something to one of the parsers, to be spliced in anywhere.
TOKENS = st.sampled_from([
    "SwitchName=", "Switches=", "Nodes=", "LinkSpeed=", "BlockName=", "BlockSizes=", "[", "]",
    "-", ",", "=", "#", "\\", "\n", "\r", "\t", " ", '"', "0x", "Switch 36 ", "Ca 1 ",
    '"S-7cfe900300a00001"', '"H-b8599f0300e10001"', "[1]", "[0]", "[99999]", "(", ")",
    "4xNDR", "12xXDR", "3xHDR", "caguid=0x1", "switchguid=0x1", "\x00", "\u00e9", "\u2028",
    "\u0663", "\U0001f600", "9" * 30, "-1", "0", "1e309", "nan", "inf", "node[1-99999999]",
])
NUMBERS = st.sampled_from(["0", "-1", "9" * 25, "18446744073709551616", "2147483648", "00",
                           "9" * 5000, "\u00b2", "\u0663", "f" * 40])


@st.composite
def mutated(draw, seeds):
    text = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 6))):
        lines = text.splitlines(keepends=True) or [""]
        i, j = (draw(st.integers(0, len(lines) - 1)) for _ in range(2))
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "flip", "truncate", "insert",
                                   "token", "number", "stretch", "replace-all"]))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(j, lines[i])
        elif op == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        if op in ("delete", "duplicate", "swap"):
            text = "".join(lines)
        elif op == "flip":
            text = text[:at] + draw(st.characters()) + text[at + 1:]
        elif op == "truncate":
            text = text[:at]
        elif op == "insert":
            garbage = draw(st.binary(max_size=12)).decode("latin-1")
            text = text[:at] + draw(st.one_of(st.text(max_size=12), st.just(garbage))) + text[at:]
        elif op == "token":
            text = text[:at] + draw(TOKENS) + text[at:]
        elif op == "stretch":  # a name, number or description made hundreds of times longer
            end = min(len(text), at + draw(st.integers(1, 8)))
            text = text[:at] + text[at:end] * draw(st.integers(2, 400)) + text[end:]
        elif op == "replace-all":  # change one word everywhere, so both ends of a cable agree
            words = sorted(set(text.replace('"', " ").split()))
            if words:
                word = draw(st.sampled_from(words))
                text = text.replace(word, draw(st.one_of(NUMBERS, st.just(word * 40))))
        else:  # replace a run of digits with a huge, negative or zero number
            digits = [k for k, c in enumerate(text) if c.isdigit()]
            if digits:
                k = draw(st.sampled_from(digits))
                end = k
                while end < len(text) and text[end].isdigit():
                    end += 1
                text = text[:k] + draw(NUMBERS) + text[end:]
    return text


def files(seeds):
    return st.one_of(mutated(seeds), st.text(max_size=200),
                     st.lists(TOKENS, max_size=30).map("".join))


def check_parse(parse, text: str, path: str):
    try:
        spec = parse(text, path=path)
    except FabricFormatError as error:
        last = max(1, len(text.splitlines()))
        assert error.path == path
        assert 1 <= error.line <= last, f"line {error.line} outside a file of {last} lines"
        assert str(error).startswith(f"{path}:{error.line}: ")
        return None
    assert isinstance(spec, FabricSpec)
    guids = {s.guid for s in spec.switches} | {h.guid for h in spec.hcas}
    for link in spec.links:
        assert {link.a_guid, link.b_guid} <= guids
    return spec


SUITE = settings(max_examples=EXAMPLES, deadline=None)


@SUITE
@given(text=files(IBNETDISCOVER_SEEDS))
def test_ibnetdiscover_parses_or_names_a_line(text):
    check_parse(parse_ibnetdiscover, text, "site/ib.txt")


@SUITE
@given(text=files(SLURM_SEEDS))
def test_topology_conf_parses_or_names_a_line(text):
    check_parse(parse_slurm_topology, text, "site/topology.conf")


def row_counts():
    return {model.__name__: model.objects.count() for model in TABLES}


@pytest.fixture
def lab_owner(db):
    """A provider with a fabric "lab" already imported, so a fuzzed import is a re-import."""
    owner = make_org("fuzz-provider", "provider")
    save_fabric(owner=owner, name="lab", spec=generators.fat_tree(8, 8), source="generator")
    return owner


@settings(SUITE, max_examples=max(EXAMPLES // 3, 10),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_an_import_succeeds_or_changes_nothing(lab_owner, data):
    fmt = data.draw(st.sampled_from(["slurm", "ibnetdiscover"]))
    text = data.draw(files(SLURM_SEEDS if fmt == "slurm" else IBNETDISCOVER_SEEDS))
    name = data.draw(st.sampled_from(["lab", "other"]))
    from django.db import transaction

    with transaction.atomic():
        before = row_counts()
        try:
            import_fabric_file(owner=lab_owner, name=name, text=text, fmt=fmt, path="upload")
        except FabricImportError:
            assert row_counts() == before
        transaction.set_rollback(True)  # the next example starts from the same "lab"
