"""Launch configurations as data: parse, validate, hash and resolve per level.

A config file (``kernels/configs/<kernel>.json``) looks like::

    {
      "kernel": "mla_decode",
      "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2,
      "overrides": [{"batch_min": 9, "num_warps": 8}]
    }

``overrides`` (optional) change some parameters for a range of batch sizes
(``batch_min``/``batch_max`` inclusive, either may be omitted): the
batch-aware case of the seed's V3.  The first matching override wins.

This module imports only the standard library: the GPU worker uses it on a
machine without pydantic.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

PARAMS = ("BLOCK_T", "BLOCK_H", "num_warps", "num_stages")
# Bounds of every launch parameter: (valid values, how to say them).
BOUNDS: dict[str, tuple[tuple[int, ...], str]] = {
    "BLOCK_T": ((16, 32, 64, 128, 256), "a power of two from 16 to 256"),
    "BLOCK_H": ((16, 32, 64, 128), "a power of two from 16 to 128"),
    "num_warps": ((1, 2, 4, 8, 16), "a power of two from 1 to 16"),
    "num_stages": ((1, 2, 3, 4, 5, 6), "an integer from 1 to 6"),
}
TOP_KEYS = set(PARAMS) | {"kernel", "overrides", "description"}
OVERRIDE_KEYS = set(PARAMS) | {"batch_min", "batch_max"}
MAX_BATCH = 1 << 20
MAX_CONFIG_BYTES = 256 * 1024


class ConfigError(ValueError):
    """A launch config that cannot be used; the message names the field."""


@dataclass(frozen=True)
class LaunchParams:
    """The four numbers one kernel launch needs."""

    BLOCK_T: int = 16
    BLOCK_H: int = 16
    num_warps: int = 4
    num_stages: int = 2

    def short(self) -> str:
        return f"BT{self.BLOCK_T}/BH{self.BLOCK_H}/w{self.num_warps}/s{self.num_stages}"


def brief_repr(value, limit: int = 60) -> str:
    """A short, one-line repr of any value, however big or deeply nested (error messages quote it)."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 3, limit, limit, 40
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 4
    try:
        text = r.repr(value)
    except Exception:  # e.g. an int too long to print
        text = f"<{type(value).__name__}>"
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if len(text) <= 2 * limit else text[: 2 * limit] + "..."


def one_line(message: str, limit: int = 600) -> str:
    """``message`` as one printable line of at most ``limit`` characters."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(message))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_param(where: str, key: str, value) -> int:
    valid, said = BOUNDS[key]
    if isinstance(value, bool) or not isinstance(value, int) or value not in valid:
        raise ConfigError(f"{where}{key}={brief_repr(value)} is invalid: must be {said} ({', '.join(map(str, valid))})")
    return value


def _check_batch(where: str, key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH:
        raise ConfigError(f"{where}{key}={brief_repr(value)} is invalid: must be an integer from 1 to {MAX_BATCH}")
    return value


def validate_config(data, kernel: str | None = None) -> dict:
    """Return a normalized copy of ``data`` or raise ConfigError naming the field."""
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a JSON object with keys {', '.join(PARAMS)}; got {type(data).__name__}")
    unknown = sorted(set(map(str, data)) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"unknown config key {brief_repr(unknown[0])}; valid keys: {', '.join(sorted(TOP_KEYS))}")
    if kernel is not None and data.get("kernel", kernel) != kernel:
        raise ConfigError(f"kernel={brief_repr(data.get('kernel'))} but this is the config of {kernel!r}")
    missing = [k for k in PARAMS if k not in data]
    if missing:
        raise ConfigError(f"config is missing {missing[0]!r}; required keys: {', '.join(PARAMS)}")
    out: dict = {k: _check_param("", k, data[k]) for k in PARAMS}
    if "kernel" in data:
        if not isinstance(data["kernel"], str):
            raise ConfigError(f"kernel={brief_repr(data['kernel'])} must be a string")
        out["kernel"] = data["kernel"]
    if "description" in data:
        if not isinstance(data["description"], str):
            raise ConfigError(f"description={brief_repr(data['description'])} must be a string")
        out["description"] = data["description"]
    overrides = data.get("overrides", [])
    if not isinstance(overrides, list):
        raise ConfigError(f"overrides={brief_repr(overrides)} must be a list of objects")
    norm = []
    for i, ov in enumerate(overrides):
        where = f"overrides[{i}]."
        if not isinstance(ov, dict):
            raise ConfigError(f"overrides[{i}]={brief_repr(ov)} must be an object with batch_min/batch_max and parameters")
        unknown = sorted(set(map(str, ov)) - OVERRIDE_KEYS)
        if unknown:
            raise ConfigError(f"unknown key {where}{brief_repr(unknown[0])}; valid keys: {', '.join(sorted(OVERRIDE_KEYS))}")
        item = {}
        for k in ("batch_min", "batch_max"):
            if k in ov:
                item[k] = _check_batch(where, k, ov[k])
        if item.get("batch_min", 1) > item.get("batch_max", MAX_BATCH):
            raise ConfigError(f"{where}batch_min={item['batch_min']} is above batch_max={item['batch_max']}")
        params = {k: _check_param(where, k, ov[k]) for k in PARAMS if k in ov}
        if not params:
            raise ConfigError(f"{where[:-1]} changes no parameter; give at least one of {', '.join(PARAMS)}")
        item.update(params)
        norm.append(item)
    if norm:
        out["overrides"] = norm
    return out


def load_config(path: str | Path, kernel: str | None = None) -> dict:
    """Read and validate a config file; errors (one line) name the file and the field."""
    try:
        return _load_config(Path(path), kernel)
    except ConfigError as exc:
        raise ConfigError(one_line(str(exc))) from None


def _load_config(path: Path, kernel: str | None) -> dict:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or type(exc).__name__}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is {len(raw)} bytes; the limit is {MAX_CONFIG_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is not usable JSON: it nests too deeply") from None
    except ValueError as exc:  # duplicate keys, NaN/Infinity, integers too long to convert
        said = "a number has more than 4300 digits" if "integer string conversion" in str(exc) else str(exc)
        raise ConfigError(f"config file {path} is not valid JSON: {said}") from None
    try:
        return validate_config(data, kernel)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _no_duplicates(pairs: list) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {brief_repr(k)}")
        out[k] = v
    return out


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def resolve(config: dict, batch: int) -> LaunchParams:
    """The launch parameters for one batch size (first matching override wins)."""
    values = {k: config[k] for k in PARAMS}
    for ov in config.get("overrides", []):
        if ov.get("batch_min", 1) <= batch <= ov.get("batch_max", MAX_BATCH):
            values.update({k: ov[k] for k in PARAMS if k in ov})
            break
    return LaunchParams(**values)


def canonical_json(config: dict) -> str:
    """The config as canonical JSON (sorted keys, no description): what is hashed."""
    body = {k: v for k, v in config.items() if k != "description"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def config_hash(config: dict) -> str:
    """Short content hash of a config; equal configs hash equal whatever their layout."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:12]


def describe(config: dict) -> str:
    """Human label such as ``BT16/BH16/w4/s2`` or ``BT16/BH16/w4/s2 [b>=9: w8]``."""
    base = LaunchParams(**{k: config[k] for k in PARAMS}).short()
    parts = []
    for ov in config.get("overrides", []):
        lo, hi = ov.get("batch_min"), ov.get("batch_max")
        rng = f"b{lo}-{hi}" if lo and hi else (f"b>={lo}" if lo else f"b<={hi}")
        change = ",".join(f"{_abbr(k)}{ov[k]}" for k in PARAMS if k in ov)
        parts.append(f"{rng}: {change}")
    return base + (f" [{'; '.join(parts)}]" if parts else "")


def _abbr(key: str) -> str:
    return {"BLOCK_T": "BT", "BLOCK_H": "BH", "num_warps": "w", "num_stages": "s"}[key]


__all__ = [
    "BOUNDS",
    "PARAMS",
    "ConfigError",
    "LaunchParams",
    "asdict",
    "brief_repr",
    "canonical_json",
    "config_hash",
    "describe",
    "load_config",
    "one_line",
    "resolve",
    "validate_config",
]
