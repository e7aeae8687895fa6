"""Engine flags for every CLI command (`serve`, `generate`, `bench --engine inprocess`, `sim`),
generated from the config dataclasses so names and help never drift from the offline API."""

from __future__ import annotations

import argparse
import dataclasses
import types
from typing import Any, Union, get_args, get_origin, get_type_hints

from pacer.config import CacheConfig, ModelConfig, SchedulerConfig, StructuredOutputsConfig

__all__ = ["add_engine_args", "engine_kwargs_from_args"]

_CLASSES = (ModelConfig, SchedulerConfig, CacheConfig, StructuredOutputsConfig)


def _base_type(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return str if len(args) > 1 else args[0]
    return tp


def _mapping_parser(value_type: Any) -> Any:
    """'a=4,b=1' (or JSON '{"a": 4}') -> {"a": 4, "b": 1} with values of `value_type`."""
    def parse(text: str) -> dict[str, Any]:
        import json

        if text.strip().startswith("{"):
            items = list(json.loads(text).items())
        else:
            items = [tuple(part.split("=", 1)) for part in text.split(",") if part.strip()]
        out: dict[str, Any] = {}
        for item in items:
            if len(item) != 2 or not str(item[0]).strip():
                raise argparse.ArgumentTypeError(f"expected NAME=VALUE pairs separated by commas, got {text!r}")
            try:
                out[str(item[0]).strip()] = value_type(item[1])
            except ValueError:
                raise argparse.ArgumentTypeError(f"{item[0]}: {item[1]!r} is not a {value_type.__name__}") from None
        return out

    parse.__name__ = "mapping"
    return parse


def add_engine_args(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    group = parser.add_argument_group("engine")
    for klass in _CLASSES:
        hints = get_type_hints(klass)
        for f in dataclasses.fields(klass):
            if f.name in skip:
                continue
            flag = "--" + f.name.replace("_", "-")
            if flag in parser._option_string_actions:
                continue   # defined by the command itself with the same meaning (bench's --slo)
            help_ = f.metadata.get("help", "")
            tp = _base_type(hints[f.name])
            if tp is bool:
                group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_)
            elif get_origin(tp) is tuple:
                group.add_argument(flag, dest=f.name, action="append", default=None, help=help_ + " (repeatable)")
            elif get_origin(tp) is dict:
                group.add_argument(flag, dest=f.name, type=_mapping_parser(get_args(tp)[1]), default=None,
                                   metavar="NAME=VALUE,...", help=help_)
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
