"""Replacement GPUs for leases that must leave some of theirs (a failed GPU, a drained node).

One pass of remediation or draining builds one `FreeIndex` (three queries): the free, healthy,
offered GPUs, grouped by where they may go, by model and by node, leaf and spine. Market GPUs
(with a current price, in no private pool) and each private pool's GPUs (unpriced: quota pays)
are kept apart: a market lease only ever takes market GPUs and a private-pool lease only GPUs
of its own pool (`take(pool=...)`), and a lease asking its nodes to run something only GPUs
of nodes whose runtime can run it (`take(runtimes=...)`). Each
lease then takes its replacements from the index, without asking the database again; what it
took is gone from the index for the leases after it. The index can be stale by the time a lease
is moved (another worker took a GPU): the exclusion constraint on allocations still decides,
and the pass reads the free GPUs again (`refresh`) and retries that lease once; a lease that
still finds none waits for the next pass.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.db.models import F, Func, OuterRef, Q, Subquery

from fabric.core.locality import CONSTRAINT_LEVELS, LEVELS
from market.models import Allocation
from pool.models import Pool
from pool.services import offered_gpus


@dataclass(frozen=True)
class Slot:
    gpu_id: int
    price_micros: int
    fabric: str
    spine: str
    leaf: str
    host: str
    offered_until: datetime | None
    busy_from: datetime | None  # the start of its next allocation, if any
    node_id: int = 0
    index: int = 0
    pool: int | None = None  # the private pool the GPU belongs to; None: the market
    runtime: str = "none"  # what its node's agent runs (`pool.models.Node.Runtime`)

    def domain(self, level: str) -> tuple[str, str]:
        return (self.fabric, {"node": self.host, "leaf": self.leaf, "spine": self.spine,
                              "fabric": self.fabric}[level])

    def free_until(self, end: datetime) -> bool:
        return ((self.offered_until is None or self.offered_until >= end)
                and (self.busy_from is None or self.busy_from >= end))


def domain_of(level: str | None, fabric: str, spine: str, leaf: str, host: str):
    if level not in CONSTRAINT_LEVELS:
        return None
    return (fabric, {"node": host, "leaf": leaf, "spine": spine}[level])


class FreeIndex:
    """Free priced GPUs, cheapest first, per model and per (level, domain)."""

    def __init__(self, slots: list[Slot], model_of: dict[int, str]):
        self._fill_from(slots, model_of)

    def _fill_from(self, slots: list[Slot], model_of: dict[int, str]) -> None:
        self.taken: set[int] = set()
        self.by_domain: dict[tuple, list[Slot]] = defaultdict(list)
        self.domains: dict[tuple, set] = defaultdict(set)
        for slot in sorted(slots, key=lambda s: (s.price_micros, s.gpu_id)):
            model = (slot.pool, model_of[slot.gpu_id])
            for level in LEVELS:
                self.by_domain[(model, level, slot.domain(level))].append(slot)
                self.domains[(model, level)].add(slot.domain(level))

    @classmethod
    def build(cls, now: datetime) -> FreeIndex:
        return cls(*cls._read(now))

    def refresh(self, now: datetime) -> None:
        """Read the free GPUs again: a move found the index stale (another worker took one)."""
        self._fill_from(*self._read(now))

    @staticmethod
    def _read(now: datetime) -> tuple[list[Slot], dict[int, str]]:
        """Offered GPUs not allocated now, with the start of their next allocation (a GPU is
        only taken for a lease that ends before it): the market's with a current price whose
        offer has begun, and the private pools' (price 0: quota pays)."""
        next_start = (Allocation.objects.filter(gpu=OuterRef("pk"))
                      .annotate(start=Func(F("period"), function="lower"))
                      .filter(start__gt=now).order_by("start").values("start")[:1])
        pool_of = dict(Pool.nodes.through.objects.filter(pool__kind=Pool.Kind.PRIVATE)
                       .values_list("node_id", "pool_id"))
        rows = (
            offered_gpus().exclude(node_id__in=list(pool_of))
            # a repair is no new lease: the GPU's minimum lease applies to new leases only
            .filter(Q(prices__isnull=False, prices__superseded_at__isnull=True)
                    & (Q(prices__offered_from__isnull=True) | Q(prices__offered_from__lte=now)))
            .exclude(allocations__period__contains=now)
            .annotate(busy_from=Subquery(next_start))
            .values_list("id", "prices__price_micros", "node__fabric__name", "node__host__spine",
                         "node__host__leaf", "node__hostname", "prices__offered_until",
                         "busy_from", "gpu_model__name", "node_id", "index", "node__runtime")
        )
        private = (
            offered_gpus().filter(node_id__in=list(pool_of))
            .exclude(allocations__period__contains=now)
            .annotate(busy_from=Subquery(next_start))
            .values_list("id", "node__fabric__name", "node__host__spine", "node__host__leaf",
                         "node__hostname", "busy_from", "gpu_model__name", "node_id", "index",
                         "node__runtime")
        ) if pool_of else []
        slots, model_of = [], {}
        for (gpu_id, price, fabric, spine, leaf, host, until, busy, model, node, index,
             runtime) in rows:
            slots.append(Slot(gpu_id, price, fabric, spine, leaf, host, until, busy, node, index,
                              runtime=runtime))
            model_of[gpu_id] = model
        for gpu_id, fabric, spine, leaf, host, busy, model, node, index, runtime in private:
            slots.append(Slot(gpu_id, 0, fabric, spine, leaf, host, None, busy, node, index,
                              pool=pool_of[node], runtime=runtime))
            model_of[gpu_id] = model
        return slots, model_of

    def _usable(self, slots: list[Slot], max_price: int, ends_at: datetime,
                runtimes: frozenset[str] | None):
        for slot in slots:
            if (slot.gpu_id not in self.taken and slot.price_micros <= max_price
                    and slot.free_until(ends_at)
                    and (runtimes is None or slot.runtime in runtimes)):
                yield slot

    def _cheapest(self, slots, count, max_price, ends_at, runtimes) -> list[Slot]:
        found = []
        for slot in self._usable(slots, max_price, ends_at, runtimes):
            found.append(slot)
            if len(found) == count:
                break
        return found

    def take(self, *, gpu_model: str, count: int, max_price: int, ends_at: datetime,
             level: str | None, required: bool, keep=None, prefer=None, fabric=None,
             prefer_fabric=None, pool: int | None = None,
             runtimes: frozenset[str] | None = None) -> list[Slot] | None:
        """`count` GPUs for a lease, or None. `keep`: the domain (at `level`) its staying GPUs
        share, which the replacements must share too when the constraint is required (a
        preferred one tries it first, then the cheapest elsewhere). With nothing staying, a
        required constraint still needs one domain for all of them: `prefer` (where the lease
        was) first, then any. Whatever the constraint, a lease never spans two fabrics (no
        InfiniBand joins them): replacements come from `fabric`, its staying GPUs' fabric, or
        with nothing staying from one fabric, `prefer_fabric` first. `pool`: the private pool
        of a pool lease (its GPUs only); None for a market lease (market GPUs only).
        `runtimes`: the node runtimes that can run what the lease asks (None: any node)."""
        gpu_model = (pool, gpu_model)  # the index keys models by (pool, model)
        fabrics = [fabric] if fabric else sorted(
            (d[0] for d in self.domains.get((gpu_model, "fabric"), ())),
            key=lambda f: (f != prefer_fabric, f))
        chosen: list[Slot] | None = None
        if level in CONSTRAINT_LEVELS and keep is not None:
            chosen = self._cheapest(self.by_domain.get((gpu_model, level, keep), []), count,
                                    max_price, ends_at, runtimes)
            if len(chosen) < count:
                chosen = None if required else self._fill(chosen, gpu_model, count, max_price,
                                                          ends_at, fabrics, runtimes)
        elif level in CONSTRAINT_LEVELS:
            chosen = self._one_domain(gpu_model, level, count, max_price, ends_at, prefer,
                                      runtimes)
            if chosen is None and not required:
                chosen = self._fill([], gpu_model, count, max_price, ends_at, fabrics, runtimes)
        else:
            chosen = self._fill([], gpu_model, count, max_price, ends_at, fabrics, runtimes)
        if chosen is None or len(chosen) < count:
            return None
        self.taken.update(s.gpu_id for s in chosen)
        return chosen

    def _fill(self, chosen, gpu_model, count, max_price, ends_at, fabrics, runtimes
              ) -> list[Slot] | None:
        """`chosen` topped up with the cheapest usable GPUs of the first fabric that has
        enough."""
        ids = {s.gpu_id for s in chosen}
        for fabric in fabrics:
            found = list(chosen)
            for slot in self._usable(self.by_domain.get((gpu_model, "fabric", (fabric, fabric)),
                                                        []), max_price, ends_at, runtimes):
                if len(found) == count:
                    break
                if slot.gpu_id not in ids:
                    found.append(slot)
            if len(found) == count:
                return found
        return None

    def _one_domain(self, gpu_model, level, count, max_price, ends_at, prefer, runtimes):
        domains = sorted(self.domains.get((gpu_model, level), ()),
                         key=lambda d: (d != prefer, d))
        for domain in domains:
            chosen = self._cheapest(self.by_domain[(gpu_model, level, domain)], count,
                                    max_price, ends_at, runtimes)
            if len(chosen) == count:
                return chosen
        return None
