"""Typed errors raised at the input boundary.

The CLI turns any ``HaapInputError`` into one paragraph on stderr and exit code 2.
Infeasible planning problems are *results* (``Status.INFEASIBLE``), not errors.
"""

from __future__ import annotations


class HaapInputError(ValueError):
    """A user mistake: bad file, unknown name, impossible value.

    ``field`` names the offending field (dotted path), ``value`` quotes what was given,
    and the message says what would work.
    """

    def __init__(self, message: str, *, field: str | None = None, value: object = None):
        super().__init__(message)
        self.field = field
        self.value = value

    def __str__(self) -> str:  # one paragraph, no traceback noise
        return self.args[0] if self.args else "invalid input"


class PlanInvalidError(HaapInputError):
    """A plan given by the user that cannot be scored as it is (wrong sizes, does not fit)."""
