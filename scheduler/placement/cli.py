"""`python -m scheduler.placement gang|mig`: the operator's what-if tool.

Reads one JSON object on stdin, writes one on stdout. Malformed input exits with status 2 and
one line on stderr naming the field; a valid request that cannot be placed exits 0 with
`"placed": false`. Unknown keys are rejected, so a misspelt constraint is never ignored. The
skeleton is shared with `python -m scheduler.clearing` (`market.core.whatif`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO

from market.core.whatif import (
    InvalidInput,
    answer_json,
    read_bool,
    read_int,
    read_list,
    read_object,
    read_text,
    read_texts,
)
from scheduler.core.placement.gang import place_on_index
from scheduler.core.placement.index import PlacementIndex
from scheduler.core.placement.mig import MigInstance, place_mig
from scheduler.core.placement.model import Node, Request, Slice

USAGE = "usage: python -m scheduler.placement {gang|mig} < request.json"

NODE_KEYS = {"name", "labels", "free_gpus", "gpu_model", "state", "healthy", "free_cpu_milli",
             "free_memory_mib", "total_gpus"}
REQUEST_KEYS = {"gpus", "required", "preferred", "slice", "gpu_models", "exclude_nodes",
                "min_cpu_milli_per_gpu", "min_memory_mib_per_gpu"}


def parse_node(raw: Any, position: int) -> Node:
    field = f"nodes[{position}]"
    raw = read_object(raw, field, NODE_KEYS)
    labels = raw.get("labels", {})
    if not isinstance(labels, dict):
        raise InvalidInput(f"{field}.labels", "must be an object")
    for level, label in labels.items():
        read_text(label, f"{field}.labels.{level}")
    healthy = read_bool(raw.get("healthy", True), f"{field}.healthy")
    try:
        return Node(
            name=read_text(raw.get("name"), f"{field}.name"),
            labels=labels,
            free_gpus=read_int(raw.get("free_gpus"), f"{field}.free_gpus"),
            gpu_model=read_text(raw.get("gpu_model"), f"{field}.gpu_model", optional=True) or "",
            state=read_text(raw.get("state", "up"), f"{field}.state"),
            healthy=healthy,
            free_cpu_milli=read_int(raw.get("free_cpu_milli"), f"{field}.free_cpu_milli",
                                    optional=True),
            free_memory_mib=read_int(raw.get("free_memory_mib"), f"{field}.free_memory_mib",
                                     optional=True),
            total_gpus=read_int(raw.get("total_gpus"), f"{field}.total_gpus", optional=True),
        )
    except InvalidInput as error:
        if error.field.startswith(field):
            raise
        raise InvalidInput(f"{field}.{error.field}", error.message) from None


def parse_request(raw: Any) -> Request:
    raw = read_object(raw, "request", REQUEST_KEYS)
    slice_ = None
    if raw.get("slice") is not None:
        raw_slice = read_object(raw["slice"], "request.slice", {"size", "level"})
        slice_ = Slice(size=read_int(raw_slice.get("size"), "request.slice.size", minimum=1),
                       level=read_text(raw_slice.get("level"), "request.slice.level"))
    models = raw.get("gpu_models")
    return Request(
        gpus=read_int(raw.get("gpus"), "request.gpus", minimum=1),
        required=read_text(raw.get("required"), "request.required", optional=True),
        preferred=read_text(raw.get("preferred"), "request.preferred", optional=True),
        slice=slice_,
        gpu_models=None if models is None else frozenset(read_texts(models, "request.gpu_models")),
        exclude_nodes=frozenset(read_texts(raw.get("exclude_nodes", []), "request.exclude_nodes")),
        min_cpu_milli_per_gpu=read_int(raw.get("min_cpu_milli_per_gpu", 0),
                                       "request.min_cpu_milli_per_gpu"),
        min_memory_mib_per_gpu=read_int(raw.get("min_memory_mib_per_gpu", 0),
                                        "request.min_memory_mib_per_gpu"),
    )


def run_gang(document: Any) -> dict:
    document = read_object(document, "input", {"levels", "nodes", "request", "profile"})
    levels = read_texts(document.get("levels"), "levels")
    raw_nodes = read_list(document.get("nodes"), "nodes")
    nodes = [parse_node(raw, i) for i, raw in enumerate(raw_nodes)]
    request = parse_request(document.get("request"))
    profile = read_text(document.get("profile"), "profile", optional=True) or "best_fit"
    index = PlacementIndex(levels, nodes)
    return place_on_index(index, request, profile).to_json()


def run_mig(document: Any) -> dict:
    document = read_object(document, "input", {"model", "occupied", "request"})
    model = read_text(document.get("model"), "model")
    raw_occupied = read_list(document.get("occupied", []), "occupied")
    occupied = []
    for i, raw in enumerate(raw_occupied):
        raw = read_object(raw, f"occupied[{i}]", {"profile", "start"})
        occupied.append(MigInstance(read_text(raw.get("profile"), f"occupied[{i}].profile"),
                                    read_int(raw.get("start"), f"occupied[{i}].start")))
    request = read_list(document.get("request"), "request")
    return place_mig(model, occupied, request).to_json()


COMMANDS: dict[str, Callable[[Any], dict]] = {"gang": run_gang, "mig": run_mig}


def main(argv: list[str], stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    if len(argv) != 1 or argv[0] not in COMMANDS:
        print(USAGE, file=stderr)
        return 2
    return answer_json(COMMANDS[argv[0]], stdin, stdout, stderr)
