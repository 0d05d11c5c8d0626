"""Launch configurations as data: a kernel's tunables, validated, hashed and resolved per level.

Each kernel's adapter declares its tunables in a :class:`TunableSpec`: the names, the allowed values of
each, the restrictions between them (Kernel Tuner's ``restrictions`` is the model), a short label, and
the level dimensions an override may be conditioned on.  A config file
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

This module imports only the standard library: the GPU worker uses it on a machine without pydantic.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kinv.kernels.errors import ConfigError

MAX_DIM = 1 << 30
MAX_CONFIG_BYTES = 256 * 1024


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


# --------------------------------------------------------------------------- #
# the spec an adapter declares
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Tunable:
    """One launch parameter: its name, the values it may take, and its prefix in labels (``BT`` -> BT16)."""

    name: str
    values: tuple[int, ...]
    abbr: str
    said: str = ""
    # an optional tunable has a default: a config may leave it out, and a config that sets it to the default
    # is the same config (same label, same hash) as one that leaves it out
    default: int | None = None

    def says(self) -> str:
        return self.said or f"one of {', '.join(map(str, self.values))}"


@dataclass(frozen=True)
class Restriction:
    """A constraint between tunables: ``check(values) -> bool``; ``text`` says it to a person."""

    text: str
    check: Callable[[Mapping[str, int]], bool]


class Params(Mapping):
    """Resolved launch parameters of one level: a read-only mapping with attribute access (``p.BLOCK_T``)."""

    __slots__ = ("_values", "_spec")

    def __init__(self, values: Mapping[str, int], spec: TunableSpec):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_spec", spec)

    def __getattr__(self, name: str) -> int:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"{self._spec.kernel} has no tunable {name!r}; its tunables: "
                                 f"{', '.join(self._spec.names)}") from None  # fmt: skip

    def __setattr__(self, name, value):
        raise AttributeError("launch parameters are read-only")

    def __getitem__(self, key: str) -> int:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Params({self.short()})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items())))

    def short(self) -> str:
        return self._spec.label(self._values)


LaunchParams = Params
"""The first interface's name for resolved parameters (kernels annotate ``params: LaunchParams``)."""


@dataclass(frozen=True)
class TunableSpec:
    """Everything about a kernel's launch configuration: tunables, restrictions, label, override dimensions.

    ``override_dims`` maps each level dimension an override may be conditioned on to its abbreviation in
    labels (MLA: ``{"batch": "b"}`` -> ``[b>=9: w8]``).  ``override_choices`` names the categorical ones and
    their values: an override that says ``"shape": "v3"`` applies to that value only (MLA: ``{"shape":
    ("v3", "v4flash")}`` -> ``[v3 b>=96: BT32]``).
    """

    kernel: str
    tunables: tuple[Tunable, ...]
    restrictions: tuple[Restriction, ...] = ()
    override_dims: Mapping[str, str] = field(default_factory=dict)
    override_choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tunables)

    def tunable(self, name: str) -> Tunable:
        for t in self.tunables:
            if t.name == name:
                return t
        raise ConfigError(f"unknown tunable {brief_repr(name)} of {self.kernel}; its tunables: {', '.join(self.names)}")

    def label(self, values: Mapping[str, int]) -> str:
        return "/".join(f"{t.abbr}{values[t.name]}" for t in self.tunables
                        if t.name in values and (t.default is None or values[t.name] != t.default))

    def required(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tunables if t.default is None)

    def defaults(self) -> dict[str, int]:
        return {t.name: t.default for t in self.tunables if t.default is not None}

    def without_defaults(self, config: Mapping) -> dict:
        """``config`` less the optional tunables left at their defaults (what is hashed and written)."""
        d = self.defaults()
        return {k: v for k, v in config.items() if not (k in d and v == d[k])}  # an override says what it sets

    # ---- validation ------------------------------------------------------------------
    def check_value(self, where: str, key: str, value) -> int:
        t = self.tunable(key)
        if isinstance(value, bool) or not isinstance(value, int) or value not in t.values:
            raise ConfigError(f"{where}{key}={brief_repr(value)} is invalid: must be {t.says()}")
        return value

    def check_restrictions(self, values: Mapping[str, int], where: str = "") -> None:
        for r in self.restrictions:
            try:
                ok = bool(r.check(values))
            except (KeyError, TypeError, ZeroDivisionError):
                ok = False
            if not ok:
                shown = ", ".join(f"{k}={values[k]}" for k in self.names if k in values)
                raise ConfigError(f"{where}{shown} breaks the restriction {r.text}")

    def validate(self, data, kernel_name: str | None = None) -> dict:
        """A normalized copy of ``data`` or ConfigError naming the field."""
        names = self.names
        top = set(names) | {"kernel", "overrides", "description"}
        bound_keys = {f"{d}_{m}" for d in self.override_dims for m in ("min", "max")} | set(self.override_choices)
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a JSON object with keys {', '.join(names)}; got {type(data).__name__}")
        unknown = sorted(set(map(str, data)) - top)
        if unknown:
            raise ConfigError(f"unknown config key {brief_repr(unknown[0])}; valid keys: {', '.join(sorted(top))}")
        name = kernel_name or self.kernel
        if data.get("kernel", name) != name:
            raise ConfigError(f"kernel={brief_repr(data.get('kernel'))} but this is the config of {name!r}")
        missing = [k for k in self.required() if k not in data]
        if missing:
            raise ConfigError(f"config is missing {missing[0]!r}; required keys: {', '.join(self.required())}")
        data = {**self.defaults(), **data}
        out: dict = {k: self.check_value("", k, data[k]) for k in names}
        self.check_restrictions(out)
        if "kernel" in data:
            out["kernel"] = data["kernel"]
        if "description" in data:
            if not isinstance(data["description"], str):
                raise ConfigError(f"description={brief_repr(data['description'])} must be a string")
            out["description"] = data["description"]
        overrides = data.get("overrides", [])
        if not isinstance(overrides, list):
            raise ConfigError(f"overrides={brief_repr(overrides)} must be a list of objects")
        if overrides and not (self.override_dims or self.override_choices):
            raise ConfigError(f"{self.kernel} takes no overrides (it declares no level dimension to condition on)")
        norm = []
        for i, ov in enumerate(overrides):
            where = f"overrides[{i}]."
            if not isinstance(ov, dict):
                raise ConfigError(f"overrides[{i}]={brief_repr(ov)} must be an object with "
                                  f"{'/'.join(sorted(bound_keys))} and tunables")  # fmt: skip
            unknown = sorted(set(map(str, ov)) - set(names) - bound_keys)
            if unknown:
                raise ConfigError(f"unknown key {where}{brief_repr(unknown[0])}; valid keys: "
                                  f"{', '.join(sorted(set(names) | bound_keys))}")  # fmt: skip
            item = {}
            for d in self.override_dims:
                for k in (f"{d}_min", f"{d}_max"):
                    if k in ov:
                        v = ov[k]
                        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DIM:
                            raise ConfigError(f"{where}{k}={brief_repr(v)} is invalid: must be an integer from 1 to {MAX_DIM}")
                        item[k] = v
                if item.get(f"{d}_min", 1) > item.get(f"{d}_max", MAX_DIM):
                    raise ConfigError(f"{where}{d}_min={item[f'{d}_min']} is above {d}_max={item[f'{d}_max']}")
            for d, choices in self.override_choices.items():
                if d in ov:
                    if ov[d] not in choices:
                        raise ConfigError(f"{where}{d}={brief_repr(ov[d])} is invalid: must be one of "
                                          f"{', '.join(choices)}")  # fmt: skip
                    item[d] = ov[d]
            params = {k: self.check_value(where, k, ov[k]) for k in names if k in ov}
            if not params:
                raise ConfigError(f"{where[:-1]} changes no tunable; give at least one of {', '.join(names)}")
            self.check_restrictions({**out, **params}, where)
            item.update(params)
            norm.append(item)
        if norm:
            out["overrides"] = norm
        return out

    # ---- use -------------------------------------------------------------------------
    def resolve(self, config: Mapping, dims: Mapping[str, int]) -> Params:
        """The parameters for one level (its dimensions ``dims``); the first matching override wins."""
        d = self.defaults()  # an optional tunable a config predates is at its default
        values = {k: config[k] if k in config or k not in d else d[k] for k in self.names}
        for ov in config.get("overrides", []):
            if all(ov.get(f"{d}_min", 1) <= dims.get(d, 0) <= ov.get(f"{d}_max", MAX_DIM)
                   for d in self.override_dims if f"{d}_min" in ov or f"{d}_max" in ov) and all(
                   ov[d] == dims.get(d) for d in self.override_choices if d in ov):  # fmt: skip
                values.update({k: ov[k] for k in self.names if k in ov})
                break
        return Params(values, self)

    def describe(self, config: Mapping) -> str:
        """Human label such as ``BT16/BH16/w4/s2`` or ``BT16/BH16/w4/s2 [b>=9: w8]``."""
        base = self.label(config)
        parts = []
        for ov in config.get("overrides", []):
            rngs = [str(ov[d]) for d in self.override_choices if d in ov]
            for d, ab in self.override_dims.items():
                lo, hi = ov.get(f"{d}_min"), ov.get(f"{d}_max")
                if lo or hi:
                    rngs.append(f"{ab}{lo}-{hi}" if lo and hi else (f"{ab}>={lo}" if lo else f"{ab}<={hi}"))
            change = ",".join(f"{t.abbr}{ov[t.name]}" for t in self.tunables if t.name in ov)
            parts.append(f"{' '.join(rngs) or 'all'}: {change}")
        return base + (f" [{'; '.join(parts)}]" if parts else "")


# --------------------------------------------------------------------------- #
# helpers that find the spec through the config's kernel
# --------------------------------------------------------------------------- #
def spec_of(kernel: str) -> TunableSpec:
    from kinv.kernels.adapter import get_adapter

    return get_adapter(kernel).spec


def validate_config(data, kernel: str | None = None) -> dict:
    """Validate ``data`` against the tunables of ``kernel`` (or of the kernel the config names)."""
    name = kernel or (data.get("kernel") if isinstance(data, dict) else None)
    if not isinstance(name, str):
        raise ConfigError("config names no kernel: add \"kernel\": \"<name>\" (see `kinv kernels`)")
    try:
        from kinv.kernels.adapter import get_adapter

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
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc.strerror or type(exc).__name__}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what} {path} is {len(raw)} bytes; the limit is {MAX_CONFIG_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not UTF-8 text") from None
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


def resolve(config: dict, dims: Mapping[str, int] | object) -> Params:
    """The launch parameters of ``config`` at one level (a Level or a mapping of its dimensions)."""
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


__all__ = [
    "LaunchParams",
    "Params",
    "Restriction",
    "Tunable",
    "TunableSpec",
    "brief_repr",
    "canonical_json",
    "config_hash",
    "describe",
    "load_config",
    "one_line",
    "read_json",
    "resolve",
    "spec_of",
    "validate_config",
]
