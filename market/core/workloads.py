"""What a tenant sends with an order so a lease can run its work: the workload, SSH keys and
the Slurm account.

Pure Python, no Django. This module owns the rules for the three order fields that reach the
tenant's machines, and turns them into values the rest of IBEX can trust without looking again:

    parse_workload(raw) -> Workload | None     None (no workload) or a validated Workload
    parse_ssh_keys(raw) -> list[str]           normalised "TYPE BASE64[ comment]" lines
    parse_slurm_account(raw) -> str            "" (none) or a Slurm account or user name
    Workload(command, env, workdir).as_json()  {"command": [...], "env": {...}, "workdir": "..."}
    InvalidWorkload(field, message)            the one refusal; `field` is dotted, e.g.
                                               "workload.env.NAME" or "ssh_keys.2"
    RESERVED_ENV                               names IBEX sets itself (and any `IBEX_*`)

A workload is `{"command": [...], "env": {...}, "workdir": "..."}`:
- `command` (required) is an argv list, never a shell string: 1 to MAX_COMMAND_ITEMS strings,
  the first non-empty, none holding NUL, at most MAX_COMMAND_BYTES of UTF-8 in all;
- `env` (optional, default {}) maps names matching `[A-Za-z_][A-Za-z0-9_]*` to NUL-free
  strings; names IBEX sets on the lease are refused; the sum of len(UTF-8 "NAME=value") is
  at most MAX_ENV_BYTES;
- `workdir` (optional, default "") is a relative path of at most MAX_WORKDIR_CHARS characters,
  with no leading "/", no ".." component and no NUL;
- any other key is refused, so a misspelt field is never silently ignored.

SSH keys are OpenSSH public-key lines, "TYPE BASE64 [comment]", at most MAX_SSH_KEYS of them,
each at most MAX_SSH_KEY_BYTES. The key data is decoded and read in the SSH wire format
(uint32-length strings and mpints, RFC 4251) to the last byte: ssh-ed25519 (a 32-byte key),
ecdsa-sha2-nistp256/384/521 (matching curve, uncompressed point) and ssh-rsa of at least
MIN_RSA_BITS bits. DSA, certificates, security-key types and `authorized_keys` options are
refused. The same key twice (whatever its comments) is refused.

A Slurm account (docs/slurm.md) is the Slurm account or user name a lease placed on nodes of a
Slurm cluster is reserved for: 1 to MAX_SLURM_ACCOUNT_CHARS ASCII letters, digits, "_", "." and
"-", starting with a letter, digit or "_" (never "-", so it can never read as an option of a
Slurm command). "" or None: the order names none.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

MAX_COMMAND_ITEMS = 1024
MAX_COMMAND_BYTES = 128 * 1024
MAX_ENV_BYTES = 65536
MAX_WORKDIR_CHARS = 255
MAX_SSH_KEYS = 16
MAX_SSH_KEY_BYTES = 16 * 1024
MIN_RSA_BITS = 2048
MAX_SLURM_ACCOUNT_CHARS = 64

RESERVED_ENV_PREFIX = "IBEX_"
RESERVED_ENV = frozenset({
    "NODE_RANK", "NNODES", "GPUS_PER_NODE", "MASTER_ADDR", "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES", "NCCL_IB_HCA",
    # how a share of a GPU is held (docs/parts.md): the agent sets them
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_PIPE_DIRECTORY",
})
# the one IBEX_* name a tenant sets: how long a simulated agent pretends the command runs
SIMULATED_SECONDS_ENV = "IBEX_SIMULATED_SECONDS"

WORKLOAD_KEYS = ("command", "env", "workdir")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SLURM_ACCOUNT_CHARS = re.compile(r"[A-Za-z0-9_.-]*")
SLURM_ACCOUNT_FIRST = re.compile(r"[A-Za-z0-9_]")
# the whole rule as one regular expression, "" included, for the database's check constraint
SLURM_ACCOUNT_PATTERN = rf"^([A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_SLURM_ACCOUNT_CHARS - 1}}})?$"
ED25519 = "ssh-ed25519"
RSA = "ssh-rsa"
ECDSA_POINT_BYTES = {
    "ecdsa-sha2-nistp256": 65,
    "ecdsa-sha2-nistp384": 97,
    "ecdsa-sha2-nistp521": 133,
}
ACCEPTED_TYPES = (ED25519, RSA, *ECDSA_POINT_BYTES)
USE_INSTEAD = f"use ed25519, ecdsa or rsa ({MIN_RSA_BITS} bits or more)"


class InvalidWorkload(ValueError):
    """A refused workload, SSH key or Slurm account; `field` names the input at fault, e.g.
    `ssh_keys.2`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Workload:
    command: tuple[str, ...]
    env: dict[str, str]
    workdir: str

    def as_json(self) -> dict[str, Any]:
        return {"command": list(self.command), "env": dict(self.env), "workdir": self.workdir}


# --- workload -------------------------------------------------------------------------------


def parse_workload(raw: Any) -> Workload | None:
    """The validated workload, or None when `raw` is None (the order runs no workload)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InvalidWorkload("workload", "must be an object with command, env and workdir")
    unknown = sorted(str(key) for key in raw if key not in WORKLOAD_KEYS)
    if unknown:
        raise InvalidWorkload("workload", f"unknown field {unknown[0]!r}: "
                                          f"a workload has only {', '.join(WORKLOAD_KEYS)}")
    if "command" not in raw:
        raise InvalidWorkload("workload.command", "is required: the program and its arguments, "
                                                  'as a list such as ["python3", "train.py"]')
    return Workload(command=_command(raw["command"]), env=_env(raw.get("env", {})),
                    workdir=_workdir(raw.get("workdir", "")))


def _command(raw: Any) -> tuple[str, ...]:
    field = "workload.command"
    if isinstance(raw, str):
        raise InvalidWorkload(field, 'must be a list of arguments, not a shell string: '
                                     'write ["python3", "train.py"], not "python3 train.py"')
    if not isinstance(raw, list) or not raw:
        raise InvalidWorkload(field, "must be a non-empty list of strings")
    if len(raw) > MAX_COMMAND_ITEMS:
        raise InvalidWorkload(field, f"has {len(raw)} items; at most {MAX_COMMAND_ITEMS} "
                                     "are allowed")
    for position, item in enumerate(raw):
        _command_item(position, item)
    if not raw[0]:
        raise InvalidWorkload(field, "the first item, the program to run, must not be empty")
    size = sum(len(item.encode()) for item in raw)
    if size > MAX_COMMAND_BYTES:
        raise InvalidWorkload(field, f"is {size} bytes long; at most {MAX_COMMAND_BYTES} "
                                     "are allowed")
    return tuple(raw)


def _command_item(position: int, item: Any) -> None:
    if not isinstance(item, str):
        raise InvalidWorkload("workload.command", f"item {position} must be a string, "
                                                  f"not {type(item).__name__}")
    if "\0" in item:
        raise InvalidWorkload("workload.command", f"item {position} contains a NUL byte")


def _env(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise InvalidWorkload("workload.env", 'must be an object of names to string values, '
                                              'such as {"SEED": "1"}')
    for name, value in raw.items():
        _env_entry(name, value)
    size = sum(len(f"{name}={value}".encode()) for name, value in raw.items())
    if size > MAX_ENV_BYTES:
        raise InvalidWorkload("workload.env", f"is {size} bytes as NAME=value entries; "
                                              f"at most {MAX_ENV_BYTES} are allowed")
    return dict(raw)


def _env_entry(name: Any, value: Any) -> None:
    field = f"workload.env.{name}"
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        raise InvalidWorkload(field, "is not a valid variable name: use letters, digits and "
                                     "underscores, not starting with a digit")
    reserved = name.startswith(RESERVED_ENV_PREFIX) and name != SIMULATED_SECONDS_ENV
    if reserved or name in RESERVED_ENV:
        raise InvalidWorkload(field, "is set by IBEX on the lease and cannot be overridden "
                                     f"(nor can any {RESERVED_ENV_PREFIX}* name)")
    if not isinstance(value, str):
        raise InvalidWorkload(field, f"must be a string, not {type(value).__name__}: "
                                     'quote it, e.g. "3"')
    if "\0" in value:
        raise InvalidWorkload(field, "contains a NUL byte")


def _workdir(raw: Any) -> str:
    field = "workload.workdir"
    if not isinstance(raw, str):
        raise InvalidWorkload(field, "must be a string: a path relative to the lease's home")
    if len(raw) > MAX_WORKDIR_CHARS:
        raise InvalidWorkload(field, f"is {len(raw)} characters long; at most "
                                     f"{MAX_WORKDIR_CHARS} are allowed")
    if "\0" in raw:
        raise InvalidWorkload(field, "contains a NUL byte")
    if raw.startswith("/"):
        raise InvalidWorkload(field, "must be relative to the lease's home: drop the leading /")
    if ".." in raw.split("/"):
        raise InvalidWorkload(field, "must not contain a '..' component")
    return raw


# --- the Slurm account ----------------------------------------------------------------------


def parse_slurm_account(raw: Any) -> str:
    """The Slurm account or user name the order's lease is reserved for, or "" for none."""
    field = "slurm_account"
    if raw is None or raw == "":
        return ""
    if not isinstance(raw, str):
        raise InvalidWorkload(field, f"must be a string, not {type(raw).__name__}")
    if len(raw) > MAX_SLURM_ACCOUNT_CHARS:
        raise InvalidWorkload(field, f"is {len(raw)} characters long; a Slurm account or user "
                                     f"name has at most {MAX_SLURM_ACCOUNT_CHARS}")
    if not SLURM_ACCOUNT_CHARS.fullmatch(raw):
        bad = next(c for c in raw if not SLURM_ACCOUNT_CHARS.fullmatch(c))
        raise InvalidWorkload(field, f"contains {bad!r}: a Slurm account or user name has only "
                                     "letters, digits, '_', '.' and '-'")
    if not SLURM_ACCOUNT_FIRST.fullmatch(raw[0]):
        raise InvalidWorkload(field, f"starts with {raw[0]!r}: a Slurm account or user name "
                                     "starts with a letter, a digit or '_'")
    return raw


# --- SSH keys -------------------------------------------------------------------------------


def parse_ssh_keys(raw: Any) -> list[str]:
    """The keys as normalised "TYPE BASE64[ comment]" lines, in the order given."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidWorkload("ssh_keys", "must be a list of OpenSSH public-key lines")
    if len(raw) > MAX_SSH_KEYS:
        raise InvalidWorkload("ssh_keys", f"has {len(raw)} keys; at most {MAX_SSH_KEYS} "
                                          "are allowed")
    keys, seen = [], {}
    for position, line in enumerate(raw):
        field = f"ssh_keys.{position}"
        key_type, blob, comment = _ssh_key(field, line)
        if blob in seen:
            raise InvalidWorkload(field, f"is the same key as ssh_keys.{seen[blob]}")
        seen[blob] = position
        encoded = base64.b64encode(blob).decode()
        keys.append(f"{key_type} {encoded} {comment}" if comment else f"{key_type} {encoded}")
    return keys


def _ssh_key(field: str, line: Any) -> tuple[str, bytes, str]:
    """(type, decoded key data, comment) of one public-key line, or InvalidWorkload."""
    if not isinstance(line, str):
        raise InvalidWorkload(field, "must be a string: one line of a .pub file")
    if len(line.encode()) > MAX_SSH_KEY_BYTES:
        raise InvalidWorkload(field, f"is longer than {MAX_SSH_KEY_BYTES} bytes")
    if "\n" in line or "\r" in line or "\0" in line:
        raise InvalidWorkload(field, "must be a single line: give one key per list item")
    parts = line.split(maxsplit=2)
    if not parts:
        raise InvalidWorkload(field, "is empty: paste the contents of your .pub file")
    key_type = _key_type(field, parts[0], line.split())
    if len(parts) < 2:
        raise InvalidWorkload(field, "has no key data after the type")
    blob = _decode(field, parts[1])
    _check_blob(field, key_type, blob)
    return key_type, blob, parts[2].strip() if len(parts) > 2 else ""


def _key_type(field: str, word: str, words: list[str]) -> str:
    if word in ACCEPTED_TYPES:
        return word
    if word == "ssh-dss":
        raise InvalidWorkload(field, f"ssh-dss keys are not accepted: {USE_INSTEAD}")
    if "=" in word or any(later in ACCEPTED_TYPES for later in words[1:]):
        raise InvalidWorkload(field, "starts with authorized_keys options: give only the key "
                                     "line, beginning with its type such as ssh-ed25519")
    raise InvalidWorkload(field, f"{word[:40]!r} is not an accepted key type: {USE_INSTEAD}")


def _decode(field: str, text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidWorkload(field, "the key data is not valid base64: copy the whole line "
                                     "of the .pub file") from None


def _check_blob(field: str, key_type: str, blob: bytes) -> None:
    reader = _WireReader(field, blob)
    inner = reader.string()
    if inner != key_type.encode():
        named = inner[:40].decode(errors="replace")
        raise InvalidWorkload(field, f"the line says {key_type} but its key data is {named!r}")
    if key_type == ED25519:
        _check_ed25519(reader)
    elif key_type == RSA:
        _check_rsa(reader)
    else:
        _check_ecdsa(reader, key_type)
    reader.end()


def _check_ed25519(reader: _WireReader) -> None:
    key = reader.string()
    if len(key) != 32:
        raise InvalidWorkload(reader.field, f"an ed25519 key is 32 bytes; this one has {len(key)}")


def _check_ecdsa(reader: _WireReader, key_type: str) -> None:
    curve = reader.string().decode(errors="replace")
    expected = key_type.removeprefix("ecdsa-sha2-")
    if curve != expected:
        raise InvalidWorkload(reader.field, f"the line says {key_type} but its key data is on "
                                            f"curve {curve[:40]!r}, not {expected}")
    point, size = reader.string(), ECDSA_POINT_BYTES[key_type]
    if len(point) != size or point[0] != 0x04:
        raise InvalidWorkload(reader.field, f"a {expected} key is an uncompressed point of "
                                            f"{size} bytes starting with 0x04; this one is not")


def _check_rsa(reader: _WireReader) -> None:
    exponent, modulus = reader.mpint(), reader.mpint()
    if exponent <= 0 or modulus <= 0:
        raise InvalidWorkload(reader.field, "the RSA key's exponent and modulus must be positive")
    if modulus.bit_length() < MIN_RSA_BITS:
        raise InvalidWorkload(reader.field, f"an RSA key needs at least {MIN_RSA_BITS} bits; "
                                            f"this one has {modulus.bit_length()}")


class _WireReader:
    """Reads SSH wire-format values (RFC 4251) from a key blob, refusing short or long blobs."""

    def __init__(self, field: str, blob: bytes) -> None:
        self.field, self.blob, self.at = field, blob, 0

    def string(self) -> bytes:
        length = int.from_bytes(self._take(4), "big")
        return self._take(length)

    def mpint(self) -> int:
        return int.from_bytes(self.string(), "big", signed=True)

    def end(self) -> None:
        left = len(self.blob) - self.at
        if left:
            raise InvalidWorkload(self.field, f"the key data has {left} unexpected bytes "
                                              "after the key")

    def _take(self, count: int) -> bytes:
        if self.at + count > len(self.blob):
            raise InvalidWorkload(self.field, "the key data is truncated: copy the whole line "
                                              "of the .pub file")
        chunk = self.blob[self.at:self.at + count]
        self.at += count
        return chunk
