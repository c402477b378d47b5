from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from fabric.models import Fabric, Hca, Host, Link, Port, Switch

DATA = Path(__file__).parent / "data"


def domains(name: str) -> dict[str, tuple[str, str]]:
    return {h.name: (h.leaf, h.spine) for h in Host.objects.filter(fabric__name=name)}


def row_counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Fabric, Switch, Host, Hca, Port, Link))


def test_it_imports_a_slurm_tree_with_its_leaf_and_spine_domains(provider, slurm_file, capsys):
    call_command("import_fabric", str(slurm_file), "--format", "slurm", "--name", "lab",
                 "--owner", provider.slug)

    fabric = Fabric.objects.get(name="lab")
    assert fabric.owner == provider
    assert fabric.source == "slurm"
    found = domains("lab")
    assert sorted(found) == [f"gpu{n:02d}" for n in range(1, 11)]
    assert found["gpu01"][0] == found["gpu04"][0] != found["gpu05"][0]
    assert found["gpu01"][1] == found["gpu08"][1] != found["gpu09"][1]
    assert fabric.summary["domain_counts"] == {"node": 10, "leaf": 3, "spine": 2, "fabric": 1}
    assert "imported fabric lab: 10 nodes, 3 leaves, 2 spines, 80 GPUs" in capsys.readouterr().out


def test_reimporting_the_same_file_updates_in_place_without_duplicates(provider, slurm_file):
    call_command("import_fabric", str(slurm_file), "--format", "slurm", "--name", "lab",
                 "--owner", provider.slug)
    first_ids = dict(Host.objects.values_list("name", "id"))
    before = row_counts()

    call_command("import_fabric", str(slurm_file), "--format", "slurm", "--name", "lab")

    assert row_counts() == before
    assert dict(Host.objects.values_list("name", "id")) == first_ids


def test_it_imports_ibnetdiscover_leaving_out_cas_with_a_default_description(provider):
    path = DATA / "two_leaves_two_spines.ibnetdiscover"

    call_command("import_fabric", str(path), "--format", "ibnetdiscover", "--name", "ib",
                 "--owner", provider.slug)

    found = domains("ib")
    assert sorted(found) == ["node01", "node02", "node03"]
    assert found["node01"][0] == found["node02"][0] != found["node03"][0]
    assert len({spine for _, spine in found.values()}) == 1  # two roots, one spine group
    assert Switch.objects.filter(fabric__name="ib").count() == 4
    assert Fabric.objects.get(name="ib").summary["link_rates_gbps"]


@pytest.mark.parametrize("text, line, words", [
    ("SwitchName=leaf1 Nodes=gpu[01-04\n", 1, "hostlist"),
    ("SwitchName=leaf1 Nodes=gpu[01-02]\nSwitchName=spine Switches=leaf9\n", 2, "leaf9"),
    ("SwitchName=a Switches=b\nSwitchName=b Switches=a\n", 1, "cycle"),
])
def test_a_bad_file_is_rejected_with_its_line_and_changes_nothing(provider, slurm_file, tmp_path,
                                                                  text, line, words):
    call_command("import_fabric", str(slurm_file), "--format", "slurm", "--name", "lab",
                 "--owner", provider.slug)
    before, before_domains = row_counts(), domains("lab")
    bad = tmp_path / "bad.conf"
    bad.write_text(text)

    with pytest.raises(CommandError) as error:
        call_command("import_fabric", str(bad), "--format", "slurm", "--name", "lab")

    assert str(error.value).startswith(f"{bad}:"), str(error.value)
    assert words in str(error.value)
    assert row_counts() == before
    assert domains("lab") == before_domains


def test_a_duplicate_guid_in_ibnetdiscover_is_rejected_with_its_line(provider, tmp_path):
    text = (DATA / "two_leaves_two_spines.ibnetdiscover").read_text()
    # a second switch record under the first spine's GUID
    bad = tmp_path / "dup.ibnetdiscover"
    bad.write_text(text + (
        "\nswitchguid=0x7cfe900300a00001(7cfe900300a00001)\n"
        'Switch\t64 "S-7cfe900300a00001"\t\t# "MF0;spine09:MQM9700/U1" enhanced port 0 lid 9 lmc 0\n'
    ))

    with pytest.raises(CommandError) as error:
        call_command("import_fabric", str(bad), "--format", "ibnetdiscover", "--name", "ib",
                     "--owner", provider.slug)

    assert str(error.value).startswith(f"{bad}:")
    assert "duplicate" in str(error.value).lower()
    assert Fabric.objects.count() == 0


def export_and_reimport(name: str, fmt: str, owner, tmp_path, capsys) -> str:
    capsys.readouterr()
    call_command("export_fabric", name, "--format", fmt)
    exported = tmp_path / f"{name}-{fmt}.conf"
    exported.write_text(capsys.readouterr().out)
    call_command("import_fabric", str(exported), "--format", "slurm", "--name", f"{name}-{fmt}",
                 "--owner", owner.slug)
    capsys.readouterr()
    return f"{name}-{fmt}"


def test_tree_export_then_import_gives_the_same_domains(provider, slurm_file, tmp_path, capsys):
    call_command("import_fabric", str(slurm_file), "--format", "slurm", "--name", "lab",
                 "--owner", provider.slug)

    again = export_and_reimport("lab", "slurm-tree", provider, tmp_path, capsys)

    assert _partition(domains("lab"), 0) == _partition(domains(again), 0)
    assert _partition(domains("lab"), 1) == _partition(domains(again), 1)


def test_block_export_keeps_leaves_and_even_spines(provider, tmp_path, capsys):
    # Slurm blocks aggregate consecutive blocks by BlockSizes, so spine domains survive a
    # block round trip when every spine holds the same power-of-two number of leaves.
    call_command("generate_fabric", "--kind", "fat-tree", "--nodes", "64", "--radix", "8",
                 "--tiers", "3", "--name", "even", "--owner", provider.slug)

    again = export_and_reimport("even", "slurm-block", provider, tmp_path, capsys)

    assert _partition(domains("even"), 0) == _partition(domains(again), 0)
    assert _partition(domains("even"), 1) == _partition(domains(again), 1)


def _partition(found: dict[str, tuple[str, str]], level: int) -> set[frozenset[str]]:
    groups: dict[str, set[str]] = {}
    for host, names in found.items():
        groups.setdefault(names[level], set()).add(host)
    return {frozenset(g) for g in groups.values()}


def test_export_writes_compressed_hostlists(provider, slurm_file, capsys):
    call_command("import_fabric", str(slurm_file), "--format", "slurm", "--name", "lab",
                 "--owner", provider.slug)
    capsys.readouterr()

    call_command("export_fabric", "lab", "--format", "slurm-tree")

    out = capsys.readouterr().out
    assert "Nodes=gpu[01-04]" in out
    assert "Nodes=gpu[09-10]" in out


def test_generate_fabric_saves_a_three_tier_fat_tree(provider, capsys):
    call_command("generate_fabric", "--kind", "fat-tree", "--nodes", "128", "--radix", "8",
                 "--tiers", "3", "--name", "gen", "--owner", provider.slug)

    fabric = Fabric.objects.get(name="gen")
    assert fabric.source == "generator"
    assert Host.objects.filter(fabric=fabric).count() == 128
    counts = fabric.summary["domain_counts"]
    assert counts["leaf"] == 128 // 4  # radix 8: 4 hosts per leaf
    assert "saved fat-tree gen: 128 nodes" in capsys.readouterr().out


@pytest.mark.parametrize("kind, args, nodes", [
    ("dragonfly", ["--a", "4", "--p", "2", "--h", "2"], None),
    ("torus", ["--x", "4", "--y", "4", "--z", "4"], 64),
])
def test_generate_fabric_saves_dragonflies_and_tori(provider, kind, args, nodes):
    call_command("generate_fabric", "--kind", kind, *args, "--name", kind, "--owner", provider.slug)

    fabric = Fabric.objects.get(name=kind)
    assert fabric.kind == kind
    if nodes is not None:
        assert Host.objects.filter(fabric=fabric).count() == nodes
    assert Host.objects.filter(fabric=fabric).exists()


def test_a_topology_conf_asking_for_millions_of_hosts_is_refused_with_its_line(provider,
                                                                               tmp_path):
    huge = tmp_path / "huge.conf"
    huge.write_text("# harmless\nSwitchName=s1 Nodes=n[1-4999999]\n")

    with pytest.raises(CommandError) as error:
        call_command("import_fabric", str(huge), "--format", "slurm", "--name", "huge",
                     "--owner", provider.slug)

    assert str(error.value).startswith(f"{huge}:2:")
    assert "too large" in str(error.value)
    assert Fabric.objects.count() == 0


def test_a_fabric_with_more_hosts_than_allowed_is_refused_whole(provider, monkeypatch):
    from fabric import services
    from fabric.core import generators

    monkeypatch.setattr(services, "MAX_HOSTS_PER_FABRIC", 10)

    with pytest.raises(services.FabricImportError, match="16 hosts, more than the 10"):
        services.save_fabric(owner=provider, name="big", spec=generators.fat_tree(16, 8),
                             source="generator")

    assert Fabric.objects.count() == 0
