"""What a tenant may send with an order to run its work: the workload, its SSH keys and the
Slurm account its reservations are made for.

These tests exercise `market.core.workloads` on its own. Public keys are made by the real
`ssh-keygen` in tmp_path; the malformed ones are built by hand in the SSH wire format
(uint32-length strings and mpints) with `wire_string` and `wire_mpint` below.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from market.core.workloads import (
    MAX_COMMAND_BYTES,
    MAX_COMMAND_ITEMS,
    MAX_ENV_BYTES,
    MAX_SLURM_ACCOUNT_CHARS,
    MAX_SSH_KEY_BYTES,
    MAX_SSH_KEYS,
    MAX_WORKDIR_CHARS,
    RESERVED_ENV,
    SLURM_ACCOUNT_PATTERN,
    InvalidWorkload,
    Workload,
    parse_slurm_account,
    parse_ssh_keys,
    parse_workload,
)

TRAIN = ["python3", "train.py", "--epochs", "3"]


def refusal(call, *args) -> InvalidWorkload:
    with pytest.raises(InvalidWorkload) as caught:
        call(*args)
    return caught.value


def workload_refusal(**fields) -> InvalidWorkload:
    return refusal(parse_workload, {"command": TRAIN, **fields})


def key_refusal(line: str) -> InvalidWorkload:
    return refusal(parse_ssh_keys, [line])


def wire_string(data: bytes | str) -> bytes:
    data = data.encode() if isinstance(data, str) else data
    return len(data).to_bytes(4, "big") + data


def wire_mpint(value: int) -> bytes:
    return wire_string(value.to_bytes(value.bit_length() // 8 + 1, "big", signed=True))


def key_line(blob: bytes, key_type: str | None = None) -> str:
    """An OpenSSH line for `blob`; the type written is the blob's own unless one is given."""
    if key_type is None:
        length = int.from_bytes(blob[:4], "big")
        key_type = blob[4:4 + length].decode()
    return f"{key_type} {base64.b64encode(blob).decode()}"


def ed25519_blob(key: bytes = bytes(range(32))) -> bytes:
    return wire_string("ssh-ed25519") + wire_string(key)


def ecdsa_blob(key_type: str, curve: str, point: bytes) -> bytes:
    return wire_string(key_type) + wire_string(curve) + wire_string(point)


def blob_of(line: str) -> bytes:
    return base64.b64decode(line.split()[1])


@pytest.fixture
def keygen(tmp_path: Path):
    """keygen("rsa", bits=2048, comment="me@laptop") -> the .pub line ssh-keygen wrote."""
    made = []

    def make(key_type: str, bits: int | None = None, comment: str = "") -> str:
        path = tmp_path / f"key{len(made)}"
        made.append(path)
        size = ["-b", str(bits)] if bits else []
        subprocess.run(["ssh-keygen", "-q", "-t", key_type, *size, "-C", comment, "-f",
                        str(path), "-N", ""], check=True, capture_output=True)
        return path.with_suffix(".pub").read_text().strip()

    return make


def dsa_line(keygen, source: str) -> str:
    """A DSA public key: ssh-keygen's where it still makes them, else built by hand."""
    if source == "generated":
        try:
            return keygen("dsa")
        except subprocess.CalledProcessError:
            pass
    p, q, g, y = (1 << 1023) + 1, (1 << 159) + 1, 2, (1 << 1022) + 3
    return key_line(wire_string("ssh-dss") + b"".join(map(wire_mpint, (p, q, g, y))))


# --- the workload ---------------------------------------------------------------------------


def test_a_workload_is_its_command_env_and_workdir_and_round_trips_through_json():
    raw = {"command": TRAIN, "env": {"SEED": "1", "WANDB_MODE": "offline"}, "workdir": "runs/a"}

    workload = parse_workload(raw)

    assert workload == Workload(command=tuple(TRAIN), env=raw["env"], workdir="runs/a")
    assert workload.as_json() == raw
    assert parse_workload(json.loads(json.dumps(workload.as_json()))) == workload


def test_env_and_workdir_are_optional_and_default_to_empty():
    workload = parse_workload({"command": ["nvidia-smi"]})

    assert workload.as_json() == {"command": ["nvidia-smi"], "env": {}, "workdir": ""}


def test_none_means_the_order_runs_no_workload():
    assert parse_workload(None) is None


@given(st.lists(st.text().filter(lambda item: "\0" not in item), min_size=1, max_size=20)
       .filter(lambda command: command[0] != ""))
def test_any_argv_of_nul_free_strings_is_kept_exactly(command):
    assert parse_workload({"command": command}).command == tuple(command)


def test_a_refusal_is_a_value_error_whose_text_is_its_message():
    error = workload_refusal(workdir="/etc")

    assert isinstance(error, ValueError)
    assert error.field == "workload.workdir"
    assert str(error) == error.message == "must be relative to the lease's home: drop the leading /"


@pytest.mark.parametrize("raw", [["python3", "train.py"], "python3 train.py", 3, True])
def test_a_workload_that_is_not_an_object_is_refused(raw):
    error = refusal(parse_workload, raw)

    assert error.field == "workload"
    assert "must be an object" in error.message


def test_an_unknown_key_is_refused_so_a_misspelling_is_never_ignored():
    error = workload_refusal(enviroment={"SEED": "1"})

    assert error.field == "workload"
    assert error.message.startswith("unknown field 'enviroment'")


def test_a_workload_without_a_command_is_refused():
    error = refusal(parse_workload, {"env": {"SEED": "1"}})

    assert (error.field, error.message[:11]) == ("workload.command", "is required")


# --- command --------------------------------------------------------------------------------


def test_a_shell_string_command_is_refused_with_the_list_to_write_instead():
    error = workload_refusal(command="python3 train.py")

    assert error.field == "workload.command"
    assert "not a shell string" in error.message


@pytest.mark.parametrize("command", [[], {"0": "python3"}, None])
def test_a_command_must_be_a_non_empty_list(command):
    error = workload_refusal(command=command)

    assert (error.field, error.message) == ("workload.command",
                                            "must be a non-empty list of strings")


@pytest.mark.parametrize("item", [3, None, ["--epochs"], b"train.py"])
def test_every_command_item_must_be_a_string(item):
    error = workload_refusal(command=["python3", item])

    assert error.field == "workload.command"
    assert error.message.startswith("item 1 must be a string")


def test_a_nul_byte_in_a_command_item_is_refused():
    error = workload_refusal(command=["python3", "train\0.py"])

    assert (error.field, error.message) == ("workload.command", "item 1 contains a NUL byte")


def test_the_program_must_not_be_empty_but_later_arguments_may_be():
    assert parse_workload({"command": ["echo", ""]}).command == ("echo", "")

    error = workload_refusal(command=["", "train.py"])

    assert error.message == "the first item, the program to run, must not be empty"


def test_a_command_has_at_most_1024_items():
    assert len(parse_workload({"command": ["x"] * MAX_COMMAND_ITEMS}).command) == 1024

    error = workload_refusal(command=["x"] * (MAX_COMMAND_ITEMS + 1))

    assert error.message == "has 1025 items; at most 1024 are allowed"


def test_a_command_has_at_most_128_kib_of_utf8_in_all():
    exactly = ["python3", "x" * (MAX_COMMAND_BYTES - len("python3"))]
    assert parse_workload({"command": exactly}).command == tuple(exactly)

    error = workload_refusal(command=["python3", "é" * (MAX_COMMAND_BYTES // 2)])

    assert error.message == f"is {MAX_COMMAND_BYTES + 7} bytes long; at most 131072 are allowed"


# --- env ------------------------------------------------------------------------------------


@pytest.mark.parametrize("env", [["SEED=1"], "SEED=1", None])
def test_env_must_be_an_object(env):
    error = workload_refusal(env=env)

    assert error.field == "workload.env"
    assert error.message.startswith("must be an object")


@pytest.mark.parametrize("name", ["1SEED", "SEED-1", "SEED 1", "", "ÉPOQUE", "A=B"])
def test_an_env_name_must_be_letters_digits_and_underscores_not_starting_with_a_digit(name):
    error = workload_refusal(env={name: "1"})

    assert error.field == f"workload.env.{name}"
    assert error.message.startswith("is not a valid variable name")


@pytest.mark.parametrize("name", ["_", "seed", "_PRIVATE", "A1_B2", "MY_IBEX_TOKEN", "NNODES_"])
def test_ordinary_names_are_accepted_even_when_they_resemble_reserved_ones(name):
    assert parse_workload({"command": TRAIN, "env": {name: "1"}}).env == {name: "1"}


@pytest.mark.parametrize("name", sorted(RESERVED_ENV) + ["IBEX_", "IBEX_LEASE_ID"])
def test_names_ibex_sets_itself_cannot_be_overridden(name):
    error = workload_refusal(env={"SEED": "1", name: "0"})

    assert error.field == f"workload.env.{name}"
    assert error.message.startswith("is set by IBEX on the lease and cannot be overridden")


def test_the_simulated_run_time_is_the_one_ibex_name_a_tenant_may_set():
    workload = parse_workload({"command": TRAIN, "env": {"IBEX_SIMULATED_SECONDS": "60"}})

    assert workload.env == {"IBEX_SIMULATED_SECONDS": "60"}


def test_the_reserved_names_are_those_of_the_lease_launcher_and_of_a_shares_limits():
    assert RESERVED_ENV == {"NODE_RANK", "NNODES", "GPUS_PER_NODE", "MASTER_ADDR", "MASTER_PORT",
                            "CUDA_VISIBLE_DEVICES", "NCCL_IB_HCA",
                            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY"}


@pytest.mark.parametrize("value", [3, None, True, ["a"]])
def test_an_env_value_must_be_a_string(value):
    error = workload_refusal(env={"EPOCHS": value})

    assert error.field == "workload.env.EPOCHS"
    assert error.message.startswith("must be a string")


def test_a_nul_byte_in_an_env_value_is_refused():
    error = workload_refusal(env={"SEED": "1\0"})

    assert (error.field, error.message) == ("workload.env.SEED", "contains a NUL byte")


def test_env_entries_total_at_most_64_kib_as_utf8_name_equals_value():
    exactly = {"A": "x" * 100, "B": "y" * (MAX_ENV_BYTES - len("A=") - 100 - len("B="))}
    assert parse_workload({"command": TRAIN, "env": exactly}).env == exactly

    error = workload_refusal(env={"A": "x" * 100, "B": "é" * (MAX_ENV_BYTES // 2)})

    assert error.field == "workload.env"
    assert error.message == f"is {MAX_ENV_BYTES + 104} bytes as NAME=value entries; " \
                            "at most 65536 are allowed"


# --- workdir --------------------------------------------------------------------------------


@pytest.mark.parametrize("workdir", ["", "runs", "runs/a/b", "./runs", "..hidden/x", "a..b"])
def test_a_relative_workdir_is_accepted(workdir):
    assert parse_workload({"command": TRAIN, "workdir": workdir}).workdir == workdir


@pytest.mark.parametrize("workdir", ["/", "/home/tenant", "//srv"])
def test_an_absolute_workdir_is_refused(workdir):
    error = workload_refusal(workdir=workdir)

    assert error.field == "workload.workdir"
    assert error.message.startswith("must be relative")


@pytest.mark.parametrize("workdir", ["..", "../etc", "runs/../../etc", "runs/.."])
def test_a_workdir_may_not_climb_out_with_a_dot_dot_component(workdir):
    error = workload_refusal(workdir=workdir)

    assert (error.field, error.message) == ("workload.workdir",
                                            "must not contain a '..' component")


def test_a_nul_byte_in_the_workdir_is_refused():
    assert workload_refusal(workdir="runs\0").message == "contains a NUL byte"


def test_a_workdir_has_at_most_255_characters():
    assert parse_workload({"command": TRAIN, "workdir": "é" * MAX_WORKDIR_CHARS}).workdir

    error = workload_refusal(workdir="a" * (MAX_WORKDIR_CHARS + 1))

    assert error.message == "is 256 characters long; at most 255 are allowed"


@pytest.mark.parametrize("workdir", [None, 3, ["runs"]])
def test_the_workdir_must_be_a_string(workdir):
    assert workload_refusal(workdir=workdir).message.startswith("must be a string")


# --- SSH keys: accepted ---------------------------------------------------------------------


@pytest.mark.parametrize(("key_type", "bits"), [
    ("ed25519", None), ("ecdsa", 256), ("ecdsa", 384), ("ecdsa", 521), ("rsa", 2048),
    ("rsa", 3072),
])
def test_generated_ed25519_ecdsa_and_rsa_keys_are_accepted_with_their_comment(keygen, key_type,
                                                                               bits):
    line = keygen(key_type, bits, comment="ada@laptop")

    assert parse_ssh_keys([line]) == [line]


def test_a_key_without_a_comment_is_normalised_to_type_and_base64(keygen):
    line = keygen("ed25519")

    assert parse_ssh_keys([f"  {line}  "]) == [line]
    assert len(line.split()) == 2


def test_whitespace_around_the_parts_is_normalised_and_a_spaced_comment_is_kept(keygen):
    key_type, data = keygen("ecdsa", 256).split()

    keys = parse_ssh_keys([f"\t{key_type}   {data}\t ada on the  laptop  "])

    assert keys == [f"{key_type} {data} ada on the  laptop"]


def test_no_keys_given_means_none(keygen):
    assert parse_ssh_keys(None) == []
    assert parse_ssh_keys([]) == []


def test_keys_are_kept_in_the_order_given(keygen):
    lines = [keygen("rsa", 2048), keygen("ed25519"), keygen("ecdsa", 384)]

    assert parse_ssh_keys(lines) == lines


def test_up_to_16_keys_are_accepted():
    lines = [key_line(ed25519_blob(bytes([n]) * 32)) for n in range(MAX_SSH_KEYS)]

    assert parse_ssh_keys(lines) == lines


# --- SSH keys: refused ----------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["ssh-ed25519 AAAA", {"key": "ssh-ed25519 AAAA"}, 3])
def test_ssh_keys_must_be_a_list(raw):
    error = refusal(parse_ssh_keys, raw)

    assert error.field == "ssh_keys"
    assert error.message == "must be a list of OpenSSH public-key lines"


def test_more_than_16_keys_are_refused():
    lines = [key_line(ed25519_blob(bytes([n]) * 32)) for n in range(MAX_SSH_KEYS + 1)]

    error = refusal(parse_ssh_keys, lines)

    assert (error.field, error.message) == ("ssh_keys", "has 17 keys; at most 16 are allowed")


def test_the_field_names_the_position_of_the_refused_key(keygen):
    lines = [keygen("ed25519"), keygen("ed25519"), "ssh-ed25519 !!!", keygen("ed25519")]

    assert refusal(parse_ssh_keys, lines).field == "ssh_keys.2"


@pytest.mark.parametrize("line", [None, 3, ["ssh-ed25519", "AAAA"]])
def test_every_key_must_be_a_string(line):
    error = key_refusal(line)

    assert (error.field, error.message) == ("ssh_keys.0",
                                            "must be a string: one line of a .pub file")


def test_a_key_line_longer_than_16_kib_is_refused(keygen):
    line = f"{keygen('ed25519')} {'c' * MAX_SSH_KEY_BYTES}"

    assert key_refusal(line).message == "is longer than 16384 bytes"


def test_an_rsa_key_under_2048_bits_is_refused_with_its_size(keygen):
    error = key_refusal(keygen("rsa", 1024))

    assert error.message == "an RSA key needs at least 2048 bits; this one has 1024"


def test_an_rsa_key_one_bit_short_of_2048_is_refused():
    blob = wire_string("ssh-rsa") + wire_mpint(65537) + wire_mpint((1 << 2046) + 1)

    assert key_refusal(key_line(blob)).message.endswith("this one has 2047")


def test_an_rsa_key_with_a_negative_modulus_is_refused():
    blob = wire_string("ssh-rsa") + wire_mpint(65537) + wire_mpint(-(1 << 3000))

    assert key_refusal(key_line(blob)).message == ("the RSA key's exponent and modulus must "
                                                   "be positive")


@pytest.mark.parametrize("source", ["generated", "hand-built"])
def test_dsa_keys_are_refused_with_the_types_to_use_instead(keygen, source):
    error = key_refusal(dsa_line(keygen, source))

    assert error.message == ("ssh-dss keys are not accepted: use ed25519, ecdsa or rsa "
                             "(2048 bits or more)")


@pytest.mark.parametrize("key_type", [
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-ed25519-cert-v01@openssh.com", "ssh-rsa-cert-v01@openssh.com", "ssh-ed448",
    "SSH-ED25519",
])
def test_other_key_types_are_refused(key_type):
    error = key_refusal(key_line(ed25519_blob(), key_type=key_type))

    assert error.message == (f"{key_type!r} is not an accepted key type: use ed25519, ecdsa or "
                             "rsa (2048 bits or more)")


@pytest.mark.parametrize("options", [
    'command="echo hi"', "no-pty", 'restrict,command="/bin/true"', 'from="10.0.0.0/8"',
])
def test_authorized_keys_options_before_the_type_are_refused(keygen, options):
    error = key_refusal(f"{options} {keygen('ed25519')}")

    assert error.message.startswith("starts with authorized_keys options")


@pytest.mark.parametrize("data", ["AAAA!!!!", "AAAAC3NzaC1lZDI1NTE5A", "AAAAC3Nza=C1l", "é"])
def test_key_data_that_is_not_base64_is_refused(data):
    error = key_refusal(f"ssh-ed25519 {data}")

    assert error.message.startswith("the key data is not valid base64")


@pytest.mark.parametrize("cut", [1, 16, 32])
def test_a_truncated_key_is_refused(keygen, cut):
    line = keygen("ed25519")

    error = key_refusal(key_line(blob_of(line)[:-cut]))

    assert error.message.startswith("the key data is truncated")


def test_a_truncated_rsa_key_is_refused(keygen):
    blob = blob_of(keygen("rsa", 2048))

    assert key_refusal(key_line(blob[:-1])).message.startswith("the key data is truncated")


def test_a_key_whose_data_is_only_a_type_is_refused():
    assert key_refusal(key_line(wire_string("ssh-ed25519"))).message.startswith("the key data "
                                                                                "is truncated")


@pytest.mark.parametrize(("key_type", "bits"), [("ed25519", None), ("ecdsa", 256),
                                                ("rsa", 2048)])
def test_bytes_after_the_key_in_its_data_are_refused(keygen, key_type, bits):
    blob = blob_of(keygen(key_type, bits)) + b"\0\0\0\0"

    error = key_refusal(key_line(blob))

    assert error.message == "the key data has 4 unexpected bytes after the key"


@pytest.mark.parametrize("line", ["{key}\n", "{key}\r\n", "{key}\n{key}", "{key} ada\0"])
def test_a_key_must_be_one_line(keygen, line):
    error = key_refusal(line.format(key=keygen("ed25519")))

    assert error.message == "must be a single line: give one key per list item"


@pytest.mark.parametrize("line", ["", "   "])
def test_an_empty_key_line_is_refused(line):
    assert key_refusal(line).message.startswith("is empty")


def test_a_type_without_key_data_is_refused():
    assert key_refusal("ssh-ed25519").message == "has no key data after the type"


def test_a_line_whose_type_differs_from_its_data_is_refused(keygen):
    ed25519 = keygen("ed25519").split()[1]

    error = key_refusal(f"ssh-rsa {ed25519}")

    assert error.message == "the line says ssh-rsa but its key data is 'ssh-ed25519'"


@pytest.mark.parametrize("size", [0, 31, 33, 64])
def test_an_ed25519_key_must_be_exactly_32_bytes(size):
    error = key_refusal(key_line(ed25519_blob(b"k" * size)))

    assert error.message == f"an ed25519 key is 32 bytes; this one has {size}"


def test_an_ecdsa_key_must_be_on_the_curve_its_type_names(keygen):
    p256 = blob_of(keygen("ecdsa", 256))
    point = p256[4 + 19 + 4 + 8 + 4:]
    blob = ecdsa_blob("ecdsa-sha2-nistp384", "nistp256", point)

    error = key_refusal(key_line(blob))

    assert error.message == ("the line says ecdsa-sha2-nistp384 but its key data is on curve "
                             "'nistp256', not nistp384")


@pytest.mark.parametrize(("curve", "point"), [
    ("nistp256", b"\x02" + b"p" * 32),
    ("nistp256", b"\x04" + b"p" * 63),
    ("nistp384", b"\x04" + b"p" * 97),
    ("nistp521", b"\x03" + b"p" * 132),
    ("nistp521", b""),
])
def test_an_ecdsa_point_must_be_uncompressed_and_of_its_curves_length(curve, point):
    blob = ecdsa_blob(f"ecdsa-sha2-{curve}", curve, point)

    error = key_refusal(key_line(blob))

    assert error.message.startswith(f"a {curve} key is an uncompressed point of")


def test_the_same_key_twice_is_refused_even_with_another_comment(keygen):
    line = keygen("ed25519", comment="laptop")
    other = keygen("ed25519")

    error = refusal(parse_ssh_keys, [line, other, line.replace("laptop", "desktop")])

    assert (error.field, error.message) == ("ssh_keys.2", "is the same key as ssh_keys.0")



# --- the Slurm account ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["physics", "a", "_svc", "9lives", "hpc.ml-team_2", "A" * 64])
def test_a_slurm_account_of_letters_digits_underscores_dots_and_dashes_is_kept(name):
    assert parse_slurm_account(name) == name


@pytest.mark.parametrize("raw", [None, ""])
def test_no_slurm_account_is_the_empty_string(raw):
    assert parse_slurm_account(raw) == ""


def test_a_slurm_account_has_at_most_64_characters():
    error = refusal(parse_slurm_account, "a" * (MAX_SLURM_ACCOUNT_CHARS + 1))

    assert (error.field, error.message) == (
        "slurm_account", "is 65 characters long; a Slurm account or user name has at most 64")


@pytest.mark.parametrize("name, bad", [("phys ics", "' '"), ("ops;rm", "';'"),
                                       ("ops,root", "','"), ("physique-é", "'é'"),
                                       ("acct\n", "'\\n'"), ("a/b", "'/'")])
def test_a_slurm_account_with_another_character_is_refused_naming_it(name, bad):
    error = refusal(parse_slurm_account, name)

    assert (error.field, error.message) == (
        "slurm_account", f"contains {bad}: a Slurm account or user name has only letters, "
                         "digits, '_', '.' and '-'")


@pytest.mark.parametrize("name", ["-physics", ".hidden", "-"])
def test_a_slurm_account_cannot_start_with_a_dash_or_a_dot(name):
    error = refusal(parse_slurm_account, name)

    assert error.field == "slurm_account"
    assert error.message == (f"starts with {name[0]!r}: a Slurm account or user name starts "
                             "with a letter, a digit or '_'")


@pytest.mark.parametrize("raw", [3, ["physics"], {"name": "physics"}, True])
def test_a_slurm_account_must_be_a_string(raw):
    assert refusal(parse_slurm_account, raw).message.startswith("must be a string")


@given(st.text(alphabet=st.sampled_from("aZ09_.-é \n;"), max_size=70))
def test_the_database_pattern_accepts_exactly_the_slurm_accounts_the_parser_keeps(name):
    try:
        parse_slurm_account(name)
        kept = True
    except InvalidWorkload:
        kept = False

    assert kept == bool(re.fullmatch(SLURM_ACCOUNT_PATTERN, name))
