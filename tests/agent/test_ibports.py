from agent.ibports import (
    IbPort,
    parse_rate,
    parse_state,
    pkey_index,
    ports_payload,
    read_ib_ports,
)


def make_port(root, hca: str, port: int, state: str, rate: str | None, link_layer: str = "InfiniBand"):
    directory = root / hca / "ports" / str(port)
    directory.mkdir(parents=True)
    (directory / "state").write_text(state + "\n")
    if rate is not None:
        (directory / "rate").write_text(rate + "\n")
    (directory / "link_layer").write_text(link_layer + "\n")


def test_parse_state_and_rate():
    assert parse_state("4: ACTIVE\n") == "active"
    assert parse_state("1: DOWN") == "down"
    assert parse_state("5: ACTIVE_DEFER") == "active_defer"
    assert parse_state("garbage") == "unknown"
    assert parse_rate("400 Gb/sec (4X NDR)\n") == 400
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate("unknown") is None


def test_reads_a_sysfs_tree(tmp_path):
    make_port(tmp_path, "mlx5_1", 1, "1: DOWN", "10 Gb/sec (4X SDR)")
    make_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "400 Gb/sec (4X NDR)")
    make_port(tmp_path, "mlx5_0", 2, "2: INIT", None)
    make_port(tmp_path, "mlx5_2", 1, "4: ACTIVE", "100 Gb/sec (4X EDR)", link_layer="Ethernet")

    ports = read_ib_ports(tmp_path)

    assert ports == [
        IbPort("mlx5_0", 1, "active", 400),
        IbPort("mlx5_0", 2, "init", None),
        IbPort("mlx5_1", 1, "down", 10),
    ]
    assert ports_payload(ports) == [
        {"port": 1, "state": "active", "rate_gbps": 400},
        {"port": 2, "state": "init"},
        {"port": 3, "state": "down", "rate_gbps": 10},
    ]


def test_no_sysfs_tree_means_no_ports(tmp_path):
    assert read_ib_ports(tmp_path / "absent") == []


def test_a_ports_pkey_table_is_read_by_index(tmp_path):
    make_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "400 Gb/sec (4X NDR)")
    table = tmp_path / "mlx5_0" / "ports" / "1" / "pkeys"
    table.mkdir()
    for index, value in enumerate(["0xffff", "0x9001", "0x0000", "0x1002"]):
        (table / str(index)).write_text(value + "\n")

    (port,) = read_ib_ports(tmp_path)

    assert port.pkeys == (0xFFFF, 0x9001, 0x0000, 0x1002)
    assert pkey_index([port], 0x1001) == 1  # full member
    assert pkey_index([port], 0x1002) == 3  # limited member
    assert pkey_index([port], 0x1003) is None
