"""Options shared by the commands that price plans (solve, estimate, pareto, replan): prices, objective, bounds."""

from __future__ import annotations

from typing import Annotated

import typer

from haap_milp.catalog.prices import load_prices, unpriced_custom
from haap_milp.cli.common import err_console, finite
from haap_milp.objectives import Goal

PricesOpt = Annotated[str | None, typer.Option(
    "--prices", help="YAML of $ per GPU-hour and board power per GPU type, over the catalog's (haap-solve schema "
                     "prices; catalog: AWS us-east-1 on-demand list prices, 2024, and one spot snapshot).")]
PriceKindOpt = Annotated[str, typer.Option("--price", "--price-kind", help="on-demand | spot: which price of the "
                                           "book to use (on_demand also accepted).")]
ObjectiveOpt = Annotated[str, typer.Option(
    "--objective", help="time | cost | energy: minimise iteration time, $ per iteration or J per iteration "
                        "(cost and energy: exact epsilon-constraint sweep over the GPUs' hourly rate).")]
MaxCostOpt = Annotated[float | None, typer.Option(
    "--max-cost-per-hour", help="$ per hour the GPUs a plan uses may cost (the cluster is a pool: up to, not all).")]
MinTpsOpt = Annotated[float | None, typer.Option("--min-tokens-per-s", help="Throughput a plan must reach.")]
MaxTimeOpt = Annotated[float | None, typer.Option("--max-iteration-time", help="Seconds an iteration may take.")]
RobustOpt = Annotated[float | None, typer.Option(
    "--robust", help="PCT: the plan whose worst-case iteration time is least when each GPU type's compute may be "
                     "off by +/-PCT %% (links as measured).")]
MaxPointsOpt = Annotated[int, typer.Option("--max-points", help="Most frontier points (solves) to search (pareto; "
                                                                 "solve --objective cost|energy with a bound on T).")]
StepOpt = Annotated[float, typer.Option(
    "--step", help="Relative rate step between frontier points (eq. F1): 0 = every frontier point, 0.05 = the next "
                   "budget 5 %% below the last plan's rate (the stated bound then allows for it).")]


def price_book(prices: str | None, kind: str, cluster=None):
    """The book of ``--prices`` / ``--price``; with ``cluster``, a stderr warning for its rows that price nothing."""
    book = load_prices(prices, kind)
    lost = unpriced_custom(book, cluster.gpu_types) if cluster is not None else []
    if lost:
        err_console.print(f"warning: --prices {prices!r} has rows for GPU(s) {', '.join(lost)}, which neither the "
                          "catalog nor the cluster has; they price nothing (the cluster's GPUs keep the catalog's "
                          "prices).", markup=False, highlight=False, soft_wrap=True)
    return book


def goal_from_flags(objective: str, max_cost: float | None, min_tps: float | None, max_time: float | None,
                    robust: float | None, tokens_per_iteration: int, max_points: int = 8, step: float = 0.05) -> Goal:
    """The Goal of the flags (each checked by its own name); the T bound is the tighter of the two."""
    if max_cost is not None:
        finite(max_cost, "--max-cost-per-hour", lo=0, hi=1e9)  # $/h; above it the rate weights overflow
    if min_tps is not None:
        finite(min_tps, "--min-tokens-per-s", lo=1e-9)
    if max_time is not None:
        finite(max_time, "--max-iteration-time", lo=1e-9)
    if robust is not None:
        finite(robust, "--robust", lo=0, hi=1000)
    finite(step, "--step", lo=0, hi=0.9)
    if not 1 <= max_points <= 1000:
        finite(float(max_points), "--max-points", lo=1, hi=1000)
    from haap_milp.frontier import time_bound

    goal = Goal(objective, max_cost, time_bound(max_time, min_tps, tokens_per_iteration),
                None if robust is None else robust / 100, max_points, step)
    from haap_milp.objectives import validate

    validate(goal)
    return goal
