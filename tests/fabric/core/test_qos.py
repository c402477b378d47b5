"""The bandwidth classes' pure core: the provider's settings checked field by field, the
opensm.conf options and qos-policy.conf rendered from them, and opensm.conf rewritten in
place of its QoS lines only."""

import pytest

from fabric.core import qos


def test_the_defaults_put_guaranteed_in_the_high_table_and_scavenger_under_a_small_weight():
    options = qos.opensm_options(qos.settings_of({}))

    assert options == {
        "qos": "TRUE", "qos_max_vls": "4", "qos_high_limit": "255",
        "qos_vlarb_high": "1:255", "qos_vlarb_low": "0:64,2:4",
        "qos_sl2vl": "0,1,2,0,0,0,0,0,0,0,0,0,0,0,0,0",
    }
    assert qos.validate(qos.settings_of({})) == qos.DEFAULT_SETTINGS


def test_a_change_keeps_what_it_does_not_name_and_a_table_given_replaces_the_table():
    merged = qos.merge(qos.DEFAULT_SETTINGS, {"classes": {"scavenger": {"sl": 5}},
                                              "vlarb_low": {"0": 32, "2": 8}})

    settings = qos.validate(merged)

    assert settings["classes"]["scavenger"] == {"sl": 5, "vl": 2}
    assert settings["classes"]["guaranteed"] == {"sl": 1, "vl": 1}
    assert settings["vlarb_low"] == {"0": 32, "2": 8} and settings["vlarb_high"] == {"1": 255}
    assert qos.sl2vl(settings)[5] == 2 and qos.sl2vl(settings)[2] == 0


@pytest.mark.parametrize("change,field", [
    ({"classes": {"guaranteed": {"sl": 16}}}, "qos.classes.guaranteed.sl"),
    ({"classes": {"guaranteed": {"sl": "1"}}}, "qos.classes.guaranteed.sl"),
    ({"classes": {"scavenger": {"sl": 1}}}, "qos.classes.scavenger.sl"),
    ({"classes": {"gold": {"sl": 3, "vl": 3}}}, "qos.classes.gold"),
    ({"classes": {"standard": {"sl": 0, "vl": 0, "weight": 3}}}, "qos.classes.standard.weight"),
    ({"classes": {"scavenger": {"vl": 3}}}, "qos.classes.scavenger.vl"),  # VL 3 has no weight
    ({"classes": {"scavenger": {"vl": 5}}}, "qos.classes.scavenger.vl"),  # above max_vls
    ({"vlarb_low": {"0": 256, "2": 4}}, "qos.vlarb_low.0"),
    ({"vlarb_low": {"0": -1, "2": 4}}, "qos.vlarb_low.0"),
    ({"vlarb_high": {"4": 10, "1": 255}}, "qos.vlarb_high.4"),
    ({"vlarb_high": {"15": 10}}, "qos.vlarb_high.15"),
    ({"vlarb_high": {"x": 10}}, "qos.vlarb_high.x"),
    ({"vlarb_high": [1, 255]}, "qos.vlarb_high"),
    ({"max_vls": 3}, "qos.max_vls"),
    ({"max_vls": 2}, "qos.vlarb_low.2"),
    ({"high_limit": 256}, "qos.high_limit"),
    ({"colour": "red"}, "qos.colour"),
])
def test_a_bad_setting_is_refused_naming_its_field(change, field):
    with pytest.raises(qos.QosSettingsError) as refused:
        qos.validate(qos.merge(qos.DEFAULT_SETTINGS, change))

    assert refused.value.field == field, refused.value.message


def test_opensm_conf_gets_its_qos_lines_replaced_and_missing_ones_appended_every_other_byte_kept():
    current = ("# OpenSM configuration\r\nrouting_engine ftree\r\nqos FALSE\r\n"
               "# qos_max_vls is the number of VLs\r\nqos_max_vls 0\r\n"
               "qos_ca_vlarb_high (null)\r\nlog_file /var/log/opensm.log")

    text = qos.render_opensm_conf(current, {"qos": "TRUE", "qos_max_vls": "4",
                                            "qos_sl2vl": "0,1"})

    assert text == ("# OpenSM configuration\r\nrouting_engine ftree\r\nqos TRUE\r\n"
                    "# qos_max_vls is the number of VLs\r\nqos_max_vls 4\r\n"
                    "qos_ca_vlarb_high (null)\r\nlog_file /var/log/opensm.log\n"
                    "qos_sl2vl 0,1\n")
    assert qos.render_opensm_conf(text, {"qos": "TRUE", "qos_max_vls": "4",
                                         "qos_sl2vl": "0,1"}) == text


def test_the_policy_maps_each_pkey_to_its_sl_and_everything_else_to_the_standard_sl():
    text = qos.policy_text(0, [("0x1000", 1), ("0x1001", 2)])

    body = [line.strip() for line in text.splitlines() if not line.startswith("#")]
    assert body == ["qos-ulps", "default : 0", "any, pkey 0x1000 : 1", "any, pkey 0x1001 : 2",
                    "end-qos-ulps"]
