"""Where the client finds the API and its key: `~/.config/ibex/config.toml`, one table per
profile, written by `ibex login` with mode 600; `IBEX_API` and `IBEX_API_KEY` override it.

```toml
[profiles.default]
api = "https://ibex.example.com"
key = "ibex_..."
```
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ibex_client.errors import NOT_CONFIGURED, ApiError

DEFAULT_PROFILE = "default"


def config_path() -> Path:
    """`$IBEX_CONFIG`, else `$XDG_CONFIG_HOME/ibex/config.toml`, else `~/.config/...`."""
    if os.environ.get("IBEX_CONFIG"):
        return Path(os.environ["IBEX_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ibex" / "config.toml"


@dataclass(frozen=True)
class Settings:
    api: str
    key: str
    profile: str
    key_source: str  # "IBEX_API_KEY" or the profile's name: what --explain tells people


def read_profiles(path: Path | None = None) -> dict[str, dict]:
    path = path or config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ApiError(f"{path} is not TOML: {exc}", code=NOT_CONFIGURED) from None
    profiles = data.get("profiles", {})
    return {name: dict(values) for name, values in profiles.items() if isinstance(values, dict)}


def profile_name(profile: str | None) -> str:
    return profile or os.environ.get("IBEX_PROFILE") or DEFAULT_PROFILE


def resolve(profile: str | None = None, *, api: str | None = None,
            key: str | None = None) -> Settings:
    """The API and key to use: arguments, then the environment, then the profile."""
    name = profile_name(profile)
    stored = read_profiles().get(name, {})
    api = api or os.environ.get("IBEX_API") or stored.get("api")
    key_source = "argument" if key else ("IBEX_API_KEY" if os.environ.get("IBEX_API_KEY")
                                         else f"profile {name}")
    key = key or os.environ.get("IBEX_API_KEY") or stored.get("key")
    if not api:
        raise ApiError(f"no API address: run `ibex login --api URL` (profile {name}) or set "
                       f"IBEX_API", code=NOT_CONFIGURED)
    if not key:
        raise ApiError(f"no API key: run `ibex login` (profile {name}) or set IBEX_API_KEY",
                       code=NOT_CONFIGURED)
    return Settings(api=api.rstrip("/"), key=key, profile=name, key_source=key_source)


def _toml_string(value: str) -> str:
    # JSON's string escapes are TOML basic-string escapes
    return json.dumps(value, ensure_ascii=False)


def save_profile(name: str, *, api: str, key: str, path: Path | None = None) -> Path:
    """Store a profile, keeping the others; the file is created 600 and replaced atomically,
    so the key is never readable by others, not even for a moment."""
    path = path or config_path()
    profiles = read_profiles(path)
    profiles[name] = {**profiles.get(name, {}), "api": api.rstrip("/"), "key": key}
    lines = ["# written by `ibex login`: API keys, keep this file private (mode 600)"]
    for profile, values in sorted(profiles.items()):
        lines += ["", f"[profiles.{_toml_string(profile)}]"]
        lines += [f"{k} = {_toml_string(str(v))}" for k, v in sorted(values.items())]
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask, and over a stale temporary file
        with os.fdopen(fd, "w") as out:
            out.write("\n".join(lines) + "\n")
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
