"""One way to change state: every state machine (providers, nodes, orders, leases, top-ups,
refunds, payouts) is a table of allowed transitions, and every change goes through `transition`.

`transition` checks the table, then writes the new state with one UPDATE that takes the row's
lock and applies only while the row is still in the state that was checked: a copy gone stale
(another transaction changed the row meanwhile) is refused, never written over. In the same
transaction it writes one history row (who, when, why) and, where the machine says so, one
audit entry. Each machine's history model shares the fields of `StateChange`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from ibex.audit.services import record_audit
from ibex.errors import Refusal


class StateChange(models.Model):
    """One transition of one row: from which state to which, who made it, why and when."""

    from_state = models.CharField(max_length=12, blank=True)
    to_state = models.CharField(max_length=12)
    actor = models.CharField(max_length=150)
    reason = models.CharField(max_length=500)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True
        ordering = ["at", "id"]


@dataclass(frozen=True)
class StateMachine:
    """A state machine's rules and records.

    `name` is how messages call a row ("a pending lease cannot become active"); `history` is
    its `StateChange` model and `history_of(row)` the fields that tie a history row to the row;
    `audit(row, change)`, when given, returns the audit entry's fields for a change.
    """

    name: str
    transitions: Mapping[str, Collection[str]]
    refusal: Callable[[str], Refusal]  # a Refusal class, or a function making one
    history: type[StateChange]
    history_of: Callable[[Any], dict]
    audit: Callable[[Any, StateChange], dict] | None = None

    def allows(self, from_state: str, to_state: str) -> bool:
        return to_state in self.transitions.get(from_state, ())


def transition(machine: StateMachine, row, to_state: str, *, actor: str, reason: str,
               also: Mapping[str, Any] | None = None):
    """Move `row` to `to_state`, or raise `machine.refusal` and change nothing. `also` sets and
    saves other fields of the row in the same write (an order's reason and lease)."""
    from_state = row.state
    if not machine.allows(from_state, to_state):
        raise machine.refusal(f"a {from_state} {machine.name} cannot become {to_state}")
    changes = {"state": to_state, **(also or {})}
    if hasattr(row, "state_changed_at"):
        changes["state_changed_at"] = timezone.now()
    rows = type(row).objects.filter(pk=row.pk)
    # No savepoint: a refusal is raised after the block, having written nothing, so a caller
    # that catches it can go on in its transaction.
    with transaction.atomic(savepoint=False):
        changed = rows.filter(state=from_state).update(**changes)
        if changed:
            for field, value in changes.items():
                setattr(row, field, value)
            change = machine.history.objects.create(
                **machine.history_of(row), from_state=from_state, to_state=to_state,
                actor=actor[:150], reason=reason[:500])
            if machine.audit is not None:
                record_audit(actor=actor, **machine.audit(row, change))
    if not changed:
        current = rows.values_list("state", flat=True).get()
        raise machine.refusal(f"a {current} {machine.name} cannot become {to_state}"
                              if not machine.allows(current, to_state) else
                              f"the {machine.name} became {current} meanwhile: ask again")
    return row
