"""Emitter outputs against golden files (regenerate: HAAP_UPDATE_GOLDEN=1 pytest tests/test_emit_golden.py)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
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


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("case,target", PAIRS)
def test_emitted_shell_scripts_parse_and_stop_on_a_missing_variable(case, target, tmp_path):
    """Every emitted .sh passes ``bash -n`` (an apostrophe in a ``${VAR:?message}`` -- "the model's" -- left a quote
    open, so every megatron and torchtitan launch.sh failed with 'unexpected EOF'); launch.sh run without its
    variables stops at the first one it names."""
    factory, model, cluster, _ = CASES[case]
    files = emit(factory(), target, cluster, model)
    for name, text in files.items():
        if name.endswith(".sh"):
            (tmp_path / name).write_text(text)
            proc = subprocess.run(["bash", "-n", str(tmp_path / name)], capture_output=True, text=True, check=False)
            assert proc.returncode == 0, (name, proc.stderr)
    if "launch.sh" in files:
        env = {"PATH": os.environ.get("PATH", ""), "MASTER_ADDR": "h0"}
        proc = subprocess.run(["bash", str(tmp_path / "launch.sh")], capture_output=True, text=True, env=env,
                              check=False, timeout=30)
        assert proc.returncode != 0 and ": set " in proc.stderr and "EOF" not in proc.stderr, proc.stderr


REFUSED = [(case, target) for case, (_, _, _, ok) in CASES.items()
           for target in ("megatron", "flagscale", "torchtitan") if target not in ok]


@pytest.mark.parametrize("case,target", REFUSED)
def test_other_targets_refuse_with_a_pointer(case, target):
    factory, model, cluster, ok = CASES[case]
    with pytest.raises(EmitError) as err:
        emit(factory(), target, cluster, model)
    msg = str(err.value)
    assert "--target" in msg and any(t in msg for t in ok)


@pytest.mark.parametrize("name", ['a"""b', "x\\N", "ends\\", 'q"'])
def test_a_model_name_with_quotes_or_backslashes_keeps_the_torchtitan_module_valid_python(name):
    """The model name sits in haap_torchtitan.py's docstrings: 'a\"\"\"b' ended one (SyntaxError) and 'x\\N' made a
    bad escape; the name is escaped there, the module compiles and its docstring reads the name back."""
    factory, model, cluster, _ = CASES["uniform"]
    odd = model.model_copy(update={"name": name})
    plan = factory().model_copy(update={"model": name})
    text = emit(plan, "torchtitan", cluster, odd)["haap_torchtitan.py"]
    tree = compile(text, "haap_torchtitan.py", "exec", flags=ast.PyCF_ONLY_AST)
    assert name in ast.get_docstring(tree)
