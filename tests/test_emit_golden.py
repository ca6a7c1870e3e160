"""Emitter outputs against golden files (regenerate: HAAP_UPDATE_GOLDEN=1 pytest tests/test_emit_golden.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _emit_cases import CASES

from haap_milp.emit import EmitError, emit

GOLDEN = Path(__file__).parent / "golden"
PAIRS = [(case, target) for case, (_, _, _, ok) in CASES.items() for target in ok]


@pytest.mark.parametrize("case,target", PAIRS)
def test_emit_matches_golden(case, target):
    factory, model, cluster, _ = CASES[case]
    files = emit(factory(), target, cluster, model)
    folder = GOLDEN / case / target
    if os.environ.get("HAAP_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, text in files.items():
            (folder / name).write_text(text)
    expected = {p.name: p.read_text() for p in folder.iterdir()}
    assert set(files) == set(expected), f"files differ from {folder}"
    for name, text in files.items():
        assert text == expected[name], f"{folder / name} differs (HAAP_UPDATE_GOLDEN=1 to accept)"


REFUSED = [(case, target) for case, (_, _, _, ok) in CASES.items()
           for target in ("megatron", "flagscale", "torchtitan") if target not in ok]


@pytest.mark.parametrize("case,target", REFUSED)
def test_other_targets_refuse_with_a_pointer(case, target):
    factory, model, cluster, ok = CASES[case]
    with pytest.raises(EmitError) as err:
        emit(factory(), target, cluster, model)
    msg = str(err.value)
    assert "--target" in msg and any(t in msg for t in ok)
