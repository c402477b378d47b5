"""MIG: placing GPU instances on the 8 memory-slice positions of one GPU.

A profile occupies positions [start, start + slices) at one of its legal starts (NVIDIA MIG
user guide): 1g at 0-6; 1g double-memory at 0, 2, 4, 6; 2g at 0, 2, 4; 3g at 0, 4; 4g at 0;
7g at 0. Memory sizes are the profile's nominal size (the "Ngb" of its name) in MiB, i.e. the
guide's fraction of memory times the card; nvidia-smi reports slightly less as usable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from market.core.whatif import InvalidInput

POSITIONS = 8
GIB = 1024


@dataclass(frozen=True)
class MigProfile:
    name: str
    compute: int  # the "Ng": sevenths of the SMs
    slices: int  # memory-slice positions occupied
    memory_mib: int
    starts: tuple[int, ...]


@dataclass(frozen=True)
class MigInstance:
    profile: str
    start: int

    def to_json(self) -> dict:
        return {"profile": self.profile, "start": self.start}


@dataclass(frozen=True)
class MigPlacement:
    placed: bool
    instances: tuple[MigInstance, ...] = ()
    reason: str = ""

    def to_json(self) -> dict:
        if self.placed:
            return {"placed": True, "instances": [i.to_json() for i in self.instances]}
        return {"placed": False, "reason": self.reason}


# (compute, slices, legal starts) of each profile shape, keyed by its name without memory.
_SHAPES = {
    "1g": (1, 1, tuple(range(7))),
    "1g-double": (1, 2, (0, 2, 4, 6)),
    "2g": (2, 2, (0, 2, 4)),
    "3g": (3, 4, (0, 4)),
    "4g": (4, 4, (0,)),
    "7g": (7, 8, (0,)),
}


def _model(names: Mapping[str, str]) -> dict[str, MigProfile]:
    profiles = {}
    for shape, name in names.items():
        compute, slices, starts = _SHAPES[shape]
        gigabytes = int(name.split(".")[1].removesuffix("gb"))
        profiles[name] = MigProfile(name, compute, slices, gigabytes * GIB, starts)
    return profiles


def _names(one: str, one_double: str, two: str, three: str, four: str, seven: str):
    return {"1g": one, "1g-double": one_double, "2g": two, "3g": three, "4g": four, "7g": seven}


MIG_MODELS: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _model(_names("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")),
    "A100-80GB": _model(_names("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    "H100-80GB": _model(_names("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    "H200-141GB": _model(
        _names("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
    ),
    "B200-180GB": _model(
        _names("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb")
    ),
}


class _Unplaceable(Exception):
    pass


def profiles_for(model: str) -> dict[str, MigProfile]:
    profiles = MIG_MODELS.get(model)
    if profiles is None:
        raise InvalidInput("model", f"unknown MIG model {model!r}")
    return profiles


def smallest_profile_with(profiles: Mapping[str, MigProfile], memory_mib: int) -> MigProfile:
    """The profile with the least memory that still has `memory_mib`; fewer SMs on a tie."""
    roomy = [p for p in profiles.values() if p.memory_mib >= memory_mib]
    if not roomy:
        raise _Unplaceable(f"no profile has {memory_mib} MiB")
    return min(roomy, key=lambda p: (p.memory_mib, p.compute, p.slices, p.name))


def resolve_request(
    profiles: Mapping[str, MigProfile], request: Sequence[str | Mapping]
) -> list[MigProfile]:
    """Each item is a profile name, {"profile": name} or {"memory_mib": n}."""
    resolved = []
    for position, item in enumerate(request):
        field = f"request[{position}]"
        if isinstance(item, Mapping) and "profile" in item:
            item = item["profile"]
        if isinstance(item, str):
            if item not in profiles:
                raise InvalidInput(field, f"unknown profile {item!r}")
            resolved.append(profiles[item])
        elif isinstance(item, Mapping) and "memory_mib" in item:
            memory = item["memory_mib"]
            if not isinstance(memory, int) or isinstance(memory, bool) or memory < 1:
                raise InvalidInput(f"{field}.memory_mib", "must be a positive integer")
            resolved.append(smallest_profile_with(profiles, memory))
        else:
            raise InvalidInput(field, "must be a profile name or {\"memory_mib\": n}")
    return resolved


def occupied_mask(profiles: Mapping[str, MigProfile], occupied: Sequence[MigInstance]) -> int:
    mask = 0
    for position, instance in enumerate(occupied):
        profile = profiles.get(instance.profile)
        if profile is None:
            raise InvalidInput(f"occupied[{position}].profile",
                               f"unknown profile {instance.profile!r}")
        if instance.start not in profile.starts:
            raise InvalidInput(f"occupied[{position}].start",
                               f"{profile.name} cannot start at {instance.start}")
        bits = _bits(profile, instance.start)
        if mask & bits:
            raise InvalidInput(f"occupied[{position}]", "overlaps another instance")
        mask |= bits
    return mask


def _bits(profile: MigProfile, start: int) -> int:
    return ((1 << profile.slices) - 1) << start


def largest_free_run(mask: int) -> int:
    best = run = 0
    for position in range(POSITIONS):
        run = 0 if mask >> position & 1 else run + 1
        best = max(best, run)
    return best


def place_mig(
    model: str, occupied: Sequence[MigInstance], request: Sequence[str | Mapping]
) -> MigPlacement:
    """Place all requested instances beside `occupied`, or none.

    Exhaustive search over legal starts, so whether a set fits never depends on the order it
    was asked in; the items are searched in a canonical order (largest first), so the answer
    does not either. Among fitting placements, keep the largest contiguous free region; the
    first such in search order (lowest starts) wins.
    """
    profiles = profiles_for(model)
    mask = occupied_mask(profiles, occupied)
    try:
        wanted = resolve_request(profiles, request)
    except _Unplaceable as why:
        return MigPlacement(placed=False, reason=f"{why} on {model}")
    order = sorted(range(len(wanted)), key=lambda i: (-wanted[i].slices, wanted[i].name, i))
    best = _search([wanted[i] for i in order], mask)
    if best is None:
        names = ", ".join(p.name for p in wanted)
        return MigPlacement(placed=False,
                            reason=f"{names} do not fit beside the occupied instances")
    starts = [0] * len(wanted)
    for canonical_position, original_position in enumerate(order):
        starts[original_position] = best[canonical_position]
    return MigPlacement(placed=True, instances=tuple(
        MigInstance(profile.name, start) for profile, start in zip(wanted, starts, strict=True)))


def _search(wanted: list[MigProfile], mask: int) -> list[int] | None:
    best: list[int] | None = None
    best_run = -1
    starts: list[int] = []

    def visit(position: int, used: int) -> None:
        nonlocal best, best_run
        if position == len(wanted):
            run = largest_free_run(used)
            if run > best_run:
                best, best_run = list(starts), run
            return
        profile = wanted[position]
        # Equal profiles are interchangeable: keep their starts ascending to skip repeats.
        lowest = starts[-1] + 1 if position and wanted[position - 1] == profile else 0
        for start in profile.starts:
            bits = _bits(profile, start)
            if start >= lowest and not used & bits:
                starts.append(start)
                visit(position + 1, used | bits)
                starts.pop()

    visit(0, mask)
    return best
