"""fp32 / tf32 plans emit without a 16-bit flag (Megatron's default precision is fp32), never a traceback."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_fp32_plan_emits_without_16_bit_flags(run_cli, tmp_path, precision):
    plan = tmp_path / "plan.json"
    code, _, err = run_cli(["solve", "-m", "llama3-8b", "-c", "a100-80g:16", "--gbs", "64", "--precision", precision,
                            "--solver", "dp", "--json", str(plan)])
    assert code == 0, err
    for target, name in (("megatron", "megatron_args.sh"), ("flagscale", "flagscale_train.yaml")):
        out = tmp_path / target
        code, _, err = run_cli(["emit", str(plan), "--target", target, "--out", str(out)])
        assert code == 0, err
        text = (out / name).read_text()
        assert "bf16" not in text and "fp16" not in text, (target, text)
