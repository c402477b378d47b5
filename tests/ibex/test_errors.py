"""`ibex.errors`: every refusal has one shape, and every API answers it by one map."""

from rest_framework import exceptions

from ibex.api.errors import exception_handler
from ibex.errors import REFUSAL_STATUS, Refusal, http_status


class PoolFull(Refusal):
    code = "conflict"


def answer(refusal: Refusal):
    response = exception_handler(refusal, context={})
    return response.status_code, response.data["error"]


def test_a_refusal_naming_a_field_is_a_400_that_names_it():
    status, error = answer(Refusal("must be positive", field="amount"))

    assert status == 400
    assert error == {"code": "invalid", "message": "Invalid input.",
                     "fields": {"amount": ["must be positive"]}}


def test_a_refusal_is_answered_with_the_status_its_code_maps_to():
    assert answer(Refusal("not enough money", code="insufficient_funds")) == (
        409, {"code": "insufficient_funds", "message": "not enough money", "fields": {}})
    assert answer(Refusal("only tenants top up", code="forbidden"))[0] == 403


def test_a_kind_of_refusal_brings_its_own_code_and_the_caller_may_override_it():
    assert PoolFull("no room").code == "conflict"
    assert PoolFull("no room", code="invalid_state").code == "invalid_state"
    assert str(PoolFull("no room")) == "no room"


def test_a_code_the_map_does_not_name_is_a_400():
    assert "invalid_transition" not in REFUSAL_STATUS
    assert http_status("invalid_transition") == 400
    assert answer(Refusal("a paid payout cannot become pending", code="invalid_transition")) == (
        400, {"code": "invalid_transition", "message": "a paid payout cannot become pending",
              "fields": {}})


def test_other_exceptions_are_left_to_the_framework():
    status, error = answer(exceptions.NotFound())
    assert status == 404 and error["code"] == "not_found"
