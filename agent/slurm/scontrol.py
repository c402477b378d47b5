"""Parse what Slurm says about its nodes and switches into plain dataclasses.

Three inputs, all text, so the parsers can be tested on captured output:

* ``scontrol show nodes`` (the text form, one ``Key=Value`` block per node, or one line per node
  with ``-o``; ``-d`` adds ``GresUsed``);
* the JSON node list: ``sinfo --json`` on Slurm 22.05 (which has no ``scontrol --json``) and
  ``scontrol show nodes --json`` from 23.02 on; both hold ``{"nodes": [...]}``;
* ``scontrol show topology`` (``SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[001-002]``).

Nothing here runs a command: the caller runs Slurm and hands the text over.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from fabric.core.hostlist import expand_hostlist

# Slurm GRES types (lower case, as written in gres.conf) -> IBEX GPU model names
# (pool/core/catalogue.py). A type that is not here is reported, never guessed.
DEFAULT_GPU_MODELS: Mapping[str, str] = {
    "a100": "A100-80GB",
    "a100_80gb": "A100-80GB",
    "a100-80gb": "A100-80GB",
    "a100_40gb": "A100-40GB",
    "a100-40gb": "A100-40GB",
    "h100": "H100-80GB",
    "h100_80gb": "H100-80GB",
    "h100-80gb": "H100-80GB",
    "h200": "H200-141GB",
    "b200": "B200-180GB",
    "l40s": "L40S-48GB",
}

# Base states and flags that decide whether a node can be offered; any other word Slurm prints
# is kept too (the set is Slurm's words, upper case), so nothing is lost.
UNAVAILABLE_STATES = frozenset({"DOWN", "DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING",
                                "NOT_RESPONDING", "MAINTENANCE", "REBOOT_REQUESTED",
                                "POWERED_DOWN", "FUTURE", "UNKNOWN", "INVAL"})


class SlurmParseError(ValueError):
    pass


class UnknownGpuType(LookupError):
    """A GRES type with no IBEX GPU model: reported so a person adds it to the mapping."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    states: frozenset[str]
    reason: str = ""
    cpus: int | None = None
    memory_mib: int | None = None
    # GRES type -> count ("" for a GPU GRES with no type: ``gpu:8``).
    gpus: dict[str, int] = field(default_factory=dict)
    # Same keys; None when Slurm did not say (``GresUsed`` only comes with ``scontrol -d``).
    gpus_used: dict[str, int] | None = None

    @property
    def gpu_count(self) -> int:
        return sum(self.gpus.values())

    @property
    def available(self) -> bool:
        """True when no state says the node cannot take work (IDLE, MIXED, ALLOCATED...)."""
        return not (self.states & UNAVAILABLE_STATES)


@dataclass(frozen=True)
class SlurmSwitch:
    name: str
    level: int
    link_speed: int | None
    nodes: tuple[str, ...]
    switches: tuple[str, ...]


@dataclass(frozen=True)
class SlurmTopology:
    switches: dict[str, SlurmSwitch]

    @property
    def leaves(self) -> list[SlurmSwitch]:
        """Switches with nodes cabled straight to them (Slurm's level 0)."""
        return [s for s in self.switches.values() if s.level == 0]

    def parent_of(self, switch: str) -> SlurmSwitch | None:
        for candidate in self.switches.values():
            if switch in candidate.switches:
                return candidate
        return None

    @property
    def roots(self) -> list[SlurmSwitch]:
        return [s for s in self.switches.values() if self.parent_of(s.name) is None]

    def leaf_of(self, node: str) -> SlurmSwitch | None:
        for leaf in self.leaves:
            if node in leaf.nodes:
                return leaf
        return None


# -- GRES -------------------------------------------------------------------------------------

# One GRES entry: ``gpu``, ``gpu:8``, ``gpu:h100:8``, each optionally followed by ``(S:0-1)``
# (sockets, in Gres=) or ``(IDX:0-2)`` (indexes, in GresUsed=). Entries are comma separated,
# but the parentheses may hold commas too (``(IDX:0,2)``), hence the splitting by hand.
_GRES_ENTRY = re.compile(r"^(?P<name>[^:()]+)(?::(?P<type>[^:()]+))?(?::(?P<count>\d+))?"
                         r"(?:\((?P<extra>[^)]*)\))?$")


def _split_gres(value: str) -> list[str]:
    entries, depth, current = [], 0, ""
    for ch in value:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += ch
    entries.append(current)
    return [e.strip() for e in entries if e.strip()]


def parse_gpu_gres(value: str | None) -> dict[str, int]:
    """GPU counts by type from a GRES string; other GRES (``shard``, ``mps``...) are skipped.

    ``gpu:h100:8(S:0-1)`` -> {"h100": 8}; ``gpu:8`` -> {"": 8}; ``gpu:h100`` counts one, as in
    Slurm. ``(null)``, ``N/A`` and empty mean no GPUs.
    """
    counts: dict[str, int] = {}
    if not value or value in ("(null)", "N/A"):
        return counts
    for entry in _split_gres(value):
        match = _GRES_ENTRY.match(entry)
        if match is None:
            raise SlurmParseError(f"unreadable GRES entry {entry!r} in {value!r}")
        if match["name"] != "gpu":
            continue
        gres_type, count = match["type"], match["count"]
        # ``gpu:8`` has the count where a type would be.
        if count is None and gres_type is not None and gres_type.isdigit():
            gres_type, count = None, gres_type
        key = (gres_type or "").lower()
        counts[key] = counts.get(key, 0) + (int(count) if count is not None else 1)
    return counts


def gpu_model_for(gres_type: str, mapping: Mapping[str, str] = DEFAULT_GPU_MODELS) -> str:
    """The IBEX GPU model of a Slurm GRES type; UnknownGpuType when the mapping lacks it."""
    key = gres_type.lower()
    if key not in mapping:
        shown = gres_type or "(no type: gpu:N)"
        raise UnknownGpuType(f"Slurm GPU type {shown} has no IBEX GPU model; add it to the "
                             f"mapping (known: {', '.join(sorted(mapping))})")
    return mapping[key]


# -- nodes, text form -------------------------------------------------------------------------

# Keys whose values may hold spaces, and so run to the end of their line: ``Reason=fan failure
# [root@2026-12-03T08:01:00]`` and ``OS=Linux 6.1 #1 SMP``. In the one-line form (``-o``) they
# run up to the next known key instead.
_RUNS_TO_END = ("Reason", "OS", "Comment", "Extra")
_KEY = re.compile(r"(?:^|\s)([A-Za-z_]+)=")
_REASON_SUFFIX = re.compile(r"\s*\[[^\]]*@[^\]]*\]$")


def _fields(block: str) -> dict[str, str]:
    """``Key=Value`` pairs of one node block, with the multi-word keys kept whole."""
    found: dict[str, str] = {}
    matches = list(_KEY.finditer(block))
    for i, match in enumerate(matches):
        key = match.group(1)
        start = match.end()
        end = matches[i + 1].start() if i + 1 < len(matches) else len(block)
        value = block[start:end]
        if key not in _RUNS_TO_END:
            value = value.split()[0] if value.split() else ""
        found[key] = value.strip()
    return found


def _merge_multiword(block: str) -> dict[str, str]:
    # A multi-word value could look like it holds a key (``Reason=x y=z``): in the block form
    # Reason= and OS= start their own lines, so such a line is taken whole.
    found: dict[str, str] = {}
    for line in block.splitlines():
        stripped = line.strip()
        for key in _RUNS_TO_END:
            if stripped.startswith(key + "="):
                found[key] = stripped[len(key) + 1:].strip()
                break
        else:
            found.update(_fields(stripped))
    return found


def _int(value: str | None) -> int | None:
    if value is None or not value.strip().lstrip("-").isdigit():
        return None
    return int(value)


def _states(value: str) -> frozenset[str]:
    # ``IDLE+DRAIN``, ``DOWN*`` (the * means not responding), ``MIXED+DRAIN+RESERVED``.
    words = set()
    for part in value.split("+"):
        part = part.strip()
        if part.endswith("*"):
            words.add("NOT_RESPONDING")
            part = part[:-1]
        if part.endswith("$"):  # in a maintenance reservation
            words.add("MAINTENANCE")
            part = part[:-1]
        if part:
            words.add(part.upper())
    return frozenset(words)


def _clean_reason(value: str | None) -> str:
    if not value or value in ("(null)", "none", "None"):
        return ""
    # Slurm appends who set it and when: ``fan failure [root@2026-12-03T08:01:00]``.
    return _REASON_SUFFIX.sub("", value).strip()


def parse_nodes_text(text: str) -> list[SlurmNode]:
    """Nodes from ``scontrol show nodes`` (blocks or ``-o`` lines, with or without ``-d``)."""
    text = text.strip()
    if not text or text.startswith("No nodes in the system"):
        return []
    blocks = re.split(r"(?m)^(?=NodeName=)", text)
    nodes = []
    for block in blocks:
        block = block.strip()
        if not block:
            continue
        fields = _merge_multiword(block) if "\n" in block else _fields(block)
        if "NodeName" not in fields or "State" not in fields:
            raise SlurmParseError(f"node block without NodeName= or State=: {block[:80]!r}")
        used = fields.get("GresUsed")
        nodes.append(SlurmNode(
            name=fields["NodeName"],
            states=_states(fields["State"]),
            reason=_clean_reason(fields.get("Reason")),
            cpus=_int(fields.get("CPUTot")),
            memory_mib=_int(fields.get("RealMemory")),
            gpus=parse_gpu_gres(fields.get("Gres")),
            gpus_used=parse_gpu_gres(used) if used is not None else None,
        ))
    return nodes


# -- nodes, JSON form -------------------------------------------------------------------------

def _json_int(value) -> int | None:
    # From data_parser v0.0.40 on, numbers come as {"set": true, "infinite": false, "number": N}.
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_nodes_json(text: str) -> list[SlurmNode]:
    """Nodes from ``sinfo --json`` (22.05) or ``scontrol show nodes --json`` (23.02 on)."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), list):
        raise SlurmParseError("JSON without a \"nodes\" list")
    nodes = []
    for item in document["nodes"]:
        name = item.get("name")
        if not name:
            raise SlurmParseError(f"JSON node without a name: {str(item)[:80]}")
        # 22.05: "state": "idle" and "state_flags": ["DRAIN"]; 23.02 on: "state": ["IDLE", "DRAIN"].
        state = item.get("state")
        words = list(state) if isinstance(state, list) else [state] if state else []
        words += item.get("state_flags") or []
        used = item.get("gres_used")
        nodes.append(SlurmNode(
            name=name,
            states=frozenset(str(w).upper() for w in words),
            reason=_clean_reason(item.get("reason")),
            cpus=_json_int(item.get("cpus")),
            memory_mib=_json_int(item.get("real_memory")),
            gpus=parse_gpu_gres(item.get("gres")),
            gpus_used=parse_gpu_gres(used) if used is not None else None,
        ))
    return nodes


# -- topology ---------------------------------------------------------------------------------

def parse_topology(text: str) -> SlurmTopology:
    """Switches from ``scontrol show topology`` (the tree plugin's one line per switch)."""
    switches: dict[str, SlurmSwitch] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        fields = _fields(line)
        if "SwitchName" not in fields:
            raise SlurmParseError(f"line {number}: no SwitchName= in {line!r}")
        level = _int(fields.get("Level"))
        if level is None:
            raise SlurmParseError(f"line {number}: no Level= in {line!r}")
        name = fields["SwitchName"]
        switches[name] = SlurmSwitch(
            name=name,
            level=level,
            link_speed=_int(fields.get("LinkSpeed")),
            nodes=tuple(expand_hostlist(fields["Nodes"])) if fields.get("Nodes") else (),
            switches=tuple(expand_hostlist(fields["Switches"])) if fields.get("Switches") else (),
        )
    return SlurmTopology(switches=switches)


def topology_conf(topology: SlurmTopology) -> str:
    """The topology as a `topology.conf` (tree) for IBEX's fabric import: leaves list their
    nodes, higher switches their switches, as Slurm's own file does."""
    lines = []
    for switch in sorted(topology.switches.values(), key=lambda s: (s.level, s.name)):
        if switch.switches:
            lines.append(f"SwitchName={switch.name} Switches={','.join(switch.switches)}")
        else:
            lines.append(f"SwitchName={switch.name} Nodes={','.join(switch.nodes)}")
    return "\n".join(lines) + "\n"


# -- reservations and jobs, one-line form (-o) ------------------------------------------------


@dataclass(frozen=True)
class SlurmReservation:
    name: str
    nodes: frozenset[str]
    start: str  # as Slurm prints it: 2026-12-03T10:31:16 (the controller's local time)
    end: str
    accounts: str  # "" when none
    users: str
    state: str  # ACTIVE or INACTIVE (not started yet)


def _null(value: str | None) -> str:
    return "" if value in (None, "(null)", "N/A") else value


def parse_reservations_text(text: str) -> list[SlurmReservation]:
    """``scontrol -o show reservation``: one reservation a line ("No reservations in the
    system" when there is none)."""
    reservations = []
    for line in text.splitlines():
        if not line.startswith("ReservationName="):
            continue
        fields = _fields(line)
        nodes = _null(fields.get("Nodes"))
        reservations.append(SlurmReservation(
            name=fields["ReservationName"],
            nodes=frozenset(expand_hostlist(nodes)) if nodes else frozenset(),
            start=fields.get("StartTime", ""), end=fields.get("EndTime", ""),
            accounts=_null(fields.get("Accounts")), users=_null(fields.get("Users")),
            state=fields.get("State", ""),
        ))
    return reservations


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str
    user: str
    reservation: str  # "" when none
    gpus: dict[str, tuple[int, ...]]  # node -> the GPU indexes the job holds there


# ``Nodes=n003 CPU_IDs=0 Mem=2048 GRES=gpu:h100:3(IDX:0-2)``: one per node group of a job, with -d
_JOB_NODES = re.compile(r"\bNodes=(?P<nodes>\S+) CPU_IDs=\S+ Mem=\S+ GRES=(?P<gres>\S*)")
_GPU_IDX = re.compile(r"gpu(?::[^:(]+)?(?::\d+)?\(IDX:(?P<idx>[^)]*)\)")


def _index_list(text: str) -> tuple[int, ...]:
    indexes: list[int] = []
    for part in text.split(","):
        if not part or part == "N/A":
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise SlurmParseError(f"unreadable GPU index list {text!r}")
        indexes.extend(range(int(low), int(high or low) + 1))
    return tuple(sorted(set(indexes)))


def parse_jobs_text(text: str) -> list[SlurmJob]:
    """``scontrol -d -o show job``: one job a line, its GPUs per node from the detail part."""
    jobs = []
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        fields = _fields(line)
        gpus: dict[str, tuple[int, ...]] = {}
        for match in _JOB_NODES.finditer(line):
            held = tuple(i for m in _GPU_IDX.finditer(match["gres"]) for i in _index_list(m["idx"]))
            if held:
                for node in expand_hostlist(match["nodes"]):
                    gpus[node] = held
        jobs.append(SlurmJob(
            job_id=fields["JobId"], state=fields.get("JobState", ""),
            user=fields.get("UserId", "").split("(")[0],
            reservation=_null(fields.get("Reservation")), gpus=gpus,
        ))
    return jobs
