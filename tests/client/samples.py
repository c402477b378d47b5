"""Answers of the API as it sends them (shapes from market/api.py, billing/api.py, ...), for
the stub."""

ORDER = {"id": 12, "state": "filled", "reason": "", "lease": 7, "gpu_models": ["H100-80GB"],
         "gpus": 16, "mig_profile": "", "gpu_share": None, "hours": 2, "tier": "on_demand",
         "max_price_per_gpu_hour": "2.00", "topology": {"required": "leaf"},
         "start_window": None, "fill": "fill_or_kill", "pool": None, "queue": None,
         "priority": 0, "priority_class": None, "queue_position": None, "allow_moves": False,
         "workload": None, "ssh_keys": [], "slurm_account": "",
         "created_at": "2026-01-05T10:00:00Z"}

LEASE = {"id": 7, "state": "active", "tier": "on_demand", "gpu_model": "H100-80GB",
         "gpu_count": 16, "mig_profile": "", "gpu_share": None,
         "gpus": [{"node": f"gpu0{n}", "index": i} for n in (1, 2) for i in range(8)],
         "locality": {"leaves": 1, "spines": 1, "max_hops": 2},
         "price_per_gpu_hour": "2.000000", "max_price_per_gpu_hour": "2.00",
         "starts_at": "2026-01-05T10:00:00Z", "ends_at": "2026-01-05T12:00:00Z",
         "ended_at": None, "preempt_at": None, "allow_moves": False,
         "created_at": "2026-01-05T10:00:00Z",
         "events": [{"at": "2026-01-05T10:00:00Z", "kind": "state", "from_state": "",
                     "to_state": "pending", "actor": "acme", "reason": "order 12"}],
         "workload": {"command": ["python3", "train.py"], "env": {}, "workdir": "",
                      "state": "running",
                      "nodes": [{"node": "gpu01", "node_rank": 0, "state": "running",
                                 "exit_code": None, "started_at": "2026-01-05T10:00:01Z",
                                 "ended_at": None, "error": ""},
                                {"node": "gpu02", "node_rank": 1, "state": "running",
                                 "exit_code": None, "started_at": "2026-01-05T10:00:01Z",
                                 "ended_at": None, "error": ""}]},
         "access": [{"node": "gpu02", "ssh": "ssh -p 2222 ibex-l7@10.0.0.2", "slurm": None},
                    {"node": "gpu01", "ssh": "ssh -p 2222 ibex-l7@10.0.0.1", "slurm": None}],
         "slurm_account": ""}

SLA = {"lease": 7, "terms": {"tier": "on_demand", "availability_target_percent": "99.50",
                             "activation_limit_s": 300, "promised_locality": {"leaf": 1}},
       "measurement": {"availability_percent": "100.0000", "activation_s": 3,
                       "locality_kept": True},
       "cost_so_far": "1.00", "owed": "0.00", "credited": "0.00", "credits": []}

OFFERS = {"count": 2, "results": [
    {"model": "H100-80GB", "fabric": "lab", "gpus": 64, "price_per_gpu_hour": "2.49",
     "max_price_per_gpu_hour": "2.80", "leaf_free": 16, "spine_free": 64,
     "reliability": "0.9990", "mig_profiles": ["1g.10gb"], "shares": True},
    {"model": "A100-80GB", "fabric": "campus", "gpus": 8, "price_per_gpu_hour": "1.20",
     "max_price_per_gpu_hour": "1.20", "leaf_free": 8, "spine_free": 8,
     "reliability": None, "mig_profiles": [], "shares": False}]}

QUOTE = {"fillable": True, "tier": "on_demand", "gpus": 16, "price_per_gpu_hour": "2.00",
         "total": "64.00", "locality": {"leaves": 1, "spines": 1, "max_hops": 2},
         "placement": [{"node": f"gpu0{n}", "index": i} for n in (1, 2) for i in range(8)],
         "reason": ""}

ACCOUNT = {"organization": "acme-ai", "currency": "usd", "available": "68.00",
           "held": "32.00", "payable": "0.00", "held_back": "0.00",
           "spend_limit_per_hour": None, "spend_limit_per_month": "5000.00"}


def invalid(field: str, message: str, status_message: str = "Invalid input.") -> dict:
    return {"error": {"code": "invalid", "message": status_message,
                      "fields": {field: [message]}}}
