"""Launch configurations as data, in one place: read, validated, hashed, described and resolved at a level.

A kernel's tunables are declared in its adapter's :class:`~kinv.kernels.tunables.TunableSpec`; this module
finds that spec through the config's ``"kernel"`` (the adapter registry).  A config file
(``<the adapter's package>/configs/<kernel>.json``) looks like::

    {
      "kernel": "mla_decode",
      "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2,
      "overrides": [{"batch_min": 9, "num_warps": 8}]
    }

``overrides`` (optional) change some tunables for a range of a level dimension (``<dim>_min`` /
``<dim>_max`` inclusive, either may be omitted; MLA's are ``batch`` and ``context``): the batch-aware case of the seed's
V3.  A categorical dimension is matched by value (``"shape": "v3"``; MLA's model shape).  The first
matching override wins.

This module imports only the standard library and kinv.kernels: the GPU worker uses it on a machine without
pydantic.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kinv.kernels.adapter import get_adapter
from kinv.kernels.errors import ConfigError
from kinv.kernels.moved import moved
from kinv.kernels.tunables import Params, TunableSpec, brief_repr, one_line, read_text_file

MAX_CONFIG_BYTES = 256 * 1024

LaunchParams = Params
"""The first interface's name for resolved parameters (kernels annotate ``params: LaunchParams``)."""


# --------------------------------------------------------------------------- #
# helpers that find the spec through the config's kernel
# --------------------------------------------------------------------------- #
def spec_of(kernel: str) -> TunableSpec:
    return get_adapter(kernel).spec


def validate_config(data, kernel: str | None = None) -> dict:
    """Validate ``data`` against the tunables of ``kernel`` (or of the kernel the config names)."""
    name = kernel or (data.get("kernel") if isinstance(data, dict) else None)
    if not isinstance(name, str):
        raise ConfigError("config names no kernel: add \"kernel\": \"<name>\" (see `kinv kernels`)")
    try:
        adapter = get_adapter(name)
    except (ImportError, ValueError) as exc:
        raise ConfigError(one_line(str(exc))) from None
    return adapter.spec.validate(data, adapter.name)


def load_config(path: str | Path, kernel: str | None = None) -> dict:
    """Read and validate a config file; errors (one line) name the file and the field."""
    try:
        return _load_config(Path(path), kernel)
    except ConfigError as exc:
        raise ConfigError(one_line(str(exc))) from None


def read_json(path: Path, what: str = "config file") -> object:
    """A JSON file's value, or ConfigError (one line) saying why not: missing, too big, not UTF-8, bad JSON."""
    text = read_text_file(path, what, MAX_CONFIG_BYTES, ConfigError)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{what} {path} is not usable JSON: it nests too deeply") from None
    except ValueError as exc:  # duplicate keys, NaN/Infinity, integers too long to convert
        said = "a number has more than 4300 digits" if "integer string conversion" in str(exc) else str(exc)
        raise ConfigError(f"{what} {path} is not valid JSON: {said}") from None


def _load_config(path: Path, kernel: str | None) -> dict:
    data = read_json(path)
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


def effective(adapter, config: dict, level) -> dict:
    """The uniform config that runs at ``level``: ``config`` resolved there (its overrides applied) as a config of
    its own, with no overrides."""
    params = adapter.params_for(config, level)
    return adapter.validate_config({**dict(params), "kernel": adapter.name})


def _resolve(config: dict, dims) -> Params:
    """0.2.0's ``resolve``: the launch parameters of ``config`` at one level (a Level or a mapping of its dimensions);
    reached through the deprecated ``kinv.kernels.launch_config.resolve`` (kinv.kernels.moved)."""
    d = dims.to_dict() if hasattr(dims, "to_dict") else dims
    return spec_of(config.get("kernel") or "").resolve(config, d)


def canonical_json(config: dict) -> str:
    """The config as canonical JSON (sorted keys, no description, optional tunables at their default left
    out): what is hashed."""
    body = {k: v for k, v in config.items() if k != "description"}
    try:
        body = spec_of(body["kernel"]).without_defaults(body)
    except (KeyError, ImportError, ValueError, TypeError, AttributeError):
        pass
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def config_hash(config: dict) -> str:
    """Short content hash of a config; equal configs hash equal whatever their layout."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:12]


def describe(config: dict) -> str:
    """Human label of a config in its kernel's own tunable names (``BT16/BH16/w4/s2 [b>=9: w8]``); a campaign's
    candidate over environment variables (``"env"``) is labelled with them too (``... with TARGET_CTAS=1024``)."""
    env = config.get("env") if isinstance(config, dict) else None
    if env:
        rest = describe({k: v for k, v in config.items() if k != "env"})
        return f"{rest} with " + " ".join(f"{k}={v}" for k, v in sorted(env.items()))
    name = config.get("kernel") if isinstance(config, dict) else None
    if name:
        try:
            return spec_of(name).describe(config)
        except (ImportError, ValueError, KeyError):
            pass
    return "/".join(f"{k}={v}" for k, v in sorted(config.items()) if k not in ("kernel", "description", "overrides"))


def __getattr__(name: str):
    # names this module held at 0.2.0 that live elsewhere now: Restriction, Tunable, MAX_DIM, resolve, BadInput
    return moved(__name__, name)
