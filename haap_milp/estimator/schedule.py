"""Pipeline schedules for the estimator: iteration time and activations in flight.

The closed forms live in ``haap_milp/pipeline.py`` (eqs. T1-T3, M1; interleaved 1F1B and GPipe):
``iteration_time`` and ``inflight`` here are the estimator's entry points with the schedule first,
so a scored plan and ``problem.evaluate`` share one formula. 1F1B is PipeDream-Flush (Narayanan et
al. SC'21 sec. 2.2); GPipe has the same time (same bubble) but keeps all M micro-batches in flight;
interleaved 1F1B with vpp chunks shrinks the bubble by vpp (SC'21 sec. 2.2.2).
"""

from __future__ import annotations

from haap_milp import pipeline
from haap_milp.pipeline import inflight

__all__ = ["inflight", "iteration_time", "loss_inflight"]


def iteration_time(schedule: str, t: list[float], c: list[float], s: list[float], m: int, vpp: int = 1,
                   c_wrap: float = 0.0, blocking: bool = False) -> float:
    """Iteration time of the schedule (``pipeline.iteration_time``; ``blocking``: eq. T2b)."""
    return pipeline.iteration_time(t, c, s, m, schedule, vpp, c_wrap, blocking)


def loss_inflight(schedule: str, m: int) -> float:
    """Micro-batches whose LM-head input and fp32 logits the last stage keeps at its peak: all M under GPipe (every
    forward before any backward); else 1 - under 1F1B the last stage's in-flight count is already 1 (eq. M1), and
    under Megatron's interleaved 1F1B the last rank's warm-up runs only the first vpp - 1 chunks of each micro-batch
    (``(vpp - 1)·P`` forwards), then each micro-batch's last chunk (the loss) is followed at once by its backward,
    so one micro-batch of logits is alive at a time (megatron/core/pipeline_parallel/schedules.py,
    forward_backward_pipelining_with_interleaving)."""
    return float(m) if schedule == "gpipe" else 1.0
