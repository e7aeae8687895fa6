"""Structured-output fields of a request body -> `StructuredOutputsParams`, with the name
of the field it came from (compile errors later name that field too).

Accepted, on both endpoints: OpenAI's `response_format` (`text`, `json_object`,
`json_schema` with `json_schema.schema`, vLLM's `structural_tag` in its original
`structures`/`triggers` shape or xgrammar's `format` one: pacer.structural_tag), vLLM's
`structured_outputs` object (`json`, `regex`, `choice`, `grammar`, `json_object`,
`structural_tag` (an object or its JSON text), `disable_any_whitespace`) and vLLM's older
`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`. At most one of the three
spellings per request.
"""

from __future__ import annotations

from typing import Any

from pacer.errors import FieldError
from pacer.request import StructuredOutputsParams
from pacer.server.api.errors import bad_request
from pacer.structural_tag import normalize_structural_tag

__all__ = ["parse_structured"]

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_SO_KEYS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag", "disable_any_whitespace")
_IGNORED_GUIDED = ("guided_decoding_backend", "guided_whitespace_pattern")


def _make(param: str, **kwargs: Any) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**kwargs)
    except FieldError as e:
        if param.startswith("structured_outputs"):   # the nested field at fault, as it is spelled
            raise bad_request(e.field, str(e)) from None
        raise bad_request(param, str(e).replace("structured_outputs.", f"{param}.", 1)) from None
    except (TypeError, ValueError) as e:
        raise bad_request(param, str(e).replace("structured_outputs.", f"{param}.", 1)
                          if param != "structured_outputs" else str(e)) from None


def _from_response_format(value: Any) -> tuple[StructuredOutputsParams | None, str]:
    if not isinstance(value, dict):
        raise bad_request("response_format", 'response_format must be an object such as {"type": "json_object"}')
    kind = value.get("type")
    if kind == "text":
        return None, "response_format"
    if kind == "json_object":
        return _make("response_format", json_object=True), "response_format"
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request("response_format.json_schema",
                              'response_format.json_schema must be an object {"name", "schema", "strict"}')
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema",
                              "response_format.json_schema.schema must be a JSON schema object")
        return _make("response_format.json_schema.schema", json=schema), "response_format.json_schema.schema"
    if kind == "structural_tag":
        try:
            tag = normalize_structural_tag(value, "response_format")
        except FieldError as e:
            raise bad_request(e.field, str(e)) from None
        return _make("response_format", structural_tag=tag), "response_format"
    raise bad_request("response_format", "response_format.type must be text, json_object, json_schema or "
                                         f"structural_tag; got {kind!r}")


def _from_structured_outputs(value: Any) -> StructuredOutputsParams:
    if not isinstance(value, dict):
        raise bad_request("structured_outputs", "structured_outputs must be an object")
    unknown = sorted(set(value) - set(_SO_KEYS))
    if unknown:
        raise bad_request(f"structured_outputs.{unknown[0]}",
                          f"structured_outputs.{unknown[0]} is not supported (supported: {', '.join(_SO_KEYS)})")
    kwargs = {k: v for k, v in value.items() if v is not None}
    kinds = [k for k in _SO_KEYS[:6] if k in kwargs]
    return _make(f"structured_outputs.{kinds[0]}" if len(kinds) == 1 else "structured_outputs", **kwargs)


def parse_structured(body: dict[str, Any]) -> tuple[StructuredOutputsParams | None, str | None]:
    """The request's constraint and the field it came from, or (None, None)."""
    given = [k for k in ("response_format", "structured_outputs", *_GUIDED) if body.get(k) is not None]
    if body.get("response_format") == {"type": "text"}:
        given.remove("response_format")
    if len(given) > 1:
        raise bad_request(given[1], f"{given[0]} and {given[1]} cannot both be given: pick one way to "
                                    "constrain the output")
    if not given:
        return None, None
    field = given[0]
    if field == "response_format":
        return _from_response_format(body[field])
    if field == "structured_outputs":
        params = _from_structured_outputs(body[field])
        return params, f"structured_outputs.{params.kind}"
    return _make(field, **{_GUIDED[field]: body[field]}), field
