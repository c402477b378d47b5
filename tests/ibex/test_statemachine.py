"""`ibex.statemachine.transition`: the table decides, the database state is what is checked, and a
refusal changes nothing. Shown with the provider onboarding machine (the lowest app that has one);
nodes, orders, leases and money rows use the same function."""

import threading

import pytest
from django.db import connection, transaction

from ibex.accounts import services as accounts
from ibex.accounts.models import ProviderProfile, ProviderStateChange
from ibex.audit.models import AuditEntry
from ibex.statemachine import transition
from tests.factories import make_org


def profile_of(org) -> ProviderProfile:
    return ProviderProfile.objects.get(organization=org)


def test_a_change_the_table_allows_saves_the_state_and_writes_history_and_audit(db):
    org = make_org("gpu-farm", "provider")

    profile = transition(accounts.PROVIDER_MACHINE, profile_of(org), "verified", actor="ops",
                         reason="papers checked")

    assert profile.state == profile_of(org).state == "verified"
    change = ProviderStateChange.objects.get(profile=profile)
    assert (change.from_state, change.to_state, change.actor, change.reason) == (
        "pending", "verified", "ops", "papers checked")
    assert AuditEntry.objects.filter(action="provider.verified", actor="ops").count() == 1


def test_a_change_the_table_forbids_is_refused_with_both_states_named(db):
    org = make_org("gpu-farm", "provider")
    accounts.change_provider_state(organization=org, to_state="verified", actor="ops", reason="ok")

    with pytest.raises(accounts.TransitionError, match="a verified provider cannot become pending"):
        transition(accounts.PROVIDER_MACHINE, profile_of(org), "pending", actor="ops", reason="x")

    assert profile_of(org).state == "verified"
    assert ProviderStateChange.objects.count() == 1


def test_a_stale_copy_is_refused_and_writes_nothing_even_where_the_table_allows_the_change(db):
    org = make_org("gpu-farm", "provider")
    stale = profile_of(org)  # read while pending
    accounts.change_provider_state(organization=org, to_state="verified", actor="ops", reason="ok")

    # pending -> suspended and verified -> suspended are both allowed, but the caller decided on
    # a state the row no longer has: it is told so rather than written over.
    with pytest.raises(accounts.TransitionError, match="became verified meanwhile"):
        transition(accounts.PROVIDER_MACHINE, stale, "suspended", actor="ops", reason="late")

    assert profile_of(org).state == "verified"
    assert list(ProviderStateChange.objects.values_list("to_state", flat=True)) == ["verified"]


def test_a_caller_that_catches_a_refusal_goes_on_in_its_transaction(db):
    org = make_org("gpu-farm", "provider")
    stale = profile_of(org)
    accounts.change_provider_state(organization=org, to_state="verified", actor="ops", reason="ok")

    with transaction.atomic():
        with pytest.raises(accounts.TransitionError):
            transition(accounts.PROVIDER_MACHINE, stale, "suspended", actor="ops", reason="late")
        accounts.change_provider_state(organization=org, to_state="suspended", actor="ops",
                                       reason="on second look")

    assert profile_of(org).state == "suspended"


@pytest.mark.django_db(transaction=True)
def test_of_eight_connections_changing_one_row_from_the_same_state_exactly_one_succeeds():
    org = make_org("gpu-farm", "provider")
    copies = [profile_of(org) for _ in range(8)]  # each read while pending
    barrier = threading.Barrier(8)
    outcomes, unexpected = [], []

    def verify(copy, n):
        barrier.wait()
        try:
            transition(accounts.PROVIDER_MACHINE, copy, "verified" if n % 2 else "suspended",
                       actor=f"ops-{n}", reason="race")
            outcomes.append("changed")
        except accounts.TransitionError:
            outcomes.append("refused")
        except Exception as exc:  # the test reports any other failure, whatever its kind
            unexpected.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=verify, args=(copy, n)) for n, copy in enumerate(copies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert unexpected == []
    assert sorted(outcomes) == ["changed"] + ["refused"] * 7
    history = list(ProviderStateChange.objects.values_list("from_state", "to_state"))
    assert len(history) == 1 and history[0][0] == "pending"
    assert profile_of(org).state == history[0][1]
