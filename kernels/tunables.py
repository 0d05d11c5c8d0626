"""What a kernel declares about its launch: its tunables, the restrictions between them, and the
:class:`TunableSpec` that validates a config against them and resolves it at a level.

Each kernel's adapter declares its tunables in a :class:`TunableSpec`: the names, the allowed values of
each, the restrictions between them (Kernel Tuner's ``restrictions`` is the model), a short label, and
the level dimensions an override may be conditioned on.  Reading, hashing and describing a config by its
kernel's name is :mod:`kinv.kernels.launch_config`'s.

This module imports only the standard library: the GPU worker uses it on a machine without pydantic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from kinv.kernels.errors import ConfigError
from kinv.kernels.moved import moved

MAX_DIM = 1 << 30


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


def read_text_file(path, what: str, limit: int, error: type[Exception]) -> str:
    """A user's text file (a plan, a config) read whole, or ``error`` with one line saying why not: missing,
    unreadable, over ``limit`` bytes, not UTF-8."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc.strerror or type(exc).__name__}") from None
    if len(raw) > limit:
        raise error(f"{what} {path} is {len(raw)} bytes; the limit is {limit}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not UTF-8 text") from None


def __getattr__(name: str):
    # names this module held at 0.2.0 that live elsewhere now: LaunchParams (now kinv.kernels.launch_config's)
    return moved(__name__, name)
