"""Errors that name what was wrong: the request field at fault travels with the error as a type,
so an API maps it to OpenAI's `param` without reading the message. Vocabulary at the bottom of
the house: every room may raise these."""

from __future__ import annotations

__all__ = ["FieldError", "FieldValueError", "FieldTypeError"]


class FieldError(Exception):
    """The base of errors that blame one request field: `field` is its name as the API spells it
    (dotted for a nested one, e.g. `structured_outputs.json`); `code` an optional machine code."""

    field: str
    code: str | None = None

    def __init__(self, field: str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        if code is not None:
            self.code = code


class FieldValueError(FieldError, ValueError):
    """A field with a value out of its range (the message names the limit)."""


class FieldTypeError(FieldError, TypeError):
    """A field of the wrong type."""
