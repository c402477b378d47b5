"""The fabric agent's QoS writer: qos-policy.conf maps each lease's P_Key to its class's SL,
opensm.conf gets the QoS options (its other lines kept byte for byte), both atomically, and
OpenSM is signalled once, only when something changed."""



from agent.fabric_agent import write_qos_files
from fabric.core import qos

ANSWER = {"options": qos.opensm_options(qos.settings_of({})), "default_sl": 0,
          "pkeys": [{"pkey": "0x1000", "class": "guaranteed", "sl": 1},
                    {"pkey": "0x1001", "class": "standard", "sl": 0}]}
CONF = ("# site configuration\nrouting_engine ftree\nqos FALSE\nqos_max_vls 0\n"
        "qos_vlarb_high (null)\nlog_file /var/log/opensm.log\n")


def test_the_policy_and_the_options_are_written_and_opensm_is_signalled(tmp_path, sighups):
    pid_file, received = sighups
    (tmp_path / "opensm.conf").write_text(CONF)

    written = write_qos_files(tmp_path, ANSWER, pid_file)

    policy = (tmp_path / "qos-policy.conf").read_text()
    assert "    any, pkey 0x1000 : 1\n" in policy and "    any, pkey 0x1001 : 0\n" in policy
    assert "    default : 0\n" in policy
    conf = (tmp_path / "opensm.conf").read_text()
    assert conf == ("# site configuration\nrouting_engine ftree\nqos TRUE\nqos_max_vls 4\n"
                    "qos_vlarb_high 1:255\nlog_file /var/log/opensm.log\n"
                    "qos_high_limit 255\nqos_vlarb_low 0:64,2:4\n"
                    "qos_sl2vl 0,1,2,0,0,0,0,0,0,0,0,0,0,0,0,0\n"
                    f"qos_policy_file {tmp_path / 'qos-policy.conf'}\n")
    assert written.changed and written.signalled and received == [1] and written.pkeys == 2


def test_an_unchanged_answer_writes_nothing_and_signals_nobody(tmp_path, sighups):
    pid_file, received = sighups
    (tmp_path / "opensm.conf").write_text(CONF)
    write_qos_files(tmp_path, ANSWER, pid_file)
    stat = (tmp_path / "opensm.conf").stat()

    again = write_qos_files(tmp_path, ANSWER, pid_file)

    assert not again.changed and not again.signalled and received == [1]
    assert (tmp_path / "opensm.conf").stat().st_mtime_ns == stat.st_mtime_ns


def test_without_opensm_conf_nothing_is_written_and_the_agent_says_how_to_start_opensm(
        tmp_path, sighups):
    pid_file, received = sighups

    written = write_qos_files(tmp_path, ANSWER, pid_file)

    assert not written.changed and received == []
    assert "opensm -F" in written.error
    assert not (tmp_path / "qos-policy.conf").exists() and not (tmp_path / "opensm.conf").exists()
