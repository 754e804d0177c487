"""The error a field of a run's configuration raises (one line naming the field and what it can
take), and the checks every section of `TrainConfig` makes of its own fields with it."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap


class FieldError(ValueError):
    """A field of `TrainConfig` holds a value it cannot take; `.field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check(section, name: str, ok, rule: str, integer: bool = False, optional: bool = False,
          field: str | None = None) -> None:
    """Raise "NAME RULE, got VALUE" unless ok(value) for `section`'s field `name` (`field`: its name
    on the command line, when another); with `integer`, a non-integer (or a bool) is "NAME must be
    an integer"; with `optional`, None passes."""
    value, field = getattr(section, name), field or name
    if optional and value is None:
        return
    if integer and (not isinstance(value, int) or isinstance(value, bool)):
        raise FieldError(field, f"{field} must be an integer, got {value!r}")
    try:
        good = ok(value)
    except TypeError:
        good = False
    if not good:
        raise FieldError(field, f"{field} {rule}, got {value!r}")


def choice(section, name: str, allowed: tuple[str, ...], field: str | None = None) -> None:
    """Raise unless `section`'s field `name` is one of `allowed`."""
    value, field = getattr(section, name), field or name
    if value not in allowed:
        raise FieldError(field, f"{field} {value!r} is not supported; allowed: {', '.join(allowed)}")


@functools.cache
def docs(cls: type) -> dict[str, str]:
    """Each field of the dataclass `cls` with the docstring written under it, on one line: Python
    keeps no attribute docstrings at run time, so they are read from the class's source (what the
    command line shows as the field's help). {} when the source cannot be read."""
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    except (OSError, TypeError, SyntaxError):
        return {}
    out = {}
    for stmt, after in zip(body, body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            out[stmt.target.id] = " ".join(after.value.value.split())
    return out
