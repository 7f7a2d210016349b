"""`--set SWEEP.SETTING=VALUE`: change one setting of a `CleanerConfig` from the command line;
SWEEP is a sweep, or a service the cleaner hosts (`--set publisher.batch_size=5000`).

Values are parsed by the setting's declared type: seconds and counts as numbers, `none` for
"off" where a setting allows None, lists comma-separated. Retention per outcome is
`--set retention.keep.completed=3600`. Errors name the setting and what it accepts.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from cleaner.daemon import SWEEPS, CleanerConfig
from txtasks.errors import ConfigurationError
from txtasks.services import Service, discovered

NONE_WORDS = {"none", "off", "forever"}
#: The sweeps whose settings --set may change.
SETTABLE = (*SWEEPS, "stats")


def cleaner_services(config: CleanerConfig) -> Mapping[str, Service | None]:
    """The services a cleaner with `config` would host, by name (None: turned off)."""
    found = {n: s for n, s in discovered().items() if "cleaner" in s.hosts}
    return {**found, **config.services}


def config_with(config: CleanerConfig, assignment: str) -> CleanerConfig:
    """`config` with one `path=value` assignment applied (a new, validated config)."""
    path, sep, text = assignment.partition("=")
    names = path.strip().split(".")
    services = cleaner_services(config)
    if not sep or len(names) < 2 or names[0] not in (*SETTABLE, *services):
        raise ConfigurationError(
            f"--set {assignment!r}: expected SWEEP.SETTING=VALUE with SWEEP one of "
            f"{', '.join((*SETTABLE, *services))}"
        )
    found = services[names[0]] if names[0] in services else getattr(config, names[0])
    if found is None:
        raise ConfigurationError(f"--set {assignment!r}: sweep {names[0]} is turned off")
    if not dataclasses.is_dataclass(found):
        raise ConfigurationError(f"--set {assignment!r}: service {names[0]} has no settings")
    changed = _assign(found, names[1:], text, path)
    if names[0] in services:
        return dataclasses.replace(config, services={**config.services, names[0]: changed})
    return dataclasses.replace(config, **{names[0]: changed})


def _assign(obj: Any, names: list[str], text: str, path: str) -> Any:
    known = {f.name for f in dataclasses.fields(obj) if f.init}
    if names[0] not in known:
        raise ConfigurationError(
            f"--set {path}: {type(obj).__name__} has no setting {names[0]!r} "
            f"(settings: {', '.join(sorted(known))})"
        )
    if len(names) > 1:
        inner = _assign(getattr(obj, names[0]), names[1:], text, path)
        return dataclasses.replace(obj, **{names[0]: inner})
    hint = typing.get_type_hints(type(obj))[names[0]]
    value = parse(hint, text.strip(), path)
    try:
        return dataclasses.replace(obj, **{names[0]: value})
    except ConfigurationError as exc:
        raise ConfigurationError(f"--set {path}={text.strip()}: {exc}") from None


def parse(hint: Any, text: str, path: str) -> Any:
    """Parse `text` as a value of type `hint`."""
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    if type(None) in options and text.lower() in NONE_WORDS:
        return None
    for option in options:
        if option is bool:
            if text.lower() in ("true", "yes", "1", "on", "false", "no", "0"):
                return text.lower() in ("true", "yes", "1", "on")
        elif option in (int, float):
            try:
                return option(text)
            except ValueError:
                continue
        elif typing.get_origin(option) is tuple:
            return tuple(part.strip() for part in text.split(",") if part.strip())
        elif option is str:
            return text
    wanted = " or ".join(getattr(o, "__name__", str(o)) for o in options if o is not type(None))
    raise ConfigurationError(f"--set {path}={text}: expected {wanted}")


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)
