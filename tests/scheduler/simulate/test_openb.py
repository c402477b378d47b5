"""The openb trace reader and the FGD paper's arrivals, on a small file in the trace's format."""

from __future__ import annotations

from scheduler.simulate.openb import allocation_at, load_openb_cluster, load_openb_pods
from scheduler.simulate.policies import make_policy

NODES = """sn,cpu_milli,memory_mib,gpu,model
openb-node-0001,32000,131072,2,P100
openb-node-0000,64000,262144,4,V100M32
"""
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-0002,4000,8192,1,500,,LS,Running,0,10,0
openb-pod-0001,8000,16384,2,1000,V100M32|V100M16,LS,Running,0,10,0
openb-pod-0000,2000,4096,0,0,,BE,Running,0,10,0
"""


def test_the_trace_reads_as_nodes_and_pods_in_name_order(tmp_path):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    cluster = load_openb_cluster(tmp_path / "nodes.csv")
    pods = load_openb_pods(tmp_path / "pods.csv")
    assert cluster.total_gpus == 6
    assert [pod.name for pod in pods] == ["openb-pod-0000", "openb-pod-0001", "openb-pod-0002"]
    cpu_only, pair, share = pods
    assert (cpu_only.gpus, cpu_only.gpu_milli, cpu_only.cpu_milli) == (0, 0, 2000)
    assert pair.gpu_models == frozenset({"V100M32", "V100M16"}) and pair.gpu_milli == 1000
    assert share.is_shared and share.gpu_milli == 500 and share.memory_mib == 8192


def test_arrivals_stop_before_the_gpus_asked_pass_capacity(tmp_path):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    cluster = load_openb_cluster(tmp_path / "nodes.csv")
    pods = load_openb_pods(tmp_path / "pods.csv")
    result = allocation_at(cluster, pods, make_policy("best_fit", 42, pods), seed=42)
    assert result["asked_gpus"] <= 6
    assert result["allocation_ratio"] == result["asked_gpus"] / 6  # all of it fits
    again = allocation_at(cluster, pods, make_policy("best_fit", 42, pods), seed=42)
    assert again == result
