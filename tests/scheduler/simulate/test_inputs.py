"""The CSV inputs, the converter and the cluster generator; bad input is one line, status 2."""

from __future__ import annotations

import pytest

from scheduler.simulate.cli import main
from scheduler.simulate.cluster import load_cluster
from scheduler.simulate.convert import read_trace
from scheduler.simulate.errors import InputError
from scheduler.simulate.workload import load_workload

CLUSTER_HEADER = "node,gpu_model,gpus,gpu_memory_mib,cpu_milli,memory_mib,leaf,spine\n"
WORKLOAD_HEADER = "job,submit_s,duration_s,gpus,gpu_milli,gpu_model,cpu_milli,memory_mib,tenant\n"


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_workload_rows_become_jobs_in_submit_order(tmp_path):
    path = write(tmp_path, "jobs.csv", WORKLOAD_HEADER
                 + "late,20,5,2,,A100|H100,4000,1024,team-a\n"
                 + "early,10,5,1,250,,,,\n"
                 + "cpu,10,5,0,,,2000,,\n")
    early, cpu, late = load_workload(path)
    assert (early.name, early.is_shared, early.gpu_demand, early.gpu_models) == (
        "early", True, 0.25, None)
    assert (cpu.gpus, cpu.gpu_milli, cpu.cpu_milli) == (0, 0, 2000)
    assert late.gpu_models == frozenset({"A100", "H100"}) and late.tenant == "team-a"
    assert (late.cpu_milli, late.memory_mib, late.gpu_demand) == (4000, 1024, 2.0)


@pytest.mark.parametrize(("row", "message"), [
    ("j,0,ten,1,,,,,", "jobs.csv:3: duration_s is not a number"),
    ("j,0,-5,1,,,,,", "jobs.csv:3: duration_s must not be negative"),
    ("j,,5,1,,,,,", "jobs.csv:3: submit_s is empty"),
    ("j,0,5,1.5,,,,,", "jobs.csv:3: gpus is not a whole number"),
    ("j,0,5,2,500,,,,", "jobs.csv:3: gpu_milli below 1000 needs gpus=1"),
    ("j,0,5,0,500,,,,", "jobs.csv:3: gpu_milli needs gpus of at least 1"),
])
def test_a_bad_workload_row_is_named_by_file_and_line(tmp_path, row, message):
    path = write(tmp_path, "jobs.csv", WORKLOAD_HEADER + "ok,0,5,1,,,,,\n" + row + "\n")
    with pytest.raises(InputError) as error:
        load_workload(path)
    assert str(error.value) == f"{path[:-len('jobs.csv')]}{message}"


def test_a_missing_column_is_named(tmp_path):
    path = write(tmp_path, "jobs.csv", "job,submit_s,gpus\nj,0,1\n")
    with pytest.raises(InputError, match=r"jobs.csv:1: missing column duration_s, gpu_milli"):
        load_workload(path)


def test_nodes_without_labels_form_one_flat_domain(tmp_path):
    path = write(tmp_path, "c.csv", CLUSTER_HEADER + "a,A100,8,40960,64000,512000,,\n"
                 + "b,A100,8,40960,64000,512000,leaf9,spineX\n")
    cluster = load_cluster(path)
    assert [(n.leaf, n.spine) for n in cluster.nodes] == [("flat", "flat"), ("leaf9", "spineX")]
    assert cluster.total_gpus == 16


def test_the_fabric_generator_labels_nodes_in_file_order(tmp_path):
    rows = "".join(f"h{i},A100,8,40960,64000,512000,,\n" for i in (3, 1, 2, 4, 5))
    cluster = load_cluster(write(tmp_path, "c.csv", CLUSTER_HEADER + rows), "fat-tree:radix=4")
    # radix 4: two hosts per leaf, in file order
    assert [(n.name, n.leaf) for n in cluster.nodes] == [
        ("h3", "leaf01"), ("h1", "leaf01"), ("h2", "leaf02"), ("h4", "leaf02"),
        ("h5", "leaf03")]
    assert len({n.spine for n in cluster.nodes}) == 1
    assert cluster.snapshot.domain_of("h2", "leaf") == "leaf02"


def test_philly_rows_convert_to_workload_rows(tmp_path):
    path = write(tmp_path, "trace.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n"
                 "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n"
                 "2017-10-09 06:13:03,2951.0,8,23608.0,6214e9\n")
    later, first = read_trace(path)[1], read_trace(path)[0]
    assert (first.name, first.submit_s, first.gpus, first.tenant) == ("job000002", 0, 8, "6214e9")
    assert (later.submit_s, later.duration_s) == (48 * 60 + 52, 66)
    assert later.gpu_models is None and later.cpu_milli == 0


def test_convert_and_make_cluster_commands_write_csvs_the_simulator_reads(tmp_path, capsys):
    trace = write(tmp_path, "t.csv", "timestamp,duration,num_gpus,cluster\n0,10,2,vc1\n5,3,1,vc2\n")
    jobs, nodes = str(tmp_path / "jobs.csv"), str(tmp_path / "nodes.csv")
    assert main(["convert", "--trace", trace, "--out", jobs]) == 0
    assert main(["make-cluster", "--nodes", "3", "--gpus", "4", "--out", nodes]) == 0
    assert [job.tenant for job in load_workload(jobs)] == ["vc1", "vc2"]
    assert [node.name for node in load_cluster(nodes).nodes] == ["node01", "node02", "node03"]


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err.strip()


def test_bad_input_exits_with_status_2_and_one_line(tmp_path, capsys):
    cluster = write(tmp_path, "c.csv", CLUSTER_HEADER + "a,A100,8,40960,64000,512000,,\n")
    jobs = write(tmp_path, "JOBS.csv", WORKLOAD_HEADER + "a,0,5,1,,,,,\n" + "b,0,x,1,,,,,\n")
    good = write(tmp_path, "good.csv", WORKLOAD_HEADER + "a,0,5,1,,,,,\n")
    base = ["--cluster", cluster, "--mode", "replay", "--out", str(tmp_path / "r.json")]
    assert one_line_error(capsys, base + ["--workload", jobs, "--policy", "best_fit"]).endswith(
        "JOBS.csv:3: duration_s is not a number")
    assert "unknown policy 'worst_fit'" in one_line_error(
        capsys, base + ["--workload", good, "--policy", "worst_fit"])
    assert "cannot read" in one_line_error(
        capsys, base + ["--workload", str(tmp_path / "none.csv"), "--policy", "random"])
    assert "--fill-to" in one_line_error(
        capsys, base[:-4] + ["--mode", "fill", "--fill-to", "half", "--out", "x.json",
                             "--workload", good, "--policy", "random"])
    assert "unknown fabric" in one_line_error(
        capsys, base + ["--workload", good, "--policy", "random", "--fabric", "mesh:n=2"])
    assert "required" in one_line_error(capsys, ["--cluster", cluster])


def test_a_file_that_is_not_text_is_one_line_too(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_bytes(WORKLOAD_HEADER.encode() + b"a,0,5,1,,,,,\n\xff\xfe\x00binary\n")
    with pytest.raises(InputError, match=r"jobs.csv:\d+: not"):
        load_workload(str(path))


def test_a_byte_order_mark_does_not_hide_the_first_column(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_bytes(b"\xef\xbb\xbf" + WORKLOAD_HEADER.encode() + b"a,0,5,1,,,,,\n")
    assert load_workload(str(path))[0].name == "a"
