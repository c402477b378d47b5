"""Bandwidth classes: what an order asks of the fabric beside its GPUs.

`guaranteed` reserves `gbps_per_gpu` on every link of its routes (admission checks the sum of
guarantees per link); `standard` (the default) and `scavenger` share what is left, scavenger
last. Each class is an InfiniBand service level (SL) that OpenSM's QoS maps to a VL with the
provider's arbitration weights (docs/fabric.md, "Bandwidth classes").
"""

from __future__ import annotations

from decimal import Decimal

GUARANTEED = "guaranteed"
STANDARD = "standard"
SCAVENGER = "scavenger"
CLASSES = (GUARANTEED, STANDARD, SCAVENGER)


def bandwidth_json(bandwidth_class: str, gbps_per_gpu: Decimal | None) -> dict:
    """An order's or lease's class as the API shows it."""
    return {"class": bandwidth_class,
            "gbps_per_gpu": None if gbps_per_gpu is None else float(gbps_per_gpu)}


# --- the provider's QoS settings, per fabric ---------------------------------------------------
#
# Settings are plain JSON (stored on the fabric, shown in its JSON, changed by PATCH):
#
#   {"max_vls": 4, "high_limit": 255,
#    "classes": {"guaranteed": {"sl": 1, "vl": 1}, "standard": {"sl": 0, "vl": 0},
#                "scavenger": {"sl": 2, "vl": 2}},
#    "vlarb_high": {"1": 255}, "vlarb_low": {"0": 64, "2": 4}}
#
# Each class is a service level (SL) that every port maps to its VL (SL2VL); the VL is served by
# the VL-arbitration tables: a VL in the high-priority table goes before every VL of the low one
# (within `high_limit`), and VLs of one table share the link in proportion to their weights.
# SLs no class holds map to the standard class's VL.

SL_COUNT = 16  # SL 0-15
MAX_DATA_VL = 14  # VL 0-14 carry data; VL 15 is management's
WEIGHT_MAX = 255
MAX_VLS_CHOICES = (1, 2, 4, 8, 15)  # what a port's VLCap can say: VL0, VL0-1, VL0-3, VL0-7, VL0-14
HIGH_LIMIT_MAX = 255  # 255: no limit on the high-priority table

DEFAULT_SETTINGS = {
    "max_vls": 4,
    "high_limit": 255,
    "classes": {
        GUARANTEED: {"sl": 1, "vl": 1},
        STANDARD: {"sl": 0, "vl": 0},
        SCAVENGER: {"sl": 2, "vl": 2},
    },
    "vlarb_high": {"1": 255},
    "vlarb_low": {"0": 64, "2": 4},
}
SETTING_KEYS = tuple(DEFAULT_SETTINGS)

# the options of opensm.conf the fabric agent owns (it adds `qos_policy_file`, whose path only
# it knows)
OPENSM_OPTIONS = ("qos", "qos_max_vls", "qos_high_limit", "qos_vlarb_high", "qos_vlarb_low",
                  "qos_sl2vl")


class QosSettingsError(ValueError):
    """A setting refused: `field` is its dotted path (`qos.classes.scavenger.sl`)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def settings_of(stored: dict | None) -> dict:
    """A fabric's settings: what the provider set, IBEX's defaults for the rest."""
    return merge(DEFAULT_SETTINGS, stored or {})


def merge(current: dict, change: dict) -> dict:
    """`current` with `change` over it, as PATCH does: a key left out keeps its value; a class
    left out keeps its SL and VL; a class given without `vl` keeps its VL; a table given
    replaces the whole table."""
    merged = {key: current[key] for key in SETTING_KEYS}
    merged["classes"] = {name: dict(value) for name, value in current["classes"].items()}
    for key, value in change.items():
        if key != "classes":  # an unknown key goes through: `validate` names it
            merged[key] = value
    if "classes" in change and not isinstance(change["classes"], dict):
        merged["classes"] = change["classes"]
        return merged
    for name, value in (change.get("classes") or {}).items():
        if isinstance(value, dict) and isinstance(merged["classes"].get(name), dict):
            merged["classes"][name] = {**merged["classes"][name], **value}
        else:
            merged["classes"][name] = value
    return merged


def _integer(value, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise QosSettingsError(field, f"a whole number from {low} to {high}")
    if not low <= value <= high:
        raise QosSettingsError(field, f"from {low} to {high}, not {value}")
    return value


def validate(settings: dict, prefix: str = "qos") -> dict:
    """The settings normalised (VL keys as strings, tables in VL order), or QosSettingsError
    naming the first field that is wrong."""
    if not isinstance(settings, dict):
        raise QosSettingsError(prefix, "an object")
    unknown = sorted(set(settings) - set(SETTING_KEYS))
    if unknown:
        raise QosSettingsError(f"{prefix}.{unknown[0]}",
                               f"unknown setting: use {', '.join(SETTING_KEYS)}")
    max_vls = settings["max_vls"]
    if isinstance(max_vls, bool) or max_vls not in MAX_VLS_CHOICES:
        raise QosSettingsError(f"{prefix}.max_vls",
                               f"one of {', '.join(map(str, MAX_VLS_CHOICES))} (data VLs a port uses)")
    high_limit = _integer(settings["high_limit"], f"{prefix}.high_limit", 0, HIGH_LIMIT_MAX)
    tables = {}
    for table in ("vlarb_high", "vlarb_low"):
        given = settings[table]
        if not isinstance(given, dict):
            raise QosSettingsError(f"{prefix}.{table}", 'an object of VL to weight: {"0": 64}')
        weights = {}
        for key, weight in given.items():
            field = f"{prefix}.{table}.{key}"
            if not (isinstance(key, str) and key.isdigit()) and not isinstance(key, int):
                raise QosSettingsError(field, "a VL is a number from 0 to 14")
            vl = int(key)
            if vl > MAX_DATA_VL:
                raise QosSettingsError(field, "a VL is a number from 0 to 14 (15 is management's)")
            if vl >= max_vls:
                raise QosSettingsError(field, f"VL {vl} is not below max_vls ({max_vls})")
            weights[vl] = _integer(weight, field, 0, WEIGHT_MAX)
        tables[table] = {str(vl): weights[vl] for vl in sorted(weights)}
    classes = settings["classes"]
    if not isinstance(classes, dict):
        raise QosSettingsError(f"{prefix}.classes", "an object of class to {sl, vl}")
    unknown = sorted(set(classes) - set(CLASSES))
    if unknown:
        raise QosSettingsError(f"{prefix}.classes.{unknown[0]}",
                               f"unknown class: use {', '.join(CLASSES)}")
    normalised, sls = {}, {}
    for name in CLASSES:
        value = classes[name]
        field = f"{prefix}.classes.{name}"
        if not isinstance(value, dict):
            raise QosSettingsError(field, "an object: {sl, vl}")
        extra = sorted(set(value) - {"sl", "vl"})
        if extra:
            raise QosSettingsError(f"{field}.{extra[0]}", "unknown: a class has sl and vl")
        if "sl" not in value or "vl" not in value:
            raise QosSettingsError(f"{field}.{'sl' if 'sl' not in value else 'vl'}",
                                   "required")
        sl = _integer(value["sl"], f"{field}.sl", 0, SL_COUNT - 1)
        vl = _integer(value["vl"], f"{field}.vl", 0, MAX_DATA_VL)
        if sl in sls:
            raise QosSettingsError(f"{field}.sl", f"SL {sl} is already the {sls[sl]} class's")
        if vl >= max_vls:
            raise QosSettingsError(f"{field}.vl", f"VL {vl} is not below max_vls ({max_vls})")
        if not tables["vlarb_high"].get(str(vl)) and not tables["vlarb_low"].get(str(vl)):
            raise QosSettingsError(f"{field}.vl", f"VL {vl} has no weight in vlarb_high or "
                                                  "vlarb_low: its traffic would never be sent")
        sls[sl] = name
        normalised[name] = {"sl": sl, "vl": vl}
    return {"max_vls": max_vls, "high_limit": high_limit, "classes": normalised, **tables}


def sl2vl(settings: dict) -> list[int]:
    """The VL of each SL 0-15: a class's SL to its VL, every other SL to the standard VL."""
    classes = settings["classes"]
    table = [classes[STANDARD]["vl"]] * SL_COUNT
    for value in classes.values():
        table[value["sl"]] = value["vl"]
    return table


def vlarb_entries(table: dict) -> list[tuple[int, int]]:
    """A VL-arbitration table as (VL, weight) entries in VL order, weights of 0 left out: what
    OpenSM programs and `smpquery vlarb` reads back (its other entries weigh 0)."""
    return [(int(vl), weight) for vl, weight in sorted(table.items(), key=lambda i: int(i[0]))
            if weight]


def opensm_options(settings: dict) -> dict[str, str]:
    """The QoS options of opensm.conf for these settings (man opensm, "QOS CONFIGURATION")."""
    def entries(table):
        # an empty table still needs one entry, or OpenSM keeps its own default weights
        return ",".join(f"{vl}:{weight}" for vl, weight in vlarb_entries(table)) or "0:0"
    return {
        "qos": "TRUE",
        "qos_max_vls": str(settings["max_vls"]),
        "qos_high_limit": str(settings["high_limit"]),
        "qos_vlarb_high": entries(settings["vlarb_high"]),
        "qos_vlarb_low": entries(settings["vlarb_low"]),
        "qos_sl2vl": ",".join(map(str, sl2vl(settings))),
    }


def sl_of(settings: dict, bandwidth_class: str) -> int:
    classes = settings["classes"]
    return classes.get(bandwidth_class, classes[STANDARD])["sl"]


# --- the files the fabric agent writes ----------------------------------------------------------

POLICY_HEADER = ("# Written by ibex-agent fabric: each lease's partition (P_Key) to its bandwidth "
                 "class's SL.\n# Rewritten whole at every change; edit the classes in IBEX "
                 "(PATCH /api/v1/fabrics/{id}/ qos).\n")


def policy_text(default_sl: int, pkeys: list[tuple[str, int]]) -> str:
    """OpenSM's qos-policy.conf in its simple form (a `qos-ulps` section): path records of a
    partition's P_Key get its SL, everything else the standard class's. OpenSM refuses a
    P_Key no partition holds (ERR AC14), so only live partitions are named."""
    lines = [POLICY_HEADER.rstrip("\n"), "qos-ulps", f"    default : {default_sl}"]
    lines += [f"    any, pkey {pkey} : {sl}" for pkey, sl in pkeys]
    lines.append("end-qos-ulps")
    return "\n".join(lines) + "\n"


def render_opensm_conf(current: str, options: dict[str, str]) -> str:
    """opensm.conf with `options` set: each line whose option is one of them gets the new value
    (its line break kept), an option the file lacks goes at its end, and every other byte stays
    as it was."""
    out, seen = [], set()
    for line in current.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        key = body.split(None, 1)[0] if body.strip() else ""
        if key in options and not body.startswith((" ", "\t")):
            out.append(f"{key} {options[key]}{line[len(body):]}")
            seen.add(key)
        else:
            out.append(line)
    text = "".join(out)
    missing = [key for key in options if key not in seen]
    if missing:
        if text and not text.endswith("\n"):
            text += "\n"
        text += "".join(f"{key} {options[key]}\n" for key in missing)
    return text
