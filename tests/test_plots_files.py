"""Plots are written (PNG and SVG), non-trivial, and drawn from plain data."""

from __future__ import annotations

import pytest
from _emit_cases import DENSE, H100_A100, hetero_uniform_plan

from haap_milp.estimator import Estimator
from haap_milp.report.plots import StageMemory, memory_bars, plot_memory, plot_timeline
from haap_milp.simulate import simulate, simulate_plan
from haap_milp.specs import TrainingSpec


def _assert_images(paths, min_png=8_000, min_svg=4_000):
    assert [p.suffix for p in paths] == [".png", ".svg"]
    png, svg = paths
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > min_png
    text = svg.read_text()
    assert "<svg" in text and svg.stat().st_size > min_svg


@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
def test_timeline_plot(tmp_path, schedule, vpp):
    sim = simulate([1.0, 1.2, 0.8, 1.0], [2.0, 2.4, 1.6, 2.0], [0.2, 0.5, 0.2], [0.5] * 4, num_microbatches=8,
                   schedule=schedule, vpp=vpp)
    paths = plot_timeline(sim, tmp_path / "sub" / "timeline")
    _assert_images(paths)
    svg = paths[1].read_text()
    assert "forward" in svg and "backward" in svg  # legend text kept as text (svg.fonttype none)


def test_memory_plot_from_dicts_and_dataclasses(tmp_path):
    rows = [StageMemory("s0", 10, 5, 20, 30, 3, 80, 76),
            {"label": "s1", "weights_gib": 8, "activations_gib": 20, "capacity_gib": 32, "usable_gib": 30.4}]
    _assert_images(plot_memory(rows, tmp_path / "memory"), min_png=5_000, min_svg=3_000)
    with pytest.raises(ValueError):
        plot_memory([], tmp_path / "none")


def test_plots_of_an_estimated_plan(tmp_path):
    plan = hetero_uniform_plan()
    est = Estimator(DENSE, H100_A100, TrainingSpec(global_batch_size=plan.global_batch_size, seq_len=plan.seq_len))
    estimate = est.estimate(plan)
    bars = memory_bars(plan, estimate, H100_A100)
    assert [b.capacity_gib for b in bars] == [80.0, 80.0]
    assert all(b.usable_gib < b.capacity_gib for b in bars)
    assert [round(b.total_gib, 6) for b in bars] == [round(s.memory_gib, 6) for s in estimate.stages]
    _assert_images(plot_memory(bars, tmp_path / "mem"), min_png=5_000, min_svg=3_000)
    _assert_images(plot_timeline(simulate_plan(plan, est), tmp_path / "tl"))
