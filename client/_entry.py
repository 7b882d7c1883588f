"""Entry types: the `Entry` base class, `GenericEntry`, and the registry of type names.

An entry type is a dataclass that subclasses `Entry`. Its wire type name, its supertypes and how
to decode each field are worked out once per class and cached on the class (`entry_info`), so that
encoding an entry does no reflection per call.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

__all__ = ["Entry", "EntryInfo", "GenericEntry", "entry_info", "registered_class"]

# type name -> the class that decodes it. Module-level classes live as long as their module
# anyway, so a plain dict costs nothing and keeps decoding deterministic.
_REGISTRY: dict[str, type[Entry]] = {}


class Entry:
    """Base class of entry types. Subclass it and decorate the subclass with ``@dataclass``::

        @dataclass
        class Task(outrig.Entry):
            job: str | None = None
            n: int | None = None

        @dataclass
        class UrgentTask(Task, type_name="jobs.UrgentTask"):
            deadline: float | None = None

    Give every field a ``None`` default: a field left ``None`` is a wildcard when the entry is
    used as a template (there is no way to match "field is None", as in JavaSpaces).

    The wire type name is ``"<module>.<qualname>"`` unless given with ``type_name=``. The
    supertypes are the other `Entry` subclasses in the class's MRO, most derived first, so a
    template of type ``Task`` also matches ``UrgentTask`` entries. Entries read back from a space
    come back as the registered class of their type name, or as `GenericEntry` when no class in
    this process has that name.

    A type name belongs to one class: defining a second, different class with the same name
    raises ``TypeError``. Re-creating the same class (same module and qualified name, as when a
    module is reloaded or ``@dataclass(slots=True)`` rebuilds it) replaces the old one.

    Entries read from a space are rebuilt field by field without calling ``__init__`` or
    ``__post_init__`` (as JavaSpaces does): fields the entry lacks are ``None``, fields the class
    does not declare are dropped.
    """

    __slots__ = ()

    # Set on every subclass, in its own __dict__ (see _own_type_name).
    _outrig_type_name: ClassVar[str]

    def __init_subclass__(cls, *, type_name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if type_name is None:
            # dataclass(slots=True) rebuilds the class from its __dict__ without the class
            # keywords; the copied name keeps an explicit type_name alive across that.
            type_name = cls.__dict__.get("_outrig_type_name") or f"{cls.__module__}.{cls.__qualname__}"
        if not isinstance(type_name, str) or not type_name:
            raise TypeError(f"type_name of {cls.__qualname__} must be a non-empty str, got {type_name!r}")
        existing = _REGISTRY.get(type_name)
        if existing is not None and _qualified(existing) != _qualified(cls):
            raise TypeError(
                f"entry type name {type_name!r} of {_qualified(cls)} "
                f"is already used by {_qualified(existing)}"
            )
        cls._outrig_type_name = type_name
        _REGISTRY[type_name] = cls


@dataclass(frozen=True)
class GenericEntry:
    """An entry of a type that has no `Entry` class in this process.

    Reads return one when the entry's type name is not registered. It can also be written, or
    used as a template (fields that are ``None`` are wildcards then), to work with types whose
    classes you do not have.

    Attributes:
        type_name: the entry's own (most derived) type name.
        supertypes: its supertypes' names, most derived first.
        fields: field name -> value; typed arrays decode as ``array.array``.
    """

    type_name: str
    supertypes: tuple[str, ...] = ()
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """What the codec needs to know about one entry class, computed once (see `entry_info`)."""

    type_name: str
    supertypes: tuple[str, ...]
    #: (field name, decode typed arrays as numpy) for every dataclass field, in declaration order.
    fields: tuple[tuple[str, bool], ...]


def entry_info(cls: type[Entry]) -> EntryInfo:
    """Return the cached `EntryInfo` of an `Entry` subclass, computing it on first use.

    It cannot be computed in ``__init_subclass__``: ``@dataclass`` runs after the class exists,
    and annotations may name classes defined later in the module.
    """
    info = cls.__dict__.get("_outrig_info")
    if info is None:
        info = _build_info(cls)
        # Stored in the class's own __dict__; the lookup above ignores a base class's info.
        type.__setattr__(cls, "_outrig_info", info)
    return typing.cast(EntryInfo, info)


def registered_class(type_name: str) -> type[Entry] | None:
    """Return the entry class registered under a type name, or None."""
    return _REGISTRY.get(type_name)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _build_info(cls: type[Entry]) -> EntryInfo:
    if not (isinstance(cls, type) and issubclass(cls, Entry)) or cls is Entry:
        raise TypeError(f"{cls!r} is not an entry type: subclass outrig.Entry")
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"entry type {_qualified(cls)} must be a dataclass: decorate it with @dataclass")
    supertypes = tuple(
        base.__dict__["_outrig_type_name"]
        for base in cls.__mro__[1:]
        if isinstance(base, type) and issubclass(base, Entry) and base is not Entry
    )
    try:
        hints: dict[str, Any] = typing.get_type_hints(cls)
    except Exception:
        # Unresolvable annotations (names imported under TYPE_CHECKING, say): fall back to the
        # raw annotations, which _mentions_ndarray also reads as text.
        hints = {}
    fields = tuple((f.name, _mentions_ndarray(hints.get(f.name, f.type))) for f in dataclasses.fields(cls))
    return EntryInfo(cls._outrig_type_name, supertypes, fields)


def _mentions_ndarray(hint: object) -> bool:
    """Whether an annotation names numpy's ndarray anywhere (``ndarray | None``, ``NDArray[...]``).

    Checked by name so that numpy is never imported for classes that do not use it.
    """
    if isinstance(hint, str):
        return "ndarray" in hint or "NDArray" in hint
    if isinstance(hint, typing.ForwardRef):
        return _mentions_ndarray(hint.__forward_arg__)
    if isinstance(hint, type) and hint.__name__ == "ndarray" and hint.__module__.startswith("numpy"):
        return True
    origin = typing.get_origin(hint)
    if origin is Literal:
        return False
    if origin is not None and _mentions_ndarray(origin):
        return True
    return any(_mentions_ndarray(arg) for arg in typing.get_args(hint))
