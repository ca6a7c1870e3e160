"""The one shape every rule check returns (checker and emitters alike)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    """A broken rule: which rule, which stage (None: the whole plan), and the numbers."""

    rule: str
    stage: int | None
    message: str

    def __str__(self) -> str:
        where = "plan" if self.stage is None else f"stage {self.stage}"
        return f"[{self.rule}] {where}: {self.message}"
