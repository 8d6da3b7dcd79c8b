"""The model registry: a model is a name, the builder of its IR program, and its options.

Everything that names a model -- the CLI, the trial database, the measurement worker, the
runtime, export, bench -- goes through :func:`model_spec`. A model registers with
:func:`register_model`; the built-in ones do in :mod:`rgtune.ir.models`. A model from the user's
own code is registered by a call, or named by its import path ``"package.module:builder"``
(which is also how a worker process rebuilds it: it imports the path).

**Code is imported only where the user asked for it.** :func:`model_spec` is for a name the caller
wrote (a ``--model`` argument, ``load_tuned("mypkg.models:f", ...)``): a path there is imported.
A name read from a file or a database row (an export folder, a trial database someone shares) goes
through :func:`recorded_model`: it is looked up among the models this process registered (or
imported by their path), and its import path is imported only with ``trust_code=True``. Otherwise
it is :class:`UntrustedModelError`, naming the path and how to load it deliberately: a file can name
``"os:system"`` or a module it ships beside itself, and importing that runs its code.

A builder is ``builder(in_dim, out_dim, heads=1, **options) -> Program``. Its *options* are its
keyword-only parameters (``num_bases=30``; a ``Literal[...]`` annotation lists the values one
takes): they are part of a workload's identity, written
canonically as the non-default ones, sorted (:meth:`ModelSpec.key`: ``"num_bases=30"``; ``""``
when all are at their defaults, which is how rows from before options existed read).

Example:
    >>> from rgtune.ir.program import ProgramBuilder
    >>> def mean_conv(in_dim: int, out_dim: int, heads: int = 1, *, scale: float = 1.0):
    ...     p = ProgramBuilder("mean_conv", in_dim)
    ...     msg = p.typed_linear(p.src(p.x), "weight", out=(1, out_dim), by="rel")
    ...     return p.finish(p.aggregate(p.scale(msg, scale)))
    >>> spec = register_model("mean_conv", mean_conv)
    >>> [(o.name, o.default) for o in spec.options]
    [('scale', 1.0)]
    >>> spec.key({"scale": "0.5"})           # option values from the command line are parsed
    'scale=0.5'
    >>> spec.build(4, 3, options={"scale": 0.5}).params["weight"].shape
    (4, 3)
    >>> spec.resolve({"scael": 1})
    Traceback (most recent call last):
    ...
    rgtune.ir.registry.ModelOptionError: model 'mean_conv' has no option 'scael'; its options: scale (float, default 1.0)
    >>> unregister_model("mean_conv")
"""

from __future__ import annotations

import ast
import importlib
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from rgtune.ir.program import IRError, Program

__all__ = ["Option", "ModelSpec", "ModelOptionError", "UnknownModelError", "UntrustedModelError", "register_model",
           "unregister_model", "model_spec", "registered_model", "recorded_model", "list_models", "build_model",
           "parse_options", "parse_key"]

Builder = Callable[..., Program]
_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


class UnknownModelError(IRError):
    """No model of that name is registered (or importable)."""


class UntrustedModelError(UnknownModelError):
    """A file or database row names a model that is not registered here, by a module path that would
    have to be imported (and so run) to build it; the caller did not allow that."""


class ModelOptionError(IRError):
    """A model option that does not exist or a value it does not take."""


@dataclass(frozen=True)
class Option:
    """One option of a model: its name, type, default and (optionally) the values it takes.

    ``default=None`` means "off" (e.g. ``num_bases``: no basis decomposition); a value given on
    the command line as text is converted to ``type``.
    """

    name: str
    type: type
    default: Any = None
    choices: tuple[Any, ...] | None = None
    help: str = ""

    def check(self, value: Any, model: str) -> Any:
        """``value`` converted to the option's type (text from a command line included), or a
        :class:`ModelOptionError` naming it and what is valid."""
        if value is None or (isinstance(value, str) and value.lower() == "none" and self.default is None):
            return None
        try:
            converted = _convert(value, self.type)
        except (TypeError, ValueError):
            raise ModelOptionError(f"model {model!r}: option {self.name}={value!r} is not a {self.type.__name__}"
                                   f"{self._valid()}") from None
        if self.choices is not None and converted not in self.choices:
            raise ModelOptionError(f"model {model!r}: option {self.name}={value!r} is not valid{self._valid()}")
        return converted

    def _valid(self) -> str:
        return f"; choose one of {list(self.choices)}" if self.choices is not None else ""

    def describe(self) -> str:
        what = "|".join(map(str, self.choices)) if self.choices is not None else self.type.__name__
        return f"{self.name} ({what}, default {self.default})"


def _convert(value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ValueError(value)
    if kind is int and (isinstance(value, bool) or (isinstance(value, float) and not value.is_integer())):
        raise ValueError(value)
    if kind in (int, float) and isinstance(value, str):
        return kind(float(value)) if kind is int and "." in value else kind(value)
    if kind is str and not isinstance(value, str):
        raise TypeError(value)
    return kind(value)


@dataclass(frozen=True)
class ModelSpec:
    """A registered model (see the module docstring)."""

    name: str
    builder: Builder
    options: tuple[Option, ...] = ()
    description: str = ""
    #: ``"module:qualname"`` that re-imports the builder in another process (None: not importable)
    source: str | None = None
    _by_name: dict[str, Option] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({o.name: o for o in self.options})

    def resolve(self, options: Mapping[str, Any] | str | None = None) -> dict[str, Any]:
        """Every option's value: the given ones (a mapping, or canonical text) checked and converted, the
        rest at their defaults."""
        given = parse_key(options) if isinstance(options, str) else dict(options or {})
        unknown = sorted(set(given) - set(self._by_name))
        if unknown:
            valid = ", ".join(o.describe() for o in self.options) or "none"
            raise ModelOptionError(f"model {self.name!r} has no option {unknown[0]!r}; its options: {valid}")
        return {o.name: o.check(given[o.name], self.name) if o.name in given else o.default for o in self.options}

    def key(self, options: Mapping[str, Any] | str | None = None) -> str:
        """The canonical text of ``options`` (a mapping, or such a text): the non-default ones, sorted,
        ``name=value`` joined by commas (:func:`parse_key` reads it back)."""
        resolved = self.resolve(options)
        parts = []
        for o in sorted(self.options, key=lambda o: o.name):
            if resolved[o.name] != o.default:
                text = str(resolved[o.name])
                if "," in text or "=" in text:
                    raise ModelOptionError(f"model {self.name!r}: option {o.name}={text!r} cannot hold ',' or '='")
                parts.append(f"{o.name}={text}")
        return ",".join(parts)

    def build(self, in_dim: int = 64, out_dim: int = 64, heads: int = 1,
              options: Mapping[str, Any] | str | None = None) -> Program:
        """The model's program at these sizes and options."""
        for what, v in (("in_dim", in_dim), ("out_dim", out_dim), ("heads", heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise IRError(f"model {self.name!r}: {what} must be a positive int, got {v!r}")
        return self.builder(in_dim, out_dim, heads, **self.resolve(options))


_REGISTRY: dict[str, ModelSpec] = {}
_LOCK = threading.Lock()


def register_model(name: str, builder: Builder, options: Sequence[Option] | None = None, *,
                   description: str | None = None, replace: bool = False) -> ModelSpec:
    """Register ``builder`` as model ``name``; ``options`` default to the builder's keyword-only
    parameters (their defaults and annotations). Registering the same builder again is a no-op;
    another builder under a taken name needs ``replace=True``."""
    _builtins()  # the built-in models first, in their order
    if not isinstance(name, str) or not name or any(c.isspace() for c in name) or "," in name:
        raise IRError(f"a model name is a non-empty string without spaces or commas, got {name!r}")
    spec = ModelSpec(name, builder, tuple(options) if options is not None else _signature_options(builder),
                     description if description is not None else _first_line(builder.__doc__), _source(builder))
    with _LOCK:
        old = _REGISTRY.get(name)
        if old is not None and old.builder is not builder and not replace:
            raise IRError(f"model {name!r} is already registered (by {old.source or old.builder!r}); "
                          "pass replace=True to replace it")
        _REGISTRY[name] = spec
    return spec


def unregister_model(name: str) -> None:
    with _LOCK:
        _REGISTRY.pop(name, None)


def list_models() -> list[str]:
    """The registered models' names (the built-in ones first, in their order)."""
    _builtins()
    return list(_REGISTRY)


def model_spec(name: str) -> ModelSpec:
    """The model ``name`` as the caller wrote it: a registered one (any case), or one imported from
    ``"module:attr"`` (registered under that path). The attribute may be a :class:`ModelSpec` or a
    builder. A name read from a file or a database row goes through :func:`recorded_model` instead."""
    spec = registered_model(name)
    if spec is not None:
        return spec
    if ":" not in name:
        raise UnknownModelError(f"unknown model {name!r}; choose one of {list(_REGISTRY)}, register one with "
                                "rgtune.register_model(name, builder), or name a builder as 'package.module:function'")
    return _import_model(name, name)


def registered_model(name: str, source: str | None = None) -> ModelSpec | None:
    """The model registered in this process as ``name`` (any case), or else one registered from the
    import path ``source`` (a builder this process imported by that path); None if neither. Imports
    nothing."""
    _builtins()
    with _LOCK:
        if name in _REGISTRY:
            return _REGISTRY[name]
        if isinstance(name, str) and ":" not in name and name.lower() in _REGISTRY:
            return _REGISTRY[name.lower()]
        path = name if isinstance(name, str) and ":" in name else source
        if path is not None:
            for spec in _REGISTRY.values():
                if spec.source == path:
                    return spec
    return None


def recorded_model(name: str, source: str | None = None, *, origin: str, trust_code: bool = False) -> ModelSpec:
    """The model a file or a database row names: ``name``, and ``source``, the import path the writer
    recorded for it.

    A model registered here (:func:`registered_model`) is returned without importing anything. A
    path (``name`` itself, or ``source``) is imported only with ``trust_code``: else this is
    :class:`UntrustedModelError`, whose one line names ``origin`` (what was read, e.g. ``"export
    folder tuned_rgcn/"``), the model, the path, and the two ways to load it deliberately.

    Example:
        >>> recorded_model("rgcn", "rgtune.ir.models:rgcn", origin="a test").name
        'rgcn'
        >>> recorded_model("planted", "os:system", origin="export folder planted/")
        Traceback (most recent call last):
        ...
        rgtune.ir.registry.UntrustedModelError: export folder planted/ names model 'planted' from 'os:system', which is not registered in this process; rgtune imports no code a file or database names. Register the model first (import the module that defines it, which calls rgtune.register_model), or pass trust_code=True (--trust-code) if you trust whoever wrote it
    """
    spec = registered_model(name, source)
    if spec is not None:
        return spec
    path = name if ":" in name else source
    if path is None:
        raise UnknownModelError(f"{origin} names model {name!r}, which is not registered in this process "
                                f"(registered: {list(_REGISTRY)}); register it with rgtune.register_model first")
    if not trust_code:
        raise UntrustedModelError(
            f"{origin} names model {name!r} from {path!r}, which is not registered in this process; rgtune imports "
            "no code a file or database names. Register the model first (import the module that defines it, which "
            "calls rgtune.register_model), or pass trust_code=True (--trust-code) if you trust whoever wrote it")
    return _import_model(name, path)


def _import_model(name: str, path: str) -> ModelSpec:
    """Import the builder at ``path`` (``"module:attr"``) and register it as ``name``."""
    module_name, _, attr = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as e:
        raise UnknownModelError(f"model {name!r}: cannot import {path!r} ({type(e).__name__}: {e})") from None
    if name in _REGISTRY:  # importing the module registered it
        return _REGISTRY[name]
    if isinstance(target, ModelSpec):
        return register_model(name, target.builder, target.options, description=target.description)
    if not callable(target):
        raise UnknownModelError(f"model {name!r}: {path!r} is a {type(target).__name__}, not a program builder")
    return register_model(name, target)


def build_model(name: str, in_dim: int = 64, out_dim: int = 64, heads: int = 1,
                options: Mapping[str, Any] | str | None = None) -> Program:
    """The program of model ``name`` (see :func:`model_spec`) with ``options`` (a mapping, or their
    canonical text)."""
    return model_spec(name).build(in_dim, out_dim, heads, options)


def parse_key(text: str) -> dict[str, str]:
    """The options of a canonical text (:meth:`ModelSpec.key`), as texts: ``"a=1,b=x"`` -> ``{"a": "1", "b": "x"}``."""
    return parse_options([part for part in text.split(",") if part]) if text else {}


def parse_options(pairs: Sequence[str]) -> dict[str, str]:
    """``["num_bases=30", ...]`` (the CLI's repeated ``--model-opt``) as a dict of texts; the model's
    :meth:`ModelSpec.resolve` converts them."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ModelOptionError(f"a model option is name=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


# ----------------------------------------------------------------------------- helpers
def _signature_options(builder: Builder) -> tuple[Option, ...]:
    options = []
    for p in inspect.signature(builder).parameters.values():
        if p.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        if p.default is inspect.Parameter.empty:
            raise IRError(f"{builder.__qualname__}: option {p.name!r} needs a default")
        choices = _literal_choices(p)
        kind = type(choices[0]) if choices else _option_type(p)
        options.append(Option(p.name, kind, p.default, choices))
    return tuple(options)


def _literal_choices(p: inspect.Parameter) -> tuple[Any, ...] | None:
    """The values of a ``Literal[...]`` annotation (text, under postponed annotations, or the object)."""
    note = p.annotation
    if isinstance(note, str):
        note = note.strip()
        if note.startswith(("Literal[", "typing.Literal[")) and note.endswith("]"):
            try:
                values = ast.literal_eval("(" + note[note.index("[") + 1:-1] + ",)")
            except (ValueError, SyntaxError):
                return None
            return tuple(values)
        return None
    args = getattr(note, "__args__", None)
    return tuple(args) if args and getattr(note, "__origin__", None) is Literal else None


def _option_type(p: inspect.Parameter) -> type:
    """The option's type from its annotation (``int``, ``int | None``, ...) or else its default's."""
    note = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
    for word in str(note).replace("|", " ").replace("Optional[", " ").replace("]", " ").split():
        if word in _TYPES:
            return _TYPES[word]
    return type(p.default) if p.default is not None else str


def _source(builder: Builder) -> str | None:
    module, qualname = getattr(builder, "__module__", None), getattr(builder, "__qualname__", "")
    return None if not module or "<" in qualname else f"{module}:{qualname}"


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n")[0]


def _builtins() -> None:
    import rgtune.ir.models  # noqa: F401  (registers the built-in models)
