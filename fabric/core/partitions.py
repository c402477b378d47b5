"""OpenSM's partition file (`partitions.conf`) as the fabric agent writes it: the provider's own
lines kept as they are, and IBEX's partitions (one per lease on several nodes) in a block
between two marker lines that IBEX alone rewrites.

A partition line names its P_Key and its members by **port** GUID:
``ibex_1a2b=0x1a2b : 0x0002c90300a1b2c4=full, 0x0002c90300a1b2d5=full ;``. OpenSM gives each
member port the P_Key with the full-member bit (0x9a2b) once it re-reads the file (SIGHUP).
"""

from __future__ import annotations

import re

BEGIN = "# BEGIN IBEX: leases' partitions, rewritten by ibex-agent fabric; edit outside this block"
END = "# END IBEX"
DEFAULT_LINE = "Default=0x7fff, ipoib : ALL=full ;"
_PKEY = re.compile(r"^\s*[^=:,;\s]*\s*=\s*(0x[0-9a-fA-F]{1,4})\b")


def split(text: str) -> tuple[str, str]:
    """(the provider's lines, IBEX's block without its markers). A file with no block is all
    the provider's; a block whose end marker is missing runs to the end of the file."""
    lines = text.splitlines()
    begin = next((i for i, line in enumerate(lines) if line.startswith("# BEGIN IBEX")), None)
    if begin is None:
        return text, ""
    end = next((i for i in range(begin + 1, len(lines)) if lines[i].strip() == END), len(lines))
    own = lines[:begin] + lines[end + 1:]
    return "\n".join(own) + ("\n" if own else ""), "\n".join(lines[begin + 1:end])


def provider_pkeys(text: str) -> list[int]:
    """The P_Keys (15 bits) of the provider's own partition definitions: those outside IBEX's
    block. A definition is `name[=PKEY][,flags] : members ;`, possibly over several lines; one
    without a P_Key (OpenSM picks it) is left out."""
    own, _ = split(text)
    statements = " ".join(line.split("#", 1)[0] for line in own.splitlines()).split(";")
    keys = set()
    for statement in statements:
        header = statement.split(":", 1)[0]
        found = _PKEY.match(header.split(",", 1)[0])
        if found:
            keys.add(int(found.group(1), 16) & 0x7FFF)
    return sorted(keys)


def block(partitions: list[dict], port_guid) -> tuple[list[str], list[str]]:
    """IBEX's lines for `partitions` ([{pkey, lease, members: [{guid, port}]}], the server's
    answer) and the member ports it could not name: `port_guid(node_guid, port)` gives a
    port's GUID, None when the port is not in the discovery (its cable is down)."""
    lines, missing = [], []
    for partition in partitions:
        guids = []
        for member in partition["members"]:
            guid = port_guid(member["guid"], member["port"])
            if guid is None:
                missing.append(f"{member['guid']}[{member['port']}]")
            else:
                guids.append(guid)
        pkey = int(partition["pkey"], 16)
        lines.append(f"# {partition.get('lease', '')}")
        if guids:
            members = ", ".join(f"{guid}=full" for guid in sorted(set(guids)))
            lines.append(f"ibex_{pkey:04x}={pkey:#06x} : {members} ;")
        else:  # no member port seen: OpenSM still knows the P_Key, on no port
            lines.append(f"ibex_{pkey:04x}={pkey:#06x} ;")
    return lines, missing


def render(current: str, lines: list[str]) -> str:
    """The whole file: the provider's lines as they are (the default partition alone when the
    file is new or holds no definition of its own) and IBEX's block at its end."""
    own, _ = split(current)
    if not own.strip():
        own = DEFAULT_LINE + "\n"
    elif not own.endswith("\n"):
        own += "\n"
    return own + "\n".join([BEGIN, *lines, END]) + "\n"


def rails_used(gpu_indexes: list[int], hcas: int, gpus_on_host: int) -> list[int] | None:
    """The rails (positions among the host's HCAs in rail order) that a lease's GPUs on a host
    use: GPU i sits on rail i * HCAs // GPUs, as the node agent gives NCCL_IB_HCA. None: every
    HCA of the host (it has one or none, or the GPUs are unknown)."""
    if hcas <= 1 or not gpu_indexes:
        return None
    return sorted(set(rails_of_gpus(gpu_indexes, hcas, gpus_on_host)))


def rails_of_gpus(gpu_indexes: list[int], hcas: int, gpus_on_host: int) -> tuple[int, ...]:
    """The rail of each GPU (i * HCAs // GPUs), in the order given; () on a host of one HCA."""
    if hcas <= 1 or not gpu_indexes:
        return ()
    gpus_on_host = max(gpus_on_host, max(gpu_indexes) + 1)
    return tuple(index * hcas // gpus_on_host for index in gpu_indexes)


_DEVICE_NUMBER = re.compile(r"(\d+)$")


def rail_order(description: str, guid: str) -> tuple:
    """An HCA's place in its host's rail order: by its device name's number (`node01 mlx5_3`:
    3), as sysfs lists them, then by GUID."""
    device = description.split()[-1] if description.split() else ""
    number = _DEVICE_NUMBER.search(device)
    return (0 if number else 1, int(number.group(1)) if number else 0, device, guid)
