"""Gang placement over a capacity tree: profiles `best_fit` (default), `least_free`, `spread`.

Vocabulary: a *scope* is the one domain the whole request must fit in (rules 1-2); *units* are
what must fit: GPUs, or whole slices of `slice.size` GPUs when the request is sliced. Every
choice among domains uses an explicit key ending in the domain's path, so the answer never
depends on input order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from fabric.core.locality import max_hops
from market.core.whatif import InvalidInput
from scheduler.core.placement.fgd import scorer_for
from scheduler.core.placement.filters import (
    count_static_exclusions,
    merge_counts,
    needs_node_filters,
    withheld_gpus,
)
from scheduler.core.placement.model import Placement, Request
from scheduler.core.placement.tree import CapacityTree, Domain

Assignment = dict[str, int]


class CapacityView:
    """Free capacity of domains as one request sees it: its GPU models, its slice size."""

    def __init__(self, index: CapacityTree, request: Request):
        self.index = index
        models = request.gpu_models
        self.models = None if models is None or models >= index.models else sorted(models)
        self.slice_size = request.slice_size
        self.slice_depth = (
            index.node_depth
            if request.slice is None
            else index.depth_of(request.slice.level, "request.slice.level")
        )
        self._units: dict[int, int] = {}
        self.scorer = scorer_for(request.mix) if request.mix else None

    def gpus(self, domain: Domain) -> int:
        if self.models is None:
            return sum(domain.free.values())
        return sum(domain.free.get(model, 0) for model in self.models)

    def whole(self, domain: Domain) -> bool:
        """No GPU of the domain (of the request's models) is taken: a wholly free cell."""
        if self.models is None:
            total = sum(domain.total.values())
            return total > 0 and sum(domain.free.values()) == total
        total = sum(domain.total.get(model, 0) for model in self.models)
        return total > 0 and self.gpus(domain) == total

    def node_hist(self, domain: Domain) -> list[int]:
        """Count of usable nodes under `domain` by free GPUs."""
        models = domain.hist.keys() if self.models is None else self.models
        hists = [domain.hist[model] for model in models if model in domain.hist]
        if len(hists) == 1:
            return hists[0]
        return [sum(column) for column in zip(*hists, strict=True)] if hists else []

    def units(self, domain: Domain) -> int:
        """Whole slices that fit in `domain` (GPUs for an unsliced request)."""
        if self.slice_size == 1 or domain.depth >= self.slice_depth:
            return self.gpus(domain) // self.slice_size
        cached = self._units.get(id(domain))
        if cached is None:
            if self.slice_depth == self.index.node_depth:
                k = self.slice_size
                cached = sum(count * (free // k) for free, count in
                             enumerate(self.node_hist(domain)))
            else:
                cached = sum(self.units(child) for child in domain.children)
            self._units[id(domain)] = cached
        return cached


# --- score plugins: how candidates are ranked (the lowest key wins; the path breaks ties) -

Capacity = Callable[[Domain], int]
ScoreKey = Callable[[Domain], tuple]


def tightest_fit(capacity: Capacity, gpus: Capacity) -> ScoreKey:
    """Best fit: the least free capacity, then the fewest free GPUs (fewest stranded)."""
    return lambda domain: (capacity(domain), gpus(domain), domain.path)


def roomiest_first(capacity: Capacity, gpus: Capacity) -> ScoreKey:
    """For splitting: the most free capacity first, so the fewest domains are used."""
    return lambda domain: (-capacity(domain), gpus(domain), domain.path)


def smallest_gap_first(gpus: Capacity) -> ScoreKey:
    """For packing: the fewest free GPUs first, so wholly free nodes stay whole."""
    return lambda domain: (gpus(domain), domain.path)


# --- searching the tree -------------------------------------------------------------------


def best_fit_node(view: CapacityView, scope: Domain, need_gpus: int) -> Domain | None:
    """The node under `scope` with the fewest free GPUs that still holds `need_gpus` (with a
    mix of expected requests: the free count whose fragmentation grows least, FGD).

    Reads the free-GPU histograms top-down instead of visiting nodes. Among equally tight
    nodes it descends into broken domains before whole ones, then the tightest (fewest free
    GPUs), then the first by path: small jobs pack into already-broken leaves and spines, so
    whole ones stay whole for jobs that need them (HiveD's buddy cells).
    """
    hist = view.node_hist(scope)
    fitting = [v for v in range(need_gpus, len(hist)) if hist[v]]
    if not fitting:
        return None
    free = fitting[0]
    if view.scorer is not None and len(fitting) > 1:
        # FGD: the node state whose fragmentation against the mix grows least, then the
        # tightest; nodes in one state are interchangeable, so at most 9 states are scored
        free = min(fitting, key=lambda v: (round(view.scorer.whole_node_growth(v, need_gpus),
                                                 6), v))
    domain = scope
    while domain.children:
        holding = [c for c in domain.children if _has_node_with(view, c, free)]
        domain = holding[0] if len(holding) == 1 else min(holding, key=broken_tightest(view))
    return domain


def broken_tightest(view: CapacityView) -> ScoreKey:
    """A broken domain before a whole one, then the fewest free GPUs, then the path."""
    return lambda domain: (view.whole(domain), view.gpus(domain), domain.path)


def _has_node_with(view: CapacityView, domain: Domain, free: int) -> bool:
    hist = view.node_hist(domain)
    return free < len(hist) and hist[free] > 0


def most_free_on_one_node(view: CapacityView, scope: Domain) -> int:
    hist = view.node_hist(scope)
    return max((free for free, count in enumerate(hist) if count), default=0)


def domains_under(index: CapacityTree, scope: Domain, depth: int) -> Iterator[Domain]:
    """Domains at `depth` inside `scope`, in path order."""
    if scope.depth >= depth:
        yield scope
    elif scope.depth == 0:
        yield from index.by_depth[depth]
    else:
        for child in scope.children:
            yield from domains_under(index, child, depth)


def choose_scope(
    view: CapacityView, depth: int, need: int, units: Capacity | None = None,
    compact: bool = False,
) -> tuple[Domain | None, int]:
    """Rule 1: the best-fit domain at `depth` that holds `need` units, and the most any held.

    `units` defaults to the view's (GPUs or slices); the spread profile counts domains.
    `compact` (best_fit): above the leaf level, the domain whose leaves hold it in the fewest
    leaves, then breaking the fewest whole leaves, then the tightest; at the leaf level, a
    broken leaf before a whole one, then the tightest."""
    index = view.index
    if units is None and depth == index.node_depth:
        k = view.slice_size
        most = most_free_on_one_node(view, index.root) // k
        return best_fit_node(view, index.root, need * k), most
    compact = compact and units is None and leaf_compact(view)
    units = units or view.units
    domains = index.by_depth[depth]
    most = max((units(domain) for domain in domains), default=0)
    fitting = [domain for domain in domains if units(domain) >= need]
    if not fitting:
        return None, most
    if not compact:
        return min(fitting, key=tightest_fit(units, view.gpus)), most
    if depth == leaf_depth(index):
        return min(fitting, key=lambda d: (view.whole(d), units(d), view.gpus(d), d.path)), most
    if len(fitting) == 1:
        return fitting[0], most
    plans = {id(d): plan_leaves(view, d, need) for d in fitting}
    return min(fitting, key=lambda d: (plans[id(d)][0], plans[id(d)][1], units(d),
                                       view.gpus(d), d.path)), most


# --- compact multi-node placement: the fewest leaves, the most whole leaves left -----------


def leaf_depth(index: CapacityTree) -> int:
    """The level just above the nodes (0, the root, when the tree names no switch level)."""
    return index.node_depth - 1


def leaf_compact(view: CapacityView) -> bool:
    """Whether leaves can be counted for this request: a switch level exists and whole
    slices are counted at or below the leaf level."""
    depth = leaf_depth(view.index)
    return depth >= 1 and view.slice_depth >= depth


def plan_leaves(view: CapacityView, scope: Domain, need: int) -> tuple[int, int, list, list]:
    """The fewest leaves under `scope` that hold `need` units and the fewest whole leaves such
    a set must break, with the broken and the whole leaves, each roomiest first; the counts
    are larger than any real one when the scope does not hold it."""
    leaves = [d for d in domains_under(view.index, scope, leaf_depth(view.index))
              if view.units(d) > 0]
    order = roomiest_first(view.units, view.gpus)
    broken = sorted((d for d in leaves if not view.whole(d)), key=order)
    whole = sorted((d for d in leaves if view.whole(d)), key=order)
    fewest = held = 0
    for units in sorted((view.units(d) for d in leaves), reverse=True):
        if held >= need:
            break
        held += units
        fewest += 1
    if held < need:
        return len(leaves) + 1, len(leaves) + 1, broken, whole
    broken_sums = _prefix_sums(view.units(d) for d in broken)
    whole_sums = _prefix_sums(view.units(d) for d in whole)
    for breaks in range(fewest + 1):
        rest = fewest - breaks
        if (breaks < len(whole_sums) and rest < len(broken_sums)
                and whole_sums[breaks] + broken_sums[rest] >= need):
            return fewest, breaks, broken, whole
    raise AssertionError("the fewest leaves were counted from these leaves")


def _prefix_sums(values: Iterable[int]) -> list[int]:
    out = [0]
    for value in values:
        out.append(out[-1] + value)
    return out


def fill_fewest_leaves(view: CapacityView, scope: Domain, need: int, out: Assignment) -> None:
    """Split `need` units over the fewest leaves of `scope`, breaking the fewest whole leaves:
    the roomiest of the chosen leaves are taken whole until the rest fits in one leaf, which
    is the tightest that holds it among the broken leaves left (and the whole ones, while the
    count of whole leaves to break allows)."""
    fewest, breaks, broken, whole = plan_leaves(view, scope, need)
    chosen = sorted(whole[:breaks] + broken[:fewest - breaks],
                    key=roomiest_first(view.units, view.gpus))
    used: set[int] = set()
    remaining = need
    while remaining:
        pool = [d for d in broken if id(d) not in used]
        if breaks:
            pool += [d for d in whole if id(d) not in used]
        fitting = [d for d in pool if view.units(d) >= remaining]
        if fitting:
            leaf = min(fitting, key=tightest_fit(view.units, view.gpus))
            fill_units(view, leaf, remaining, out)
            return
        leaf = chosen.pop(0)
        used.add(id(leaf))
        breaks -= view.whole(leaf)
        fill_units(view, leaf, view.units(leaf), out)
        remaining -= view.units(leaf)


# --- filling a chosen domain (rule 4) ---------------------------------------------------


def fill_units(view: CapacityView, domain: Domain, need: int, out: Assignment) -> None:
    """Rule 4 in units, down to the slice level; below it, whole GPUs."""
    if domain.depth >= view.slice_depth:
        fill_gpus(view, domain, need * view.slice_size, out)
        return
    children = [c for c in domain.children if view.units(c) > 0]
    split_among_children(children, need, view.units, view.gpus,
                         lambda child, share: fill_units(view, child, share, out))


def fill_gpus(view: CapacityView, domain: Domain, need: int, out: Assignment) -> None:
    if not domain.children:
        out[domain.name] = need
        return
    children = [c for c in domain.children if view.gpus(c) > 0]
    split_among_children(children, need, view.gpus, view.gpus,
                         lambda child, share: fill_gpus(view, child, share, out))


def split_among_children(
    children: list[Domain],
    need: int,
    capacity: Capacity,
    gpus: Capacity,
    give: Callable[[Domain, int], None],
) -> None:
    """If one child holds `need`, the tightest such child takes it; otherwise the roomiest
    children are taken whole until the rest fits in one child, which is again the tightest.
    This uses the fewest children, and leaves the roomy ones whole when it can."""
    queue = sorted(children, key=roomiest_first(capacity, gpus))
    remaining = need
    while remaining:
        fitting = [c for c in queue if capacity(c) >= remaining]
        if fitting:
            give(min(fitting, key=tightest_fit(capacity, gpus)), remaining)
            return
        if not queue:
            raise AssertionError("capacity was checked before filling")
        roomiest = queue.pop(0)
        give(roomiest, capacity(roomiest))
        remaining -= capacity(roomiest)


def fill_smallest_gaps(view: CapacityView, scope: Domain, need_gpus: int, out: Assignment) -> None:
    """Rule 3: nodes in ascending order of free GPUs, so wholly free nodes stay whole."""
    nodes = [n for n in domains_under(view.index, scope, view.index.node_depth) if view.gpus(n)]
    nodes.sort(key=smallest_gap_first(view.gpus))
    remaining = need_gpus
    for node in nodes:
        take = min(view.gpus(node), remaining)
        out[node.name] = take
        remaining -= take
        if not remaining:
            return
    raise AssertionError("capacity was checked before filling")


def fill_grains(view: CapacityView, need: int, grains: list[Domain], out: Assignment) -> None:
    """least_free with slices: slice-level domains, the tightest that holds it all, else
    ascending by free slices, each taking what it can."""
    fitting = [g for g in grains if view.units(g) >= need]
    if fitting:
        best = min(fitting, key=tightest_fit(view.units, view.gpus))
        fill_gpus(view, best, need * view.slice_size, out)
        return
    remaining = need
    for grain in sorted(grains, key=tightest_fit(view.units, view.gpus)):
        take = min(view.units(grain), remaining)
        if take:
            fill_gpus(view, grain, take * view.slice_size, out)
            remaining -= take
        if not remaining:
            return
    raise AssertionError("capacity was checked before filling")


# --- profiles ----------------------------------------------------------------------------


class Refusal(Exception):
    """A valid request that cannot be placed; `reason` is what the tenant reads."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def scope_depths(index: CapacityTree, request: Request) -> tuple[list[int], int | None]:
    """Depths to try, narrowest first, and the required depth (None when not required)."""
    required = (
        None if request.required is None else index.depth_of(request.required, "request.required")
    )
    preferred = (
        None
        if request.preferred is None
        else index.depth_of(request.preferred, "request.preferred")
    )
    if required is not None and preferred is not None and preferred < required:
        raise InvalidInput("request.preferred", "must be at or below the required level")
    if preferred is not None:
        return list(range(preferred, (required or 0) - 1, -1)), required
    if required is not None:
        return [required], required
    return [], None


def find_scope(
    view: CapacityView, request: Request, need: int, what: str, units: Capacity | None = None,
    compact: bool = False,
) -> Domain:
    """Rules 1 and 2: the narrowest level with a domain that holds it, best fit at that level;
    the whole topology when the request names no level (with `compact`, the narrowest level
    from the node up, as `preferred: node`)."""
    index = view.index
    depths, required = scope_depths(index, request)
    if not depths:
        depths = list(range(index.node_depth, -1, -1)) if compact else [0]
    most = 0
    for depth in depths:
        scope, most = choose_scope(view, depth, need, units, compact)
        if scope is not None:
            return scope
    within = "" if required is None else f" within one {index.levels[required - 1]}"
    raise Refusal(f"only {most} of {need} {what}{within}")


def place_best_fit(view: CapacityView, request: Request) -> Assignment:
    """Rules 1-5: the narrowest allowed scope (from the node up when the request names no
    level), chosen and filled compactly: above the leaf level the fewest leaves, breaking the
    fewest whole leaves; within a leaf, level by level (rule 4)."""
    out: Assignment = {}
    need = request.units
    scope = find_scope(view, request, need, f"{request.unit_name} fit", compact=True)
    if scope.depth < leaf_depth(view.index) and leaf_compact(view):
        fill_fewest_leaves(view, scope, need, out)
    else:
        fill_units(view, scope, need, out)
    return out


def place_least_free(view: CapacityView, request: Request) -> Assignment:
    """Pack into the nodes (or slice domains) with the least free capacity inside the scope,
    ignoring the levels between: fewest stranded GPUs, at the cost of more leaves."""
    out: Assignment = {}
    need = request.units
    scope = find_scope(view, request, need, f"{request.unit_name} fit")
    if request.slice is None:
        node = best_fit_node(view, scope, need)
        if node is not None:
            out[node.name] = need
        else:
            fill_smallest_gaps(view, scope, need, out)
        return out
    grains = [g for g in domains_under(view.index, scope, view.slice_depth) if view.units(g)]
    fill_grains(view, need, grains, out)
    return out


def place_spread(view: CapacityView, request: Request) -> Assignment:
    """One group of `slice.size` GPUs (default 1) per domain of `slice.level` (default the
    node level), so replicas share no failure domain; the tightest domains are used first."""
    index = view.index
    group, spread_depth = view.slice_size, view.slice_depth
    spread_level = index.levels[spread_depth - 1]
    for depth in scope_depths(index, request)[0]:
        if depth >= spread_depth:
            raise InvalidInput("request.slice.level", "spread needs a level below the scope")
    counted: dict[int, int] = {}

    def groups_in(domain: Domain) -> int:
        if id(domain) not in counted:
            if spread_depth == index.node_depth:
                counted[id(domain)] = sum(view.node_hist(domain)[group:])
            else:
                counted[id(domain)] = sum(
                    1 for d in domains_under(index, domain, spread_depth) if view.gpus(d) >= group
                )
        return counted[id(domain)]

    need = request.units
    scope = find_scope(view, request, need, f"slices fit one per {spread_level}", groups_in)
    hosts = [d for d in domains_under(index, scope, spread_depth) if view.gpus(d) >= group]
    hosts.sort(key=smallest_gap_first(view.gpus))
    out: Assignment = {}
    for host in hosts[:need]:
        fill_gpus(view, host, group, out)
    return out


PROFILES: dict[str, Callable[[CapacityView, Request], Assignment]] = {
    "best_fit": place_best_fit,
    "least_free": place_least_free,
    "spread": place_spread,
}


def place_on_index(
    index: CapacityTree, request: Request, profile: str = "best_fit"
) -> Placement:
    """Place `request` against `index` without committing it."""
    strategy = PROFILES.get(profile)
    if strategy is None:
        raise InvalidInput("profile", f"unknown profile {profile!r}")
    scope_depths(index, request)  # validates level names before anything is withheld
    view = CapacityView(index, request)
    withheld, excluded_per_node = (
        withheld_gpus(index, request) if needs_node_filters(request) else ({}, {})
    )
    excluded = merge_counts(count_static_exclusions(index, request), excluded_per_node)
    index.commit(withheld)
    try:
        assignment = strategy(view, request)
    except Refusal as refusal:
        return Placement(placed=False, reason=_with_exclusions(refusal.reason, excluded),
                         excluded=excluded)
    finally:
        index.release(withheld)
    return describe(index, assignment, excluded)


def _with_exclusions(reason: str, excluded: dict[str, int]) -> str:
    if not excluded:
        return reason
    return reason + "; excluded: " + ", ".join(f"{name}: {n}" for name, n in excluded.items())


def describe(index: CapacityTree, assignment: Assignment, excluded: dict[str, int]) -> Placement:
    paths = sorted(index.node_domains[name].path for name, gpus in assignment.items() if gpus)
    ordered = {path[-1]: assignment[path[-1]] for path in paths}
    domains: dict[str, tuple[str, ...]] = {}
    for position, level in enumerate(index.levels):
        domains[level] = tuple(dict.fromkeys(path[position] for path in paths))
    return Placement(placed=True, assignment=ordered, domains=domains,
                     max_hops=max_hops(paths), excluded=excluded)
