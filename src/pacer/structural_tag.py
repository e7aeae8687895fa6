"""vLLM's `structural_tag` constraint, checked and put in one shape (plain Python).

A structural tag lets the output be free text until one of its `triggers` appears; from there
the text must continue with one of the `structures` that begin with that trigger: its `begin`
string, a JSON value matching its `schema`, then its `end` string, after which free text
resumes (a tool call or a JSON object inside prose). Two spellings are accepted:

- vLLM's (and SGLang's) original one, which is also the canonical form kept here:
  `{"type": "structural_tag", "structures": [{"begin": "<function=f>", "schema": {..},
  "end": "</function>"}], "triggers": ["<function="]}`;
- xgrammar's newer `format` one, for its `triggered_tags` format with JSON-schema contents:
  `{"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": [..], "tags":
  [{"begin": .., "content": {"type": "json_schema", "json_schema": {..}}, "end": ..}]}}`.

Every structure's `begin` must start with one of the triggers (llguidance's StructTag rule).
Errors are `FieldValueError`s naming the nested field (`<prefix>.structures[0].begin`).
"""

from __future__ import annotations

from typing import Any

from pacer.errors import FieldTypeError, FieldValueError

__all__ = ["normalize_structural_tag"]

_MAX_STRUCTURES = 64


def normalize_structural_tag(value: Any, field: str) -> dict[str, Any]:
    """`{"structures": [{"begin", "schema", "end"}...], "triggers": [...]}` from either spelling;
    `field` is how the caller's API names `value` (errors name fields below it)."""
    if not isinstance(value, dict):
        raise FieldTypeError(field, f"{field} must be an object with structures and triggers, "
                                    f"got {type(value).__name__}")
    if value.get("format") is not None:
        return _from_format(value["format"], f"{field}.format")
    structures, triggers = value.get("structures"), value.get("triggers")
    items = [_structure(s, f"{field}.structures[{i}]") for i, s in enumerate(_list(structures, f"{field}.structures"))]
    return _checked(items, _triggers(triggers, f"{field}.triggers"), f"{field}.structures")


def _from_format(fmt: Any, field: str) -> dict[str, Any]:
    if not isinstance(fmt, dict) or fmt.get("type") != "triggered_tags":
        kind = fmt.get("type") if isinstance(fmt, dict) else type(fmt).__name__
        raise FieldValueError(f"{field}.type", f"{field}.type must be triggered_tags (the supported structural "
                                               f"tag format), got {kind!r}")
    for flag in ("at_least_one", "stop_after_first"):
        if fmt.get(flag):
            raise FieldValueError(f"{field}.{flag}", f"{field}.{flag} is not supported (only false)")
    structures = []
    for i, tag in enumerate(_list(fmt.get("tags"), f"{field}.tags")):
        where = f"{field}.tags[{i}]"
        if not isinstance(tag, dict):
            raise FieldTypeError(where, f"{where} must be an object with begin, content and end")
        content = tag.get("content")
        if not isinstance(content, dict) or content.get("type") != "json_schema":
            raise FieldValueError(f"{where}.content", f"{where}.content must be "
                                                      '{"type": "json_schema", "json_schema": {...}}')
        structures.append(_structure({"begin": tag.get("begin"), "schema": content.get("json_schema"),
                                      "end": tag.get("end")}, where, schema_name="content.json_schema"))
    return _checked(structures, _triggers(fmt.get("triggers"), f"{field}.triggers"), f"{field}.tags")


def _list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise FieldValueError(field, f"{field} must be a non-empty list")
    if len(value) > _MAX_STRUCTURES:
        raise FieldValueError(field, f"{field} must have at most {_MAX_STRUCTURES} entries, got {len(value)}")
    return value


def _triggers(value: Any, field: str) -> list[str]:
    triggers = _list(value, field)
    if not all(isinstance(t, str) and t for t in triggers):
        raise FieldValueError(field, f"{field} must be a list of non-empty strings, got {triggers!r}")
    return list(triggers)


def _structure(s: Any, field: str, schema_name: str = "schema") -> dict[str, Any]:
    if not isinstance(s, dict):
        raise FieldTypeError(field, f"{field} must be an object with begin, {schema_name} and end")
    begin, schema, end = s.get("begin"), s.get("schema"), s.get("end")
    if not isinstance(begin, str) or not begin:
        raise FieldValueError(f"{field}.begin", f"{field}.begin must be a non-empty string")
    if not isinstance(end, str):
        raise FieldValueError(f"{field}.end", f"{field}.end must be a string")
    if not isinstance(schema, dict):
        raise FieldValueError(f"{field}.{schema_name}", f"{field}.{schema_name} must be a JSON schema object")
    return {"begin": begin, "schema": schema, "end": end}


def _checked(structures: list[dict[str, Any]], triggers: list[str], items: str) -> dict[str, Any]:
    for i, s in enumerate(structures):
        if not any(s["begin"].startswith(t) for t in triggers):
            raise FieldValueError(f"{items}[{i}].begin", f"{items}[{i}].begin {s['begin']!r} must start with one "
                                                         f"of the triggers {triggers!r}")
    return {"structures": structures, "triggers": triggers}
