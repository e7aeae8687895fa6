"""Engine flags for every CLI command (`serve`, `generate`, `bench --engine inprocess`, `sim`),
generated from the config dataclasses so names and help never drift from the offline API."""

from __future__ import annotations

import argparse
import dataclasses
import types
from typing import Any, Union, get_args, get_origin, get_type_hints

from pacer.config import CacheConfig, ModelConfig, SchedulerConfig

__all__ = ["add_engine_args", "engine_kwargs_from_args"]

_CLASSES = (ModelConfig, SchedulerConfig, CacheConfig)


def _base_type(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return str if len(args) > 1 else args[0]
    return tp


def add_engine_args(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    group = parser.add_argument_group("engine")
    for klass in _CLASSES:
        hints = get_type_hints(klass)
        for f in dataclasses.fields(klass):
            if f.name in skip:
                continue
            flag = "--" + f.name.replace("_", "-")
            help_ = f.metadata.get("help", "")
            tp = _base_type(hints[f.name])
            if tp is bool:
                group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_)
            else:
                group.add_argument(flag, dest=f.name, type=tp, default=None, help=help_)


def engine_kwargs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Only the flags the user set; the config's defaults apply to the rest."""
    out: dict[str, Any] = {}
    for klass in _CLASSES:
        for f in dataclasses.fields(klass):
            v = getattr(args, f.name, None)
            if v is not None:
                out[f.name] = v
    return out
