"""Best-first branch and bound over (micro-batch variant, tau interval) nodes; the exact engine
(CP-SAT or HiGHS) solves each node's model (formulations/README.md, "Search").

The objective is T = (M - 1) tau + sum_j t_j + sum_j c_j + sigma (eqs. T1-T3). Every variant fixes
M, so (M - 1) * tau is linear. Its plans are split by their steady-state period tau (eq. T2: the
slowest stage, half the slowest link, the 1F1B in-flight round trips) into intervals [a, b]: a
node's model has tau >= a and the layer bounds of tau <= b (eq. X1), which makes the LP far
tighter than over the whole range (eq. N1).
Nodes are taken lowest bound first; an unfinished node is split at its midpoint. A node is
pruned when its bound reaches the incumbent (less the requested gap); the global bound is
the least bound of the open and finished nodes.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import RawValue

import numpy as np

from haap_milp.deadline import current
from haap_milp.pipeline import TIME_RTOL, interleaved_period, sigma_share, steady_period, sync_share, within_gap
from haap_milp.problem import (
    Assignment,
    Problem,
    RawResult,
    boundary_times,
    evaluate,
    over_time,
    stage_times,
    sync_terms,
    violations,
    wrap_time,
)
from haap_milp.solvers.common import (
    dual_bundle,
    group_split,
    island_crossings,
    island_split,
    joint_capacity,
    late_hint,
    lp_point,
    node_pool,
    segment_dp,
)
from haap_milp.solvers.common import polish as polish_mod
from haap_milp.solvers.common.bounds import (
    VariantBound,
    capped_bound,
    capped_rest,
    infeasibility_reason,
    root_known,
    root_setup,
    signature_bounds,
)
from haap_milp.solvers.common.capacity_dp import capacity_bound, island_blocks, island_bound, island_parts
from haap_milp.solvers.common.dual_bundle import bundle_bound, resource_ray, with_gpu_time
from haap_milp.solvers.common.hints import canonical
from haap_milp.solvers.common.joint_capacity import joint_units
from haap_milp.solvers.common.lp import LPRelaxation, lp_relaxation, sigma_cap, tau_cap
from haap_milp.solvers.common.model import LinModel, build_model, sigma_limit_rows, sync_beta
from haap_milp.solvers.common.node_pool import NodePool
from haap_milp.solvers.common.polish import Polish, exchange
from haap_milp.solvers.common.sigma_dp import sigma_bound
from haap_milp.solvers.common.slot_bounds import Tables, build_tables, stage_count_bounds, subset
from haap_milp.solvers.common.stage_dp import PathDP, node_bound
from haap_milp.worker import fork_map, forks, shared_queue, taken

log = logging.getLogger(__name__)
MIN_NODE_S = 0.05  # stop when less time than this is left
# eq. PAR2 (formulations/README.md): up to POOL_SIZE worker processes (no more than --threads or the CPUs this process
# may use; fewer than 2: none) run the nodes once the search has run POOL_AFTER_S in this process, counted from its
# start (a short search stays in one process, node for node as before);
# POOL_GRACE_S: how long past the deadline their last nodes are waited for before they go back open (0: a node not
# back by the deadline stays open; measured: 0.2 s had a 10 s bench row end at 10.27 s, and stopping two workers takes
# 40-50 ms more, their memory torn down)
POOL_SIZE = 2
POOL_AFTER_S = 0.2
POOL_GRACE_S = 0.0
# eq. PAR2b: a worker's engine probes (eq. N17c) get up to this many times PROBE_S of wall time, as many as the workers'
# engine threads per CPU (two workers, each racing two engines, eq. N21, on two cores: 2; a probe there gets half the
# CPU it gets in one process). Measured: mixtral-8x7b x 4096 x 4 types (CLI space, 10 s) proven in 8 of 8 runs, 7 of
# 11 and 12 of 19 before (the probe on the node that finds its 1.0327 s plan ran out of time in the others)
POOL_PROBE_SCALE = 2.0
POOL_POLL_S = 0.05  # s between looks at Ctrl-C while waiting for a worker
# eq. N28: the engine's cut-off on a node the incumbent's time (less ASPIRE_RTOL) instead of the search's cut-off, so it
# returns plans better by less than the gap: True on every engine run (measured: fixes gpt3-13b x hetero3-4096's gap
# trap, costs llama3-70b x hetero3-4096 and x 4096 x 4 types their proofs at 10 s, in the runs that finish a node);
# "probe" (eq. N28b) on eq. N17c's probes only, the runs that finish a node aimed at the search's cut-off (measured:
# gpt3-13b x hetero3-4096 proven in 4 of 4 runs at a 14 s limit, 0 of 2 off, llama3-70b x hetero3-4096 proven as off);
# False: never
ASPIRE, ASPIRE_RTOL = "probe", 1e-6
# eq. PAR2c: the node workers share the least plan time any of them holds (a double in shared memory), so that a
# worker's cut-off is the best plan's, not the one its node was handed out with
SHARE_CUTOFF = True
# eq. PAR2d: a node worker's engine run gets the time left shared with the search's open nodes, as in one process (False:
# with its own heap's, empty on a worker, so half the time left)
SHARE_OPEN = True
# eq. PAR2e: an unfinished node's next engine run (twice the time, eq. N17) starts the engines from another seed (the
# command's seed + the node's tries): with the same seed CP-SAT replays its first run's search before going on, and a
# run's time on one node varies by 50x with the seed (measured: one node of mixtral-8x7b x hetero3-4096 took 1.1, 2.1,
# 4.1 and 7.8 s on its four runs from one seed). False: every run from the command's seed
RESTART_SEED = True
# eq. PAR5e: the floor dive's two processes take its variants from one shared list as each becomes free, and read each
# other's best plan time; False: eq. PAR5c's fixed shares
SHARE_DIVE = True
# least time given to an exact engine on a node (doubles on each retry). Eq. PAR2f: 2 s, not 1 s: the nodes that hold
# the last of the gap on large multi-type instances take CP-SAT 1.5-2.5 s, and cut at 1 s, then 2 s, they were run
# twice or three times over (llama3-70b x 4096 GPUs x 4 types: open at 1.56 % in 3 of 3 runs -> proven in 7.2-7.8 s)
MIN_ENGINE_S = 2.0
INITIAL_SPLIT = 4  # intervals per variant before the search starts
# share of the time limit for the engine on the warm start's variant (eq. N3). Off: measured on the
# presolved llama3-70b instances (1024 and 4096 GPUs x 3 types) a 0.25 share cost 2 s and left the
# 4096-GPU gap at 7.4 % instead of 1.5 %; on the synthetic instances it found better plans sometimes
PRIMAL_SHARE = 0.0
# candidate plans of the local search on each new incumbent: the stage DPs offer many (measured: 10,000 moves
# took 2 s on a 1278-option MoE problem, 200 us each)
OFFER_MOVES = 2_000
# eq. LS1f on each new incumbent that an engine's node gives on an interleaved copy, after its polish (whose 2,000
# candidates end before the local optimum where the walk tries LS1f on 16-stage copies: 4,597 from the engine's 0.48319 s
# plan on gpt3-13b x hetero3-4096, which LS1f takes to 0.47831 s, the optimum 0.47781 s). Not a larger OFFER_MOVES: 5,000
# reached that plan but lost mixtral-8x7b x 4096 x 3 types' (CLI space) 0.8650 s plan (0.8876 s, 6.1 -> 9.6-11.3 % at
# 10 s), a better polished incumbent earlier pruning the node that found it. Not on the DPs' plans as well: on the
# instance above LS1f then takes the stage DP's 0.48921 s plan to 0.48223 s, a local optimum of LS1 and LS1f from which
# the search's later plans no longer count (1.50 % at 10 s)
USE_OFFER_EXCHANGE = True
USE_STAGE_DP = True
# eq. N11: the Lagrangian multipliers of the stage DP by a trust-region cutting-plane method when several rows are
# priced (measured: llama3-70b x 3 types x 1024 GPUs, nodes the LP proves empty reached the cut-off in 5-9 DP runs;
# the subgradient's 12 stopped at 9-13 s against a 15.9 s cut-off)
USE_BUNDLE = True
USE_SIGMA = True  # eq. N8 after eq. N4 when the node survives
# eq. LS4: the segment DP's plans on nodes the DPs leave open, until SEG_TRIAL nodes in a row bring no better plan
# (measured: llama3-70b x 3 types x 1024 GPUs, the optimum's 0.13 % found on the 2nd node, 0.2-0.6 s a node; 12
# rather than 6 since eq. LS4a: mixtral-8x7b x 4096 x 3 types proven at 10 s end to end, 7.9 % before; 24 no better;
# 4 tried after eq. N17c: the quick grid 28 against 27 of 30 proven, but llama3-70b x hetero3-1024 (gbs 1024) lost
# its plan, 7.1922 -> 7.2608 s, which LS4 finds on its 5th node)
USE_SEGMENT_DP = True
SEG_TRIAL = 12
# eq. LS4g: under eq. U2, eq. LS4's plans with both ends of one tp, and with a head; its runs start while they are
# expected to end within SAME_TP_BUDGET_S of the call's start (measured: 17 runs, 0.36 s in all, on gpt3-13b x 64
# H100@ib + 64 A100-40@roce; one run of LS4 costs 0.2-2.6 s on three types x two islands)
USE_SAME_TP_PLANS = True
SAME_TP_BUDGET_S = 0.25
# eq. LS4h: where the exposed sync sigma of an eq. LS4 plan is set by a stage after the first (LS4 prices s_0 alone),
# LS4 again with sigma capped, up to SYNC_CAP_ROUNDS times (measured: qwen3-235b-a22b x hetero3-1024, gbs 2048, variant
# M 64, vpp 4 at the best plan's tau: LS4's plan 8.6525 s, its sigma 0.72 s from a 10-layer stage of 128 A100-80
# syncing 0.83 s; capped 8.1124 s; the best known 8.1035 s, the warm start 8.1849 s; 0.1 s a run)
USE_SYNC_CAP = True
USE_SYNC_RETRY = True  # eq. LS4h'
SYNC_CAP_ROUNDS = 4
SYNC_PREFIX_SHARE = 0.5  # a stage before a capped one counted at this share of the node's tau cap (eq. T3's offset)
# eq. LS4j: eq. LS4's plans with a tail (the last stage a second segment of a group), within TAIL_BUDGET_S a call
USE_TAIL_PLANS = True
TAIL_BUDGET_S = 0.3
# eqs. LS4h, LS4j at nodes too (not LS4 alone), where the node's LS4 plan, its sigma down to e_0, would lie under
# NODE_SYNC_ROOM of the incumbent (nodes are many: only where fixing the sync can gain that much; measured: at 0.96 the
# 3-type bench rows lost 0.5-1.5 s, formulations/README.md LS4j)
NODE_SEGMENT_PLANS = True
NODE_SYNC_ROOM = 0.92
SYNC_CAP_MIN = 0.01  # no capped runs where the plan's exposed sync above e_0 is under this share of its time
# eq. LS4b: before branching, where every island holds one group, the segment DP on each variant whose bound beats
# the incumbent, its tau cap lowered from eq. X1's to just under each better plan's own tau (measured: gpt3-13b on 128
# H100@ib + 128 A100-80@roce, the DP heuristic's 5.071 s, the scan's 4.660 s, the optimum; on three types x two
# islands one call costs 0.2-2.6 s and the scan cost the search more than it found: formulations/README.md, LS4b)
SCAN_SHARE = 0.15
SCAN_CALLS = 40
SCAN_STEP = 1e-3  # the least relative step of the cap below the last plan's tau
# eq. LS4c: before branching, on the warm start's variant and its neighbours, the period floor by bisection on eq. N11b
# (wherever there are several groups: on one GPU type over two islands as well, where eqs. LS4 and N15 do not run)
# (DIVE_RTOL wide) and eq. LS4's plan just above it (DIVE_SLACK); the floor lifts the variant's bound (measured: llama3-70b x 1024 x 3
# types, the warm start 14.714 s of variant M = 128, floor 0.09592 s in 7 probes, 0.26 s; the segment plan there
# 13.648 s, polished 13.644 s, the best known; a 6 s search from it ends at 2.5 % against 5.6 % from the warm start)
USE_FLOOR_DIVE = True
# of the exact search's time, at most DIVE_MAX_S, from the dive's own start (measured: qwen3-235b-a22b on 128 H100 @ib +
# 128 A100-80 @roce, where eq. LS4b's scan took the dive's whole budget when both counted from the search's start:
# 1.45-1.67 % at 10 s, with its own budget the dive's plan 24.313 s (24.363 s) and proven at 8.9-9.0 s, twice each)
DIVE_SHARE, DIVE_MAX_S = 0.15, 1.0
USE_CAPPED_FILL = True  # eq. B2i at the root (the cut-off's period cap)
NODE_CAPPED = True  # eq. B2i at each node's first visit (its own tables and cap b), before its DPs
NODE_CAPPED_TRIAL, NODE_CAPPED_MIN_S = 4, 0.1  # ... on the first nodes, then where nodes take this long (``_node_capped``)
DIVE_VARIANTS = 3  # the incumbent's and the two nearest micro-batch counts
DIVE_COPY = True  # eq. LS4k: after a plain incumbent, its stage count interleaved (nearest M, most chunks) second
DIVE_M_RATIO = 2.0  # an interleaved incumbent: the variants of its vpp (and vpp 1) within this ratio of its M (eq. LS4d)
PAR_DIVE = True  # eq. PAR5c: the incumbent's variant dived here, the others on a forked child
DIVE_RTOL = 2e-3  # the bisection stops when its bracket is this narrow, relative to its upper end (a floor of 0 ends too)
DIVE_SLACK = 0.01
# eq. LS4e: where the segment DP finds no plan at DIVE_SLACK above the floor, the next slack up, while below eq. X1's cap
# (measured: mixtral-8x7b x 4096 x 3 types, the optimum's variant M 16, vpp 4, P 16 has its floor at 0.03741 s and its
# plans from 0.0405 s: none at 1 %, the optimum found only by the search's joint DP at 7 s)
DIVE_SLACKS = (DIVE_SLACK, 3 * DIVE_SLACK, 9 * DIVE_SLACK, 27 * DIVE_SLACK)
# eq. LS4f: the dive's plans are polished (eq. LS1) when up to this share above the incumbent, not only below it
# (measured: mixtral-8x7b x 4096 x 3 types x 2 islands, the dive's plan of M 32, vpp 4, P 16 at 1.6003 s, 2.2 % above
# the incumbent, polishes to 1.5053 s, the best known)
DIVE_POLISH_MARGIN = 0.05
# eq. LS4i: each dive process's first segment plan (its first slack) runs even when the dive's clock ended its bisection
# first or the guess of its time (SEG_GUESS) does not fit before the deadline: at the bracket's top then, stopped with
# no plan after FIRST_PLAN_DIVES times the dive's own time (``segment_dp.segment_plan``'s ``stop``). Measured:
# llama3-70b x 256 x 3 types x 2 islands at 10 s, the warm start's variant's bisection takes the dive's 0.7-0.8 s and
# its segment plans 0.6-0.75 s (eqs. LS4, LS4h: 46.206 s against the warm start's 49.585 s). Without the rule they ran
# only where the bisection ended just before the clock; with one more dive's time they were cut at 0.73 s in one run of
# three; with two, paired runs at 10 s (solve_scaling rows): that row 46.206 s in 3 of 3 (2 of 3 without), llama3-70b x
# 256 x 2 types x 2 islands 40.652 s proven once in 3 (40.981 s in 3 of 3 without)
FIRST_PLAN, FIRST_PLAN_DIVES = True, 2.0
# eq. LS4's first run, before any has been timed, guessed at this many bisection probes (measured 15-16: 0.5 s against
# 0.03 s on llama3-70b x 1024 x 3 types, 1.5 s against 0.1 s on two islands)
SEG_GUESS = 20
# eq. N16: the stage DPs' Lagrangian bound per stage count (the least path of each count, every run's multipliers)
# drops the counts that reach the cut-off and narrows or splits the node's range
USE_SIG_FLOOR = True  # eq. U1c: a signature whose eq. B2 bound in the node reaches the cut-off gets no DP there
USE_PER_P = True
LIGHT_FIRST = True  # eq. N17
PROBE_S = 0.25  # eq. N17b (0: off)
PROBE_SPENT = 2.0  # eq. N17d: a probe runs at least this many times what the node's own bounding took (0: off)
# eq. N17c: a node the LP and the DPs leave open goes to the engine once its tau range is within ENGINE_WIDTH split
# widths (_split_width), for PROBE_S at most while wider than one; unfinished, it is split on tau. After PROBE_FAILS
# unfinished probes the search goes back to one split width (ENGINE_WIDTH 1: off)
ENGINE_WIDTH = 16.0
PROBE_FAILS = 2
SHARE_PROBE_FAILS = True  # eq. N17f: a node worker counts the whole search's unfinished probes, not only its own
# eq. N20: where every group's GPUs fit in one capacity state (joint_capacity.JOINT_MAX), the stage DP with all of them
# exact, and sigma's cases on it (eq. N20b), before eqs. N15, N5 and N6 (measured: formulations/README.md, N20)
USE_JOINT = True
JOINT_TRIAL = 4  # eq. N20 stops for the rest of a search after this many nodes without closing one
# eq. N20f: ... but it goes on after the trial where it has dropped a stage count (eq. N16) the other bounds kept while
# an engine run costs JOINT_DROP_RATIO times a run of it. Between the ratios measured: 1.0-1.3 on Sailor's 32+96 row
# (going on there cost 0.15-0.7 s), 3.3-5.9 on large_problem(1) in one process (going on there gained 2-4x)
JOINT_DROP_WINS = True
JOINT_DROP_RATIO = 2.0
# eq. N20h: sigma's cases (eq. N20b) run during their trial (the first CASE_TRIAL nodes they run on) and after it only
# where they have closed a node eq. N20 alone left open and, once this process has run an engine, where their closes
# times an engine run's mean time reach CASE_RATIO times their own time (a close saves about an engine run). Measured
# (formulations/README.md, N20h): Sailor's 80+240 row, cases closed 2 of 27 nodes for 2.2 s against engine runs of
# 0.01-0.3 s; mixtral-8x7b x hetero3-4096, 5 of 7 for 0.8 s against engine runs of seconds
USE_CASE_GATE = True
CASE_TRIAL = 4
CASE_RATIO = 1.0
SHARE_JOINT_WINS = True  # eq. N20d: ... in the whole search: a node worker keeps it while another process's closed one
JOINT_PLANS = True  # eq. N20's least paths offered as plans
# eq. N20b: sigma's cases stop after this long on a node (the count then keeps its N20 bound). Eq. N20e: 0.6 s, not
# 0.15 s: on a loaded 2-core VM the cases that close mixtral-8x7b x hetero3-4096's decisive nodes took longer, so those
# nodes went to CP-SAT, which does not finish them (formulations/README.md, N20e)
JOINT_S = 0.6
# eq. N20i: where the pooled state (and eq. N25) leave a node open, eq. N20 with every group its own digit (up to
# joint_capacity.WIDE_MAX states and OWN_STEPS steps a run); it stops for the rest of a search after OWN_TRIAL runs in a
# process without closing a node
USE_OWN_DIGITS = True
OWN_TRIAL = 4
# eq. N20k: eq. N20's by-group state past WIDE_MAX / WIDE_STEPS (up to joint_capacity.BIG_MAX / BIG_STEPS) where every
# island holds one group (two islands or more), on the first BIG_TRIAL nodes of a process that need it, after that
# only once one has closed a node there or lifted one's bound by BIG_LIFT of the cut-off (USE_BIG: switch)
USE_BIG = True
BIG_TRIAL = 3
BIG_LIFT = 0.03
USE_CROSSINGS = True  # eq. N25: where eq. N20 pools a GPU type over islands, its cases on the crossings between them
USE_CROSSING_PLAN = True  # eq. N25b in eq. LS4c's dive: the at-most-once case's plan beside eq. LS4's
USE_PRUNE = True  # eq. N27: eqs. N20/N25's runs drop partial paths that cannot finish below the incumbent / cut-off
USE_DP_TAU_CAP = True  # eq. N26: eq. N20's bound caps the node's tau range (the part above holds no plan under the cut-off)
USE_GROUP_SPLIT = True  # eq. N15 after eqs. N4/N11 (and N8) when several groups remain and the node survives
# eqs. LS4 and N15 run only where the groups hold two or more GPU types: on one type over two islands the groups are
# interchangeable but for their links, eqs. N6/N9 and the DP heuristic's island segments cover them, and the two
# cost there (measured end to end at 10 s: llama3-70b x 2 x 2048 H100 2.24 % gap without them, 4.93 % with;
# mixtral-8x7b 3.53 % / 5.31 %; the 64- and 512-GPU pairs the same either way)
# eq. N14c: with one priced row (one group, no budget) the capacity DP also runs when the Lagrangian path fits but mu > 0
USE_SLACK_CAP = True
# eq. N19: reduced-cost fixing of tau after the node LP; RC_SHRINK: the least share of the node's tau range a cap must
# cut to rebuild the node on the rest, at most RC_ROUNDS times a node
USE_RC_TAU = True
# eq. N22: before an engine runs on a node model of more than SIGMA_CAP_MIN_VARS variables, sigma capped at the cut-off
# less the LP of T - sigma (``lp.sigma_cap``; smaller models: the engine takes milliseconds, the LP would double it)
USE_SIGMA_CAP = True
SIGMA_CAP_MIN_VARS = 400  # (SMALL_MODEL's value)
# eq. N22b: on a node its LP leaves open, the cap's per-slot sync limits added and the LP solved again, at most this many
# rounds, each while the cap falls by SIGMA_LIFT_MIN (relative) at least (0: off). Off: sound and a third faster to the
# proof on MoE (qwen3-235b-a22b x hetero3-1024 at 45 s: 23.6 against 34.1 s), but on the 10 s grids it cost 6-14 % of
# the wall time and lost a row at the edge (formulations/README.md, N22b)
SIGMA_LIFT_ROUNDS = 0
SIGMA_LIFT_MIN = 0.01
SIGMA_LIFT_TRIAL = 4  # eq. N22b stops for the rest of a search after this many nodes without a close or a lift
RC_SHRINK = 0.1
RC_ROUNDS = 3
USE_ISLAND_PARTS = True  # eq. N9: each island bounded on its own when no link between islands is usable
USE_ISLAND_SPLIT = True  # eq. N9b: then one node per island, and islands another dominates left out
USE_EMPTY_ISLANDS = True  # eq. N6c: islands that cannot hold the node's plans alone add no case to eq. N6
SIGMA_OFFERS = 4  # of eq. N8's paths that fit, the last this many are offered as plans (each checked, maybe polished)
# the stage DPs stop for the rest of a search after this many nodes without a prune or a better plan from them
# (measured: llama3-8b on 32 A100-80 + 32 A100-40, 1 thread, 24 nodes: OPTIMAL in 2.5 s without them, 4.2 s with;
# the LP pruned every node there)
DP_TRIAL = 8
# the LP bound runs at every node, wide tau intervals included, until eq. N13c's trial stops it (measured: skipping it
# there always while the DPs stood in, the default bench grid fell from 21 to 7 of 43 proven at 10 s; formulations/README.md)
# eq. N13c: the LP after the DPs stops for the rest of a search after this many nodes in which it neither closed the node
# nor lifted the DPs' bound by LP_LIFT (relative); measured: mixtral-8x7b x 4096 H100, 230 nodes in 60 s, the LP closed
# none and exceeded the DP bound once, for a third of the search's time; 4 rather than 8: on two islands of 2048 H100
# (2-5 nodes a second there) 8 trials took a third of a 10 s search (formulations/README.md, eq. N13c)
LP_TRIAL = 4
LP_LIFT = 1e-3
# eq. N17e: in the full pass on a node the LP has left open, the bound-only DPs N15, N6 and N5 stop for the rest of a
# search (in this process) after this many such passes in a row in which they neither lifted the node's bound above its
# LP nor gave a better plan (eqs. N8, N20/N25 and LS4 keep their own trials). Measured, full grid at 10 s: 18 of 195
# such passes lifted it, and each took 0.5-1 s on the two-island rows of several types, where none did; on deepseek-v3
# x 512 H200 + 512 H100 every pass closed its node (formulations/README.md)
POST_LP_TRIAL = 1
# eq. N2d: a child split on its stage count next skips its LP where its parent's LP optimum lies in its own LP at or
# below its bound (False: never)
USE_LP_POINT = True
# the search's set-up (tables and eq. B2 bounds) goes on two processes (eq. PAR5) where the first variant's time says the
# rest takes at least this long (s)
SETUP_FORK_S = 0.05
SMALL_MODEL = 400  # models with at most this many variables go to the engine directly
NO_KEEP = (-1, -1)  # a node's (uniform signature, island): any


@dataclass(frozen=True)
class NodePolicy:
    """How a node is bounded and split (formulations/README.md, eqs. N2, N2b). Every choice is exact (a node is
    closed only by a valid bound or by the engine); only the work changes."""

    lp_first: bool = False  # the LP bound before the stage DPs, which then run only on nodes the LP leaves open
    p_first: bool = False  # split a node on its stage count before splitting its tau interval
    sig_first: bool = False  # under eq. U1 split a node on its uniform signature before anything else
    small_model: int = SMALL_MODEL  # models with at most this many variables go to the engine at once


# Eq. N2b, under blocking sends (eq. T2b, DeepSpeed's PipelineEngine). Measured on Sailor's six OPT-350M rows
# (benchmarks/results/solve_speed_sailor.md): the LP over a range of stage counts is far weaker than the LP of
# one count (80+240, node tau in [0.0690, 0.0694]: 2.636 s over P = 3..20, 2.675 s at the best single P;
# optimum 2.719 s), so splitting on P first prunes whole tau ranges per P; the LP (2-7 ms) is 4-10x cheaper
# than the stage DPs there and closes most nodes, after which the DPs pruned nothing and DP_TRIAL turns them
# off; and a small model sent to CP-SAT over a wide tau range cost more than splitting it.
BLOCKING_POLICY = NodePolicy(lp_first=True, p_first=True, sig_first=True, small_model=100)


def node_policy(problem: Problem) -> NodePolicy:
    """The measured policy for the problem's runtime (eq. N2b under blocking sends; eq. N2 elsewhere)."""
    return BLOCKING_POLICY if problem.p2p_blocking else NodePolicy()


@dataclass
class VariantResult:
    """What a solver's node model returns. ``bound_s`` bounds every plan of the node with
    T <= cutoff (None: nothing proven beyond the node's bound)."""

    status: str  # OPTIMAL | FEASIBLE | INFEASIBLE | NO_SOLUTION | ERROR
    assignment: Assignment | None = None
    bound_s: float | None = None
    stats: dict = field(default_factory=dict)
    message: str = ""


SolveNode = Callable[[Problem, LinModel, VariantBound, "float | None", float, "Assignment | None", object],
                     VariantResult]


_SEQ = itertools.count()


def _push(heap, bound, v, a, b, tries, plo, phi, mu=None, keep=NO_KEEP, lp=None) -> None:
    """A node (bound, variant, a, b, tries, P_lo, P_hi, seq, mu, keep, lp): ``seq`` keeps the heap from comparing the
    multipliers ``mu`` of eq. N4 (inherited by the children as their warm start); ``keep``: (sig, island), the one uniform
    signature (eq. U1) its plans have, -1 for any (eq. N2b); ``lp``: its parent's LP point (eq. N2d, ``lp_point``)."""
    heapq.heappush(heap, (bound, v, a, b, tries, plo, phi, next(_SEQ), mu, keep, lp))


@dataclass
class _State:
    inc: Assignment | None = None
    inc_obj: float = math.inf
    closed: list = field(default_factory=list)  # bounds of finished nodes
    stats: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    tol_s: float = 0.0
    nodes: int = 0
    engine_calls: int = 0
    dp_calls: int = 0  # nodes the stage DPs ran on
    dp_wins: int = 0  # of them: pruned by the DPs, or a better incumbent from their paths
    cap_dp_s: float = 0.0  # the longest capacity DP (eqs. N5, N6) so far, s
    lp_calls: int = 0  # eq. N13c: nodes the LP ran on after the DPs, and those where it closed or lifted the bound
    lp_wins: int = 0
    lift_calls: int = 0  # eq. N22b: nodes it ran on, and those it closed or lifted (it stops after SIGMA_LIFT_TRIAL
    lift_wins: int = 0  # without)
    sigma_calls: int = 0  # nodes eq. N8 ran on, and those it pruned (it stops after DP_TRIAL without a prune)
    sigma_wins: int = 0
    joint_calls: int = 0  # nodes eq. N20 ran on, and those it closed (it stops after JOINT_TRIAL without)
    joint_wins: int = 0
    joint_elsewhere: int = 0  # eq. N20d: on a node worker, the nodes eq. N20 closed in the whole search when it got this one
    joint_drops: int = 0  # eq. N20f: nodes where eq. N20 dropped a stage count the other bounds kept
    joint_s: float = 0.0  # eq. N20f: eq. N20's runs' time so far (s; ``joint_calls`` of them)
    engine_s: float = 0.0  # the engine runs' time so far (s; ``engine_calls`` of them)
    own_calls: int = 0  # eq. N20i: nodes it ran on, and those it closed (it stops after OWN_TRIAL without)
    own_wins: int = 0
    big_calls: int = 0  # eq. N20k: nodes the big state ran on, those it closed, its time (s) and its largest lift of a
    big_wins: int = 0  # node's bound (a share of the cut-off)
    big_s: float = 0.0
    big_lift: float = 0.0
    case_calls: int = 0  # eq. N20h: nodes eq. N20b's cases ran on, those where they closed a node eq. N20 left open,
    case_wins: int = 0  # and their time so far (s)
    case_s: float = 0.0
    split_calls: int = 0  # nodes eq. N15 ran on, and those it pruned (it stops after DP_TRIAL without a prune)
    split_wins: int = 0
    post_idle: int = 0  # eq. N17e: full passes after the LP in a row whose bound-only DPs neither lifted nor found a plan
    probe_fails: int = 0  # eq. N17c: probes the engine did not finish
    probe_s: float = field(default_factory=lambda: PROBE_S)  # eqs. N17b/c: a probe's wall time (eq. PAR2b: more on a worker)
    seg_idle: int = 0  # eq. LS4: nodes in a row on which the segment DP found no better plan
    worker_stats: dict = field(default_factory=dict)  # eq. PAR2: what the workers' nodes added to ``stats`` (_merge)
    sig_floors: dict = field(default_factory=dict)  # eq. U1c: variant -> {signature: its eq. B2 bound}
    node_s: float = 0.0  # this process's nodes so far: their time (s), with ``nodes`` their number
    build_s: float = 0.0  # node model builds so far: their time (s) and number
    builds: int = 0
    policy: NodePolicy = field(default_factory=NodePolicy)
    several_types: bool = True  # the groups hold two or more GPU types (eqs. LS4, LS4b, N15 run only then)
    several_groups: bool = True  # two or more groups, e.g. one GPU type on two islands (eq. LS4c runs only then)
    island_groups: bool = False  # two islands or more, each holding one group (eq. N20k runs only then)
    lagr: dict = field(default_factory=dict)  # eq. N17: the node's Lagrangian results by (signature, island part)
    run_cap: float = math.inf  # eq. N26: the tau cap of the DP run in progress (inf: none)
    node_cap: float = math.inf  # eq. N26: the node's tau cap after its DPs (the largest of its runs')
    shared: object = None  # eq. PAR2c: the least plan time any process of the search holds (a double in shared memory)
    open_elsewhere: int = 0  # eq. PAR2d: on a node worker, the open nodes the search held when it handed this one out

    def best_known(self) -> float:
        """Eq. PAR2c: the least plan time found so far by this process or any node worker (s)."""
        return self.inc_obj if self.shared is None else min(self.inc_obj, self.shared.value)

    def cut(self, r: float) -> float | None:
        """The cut-off: the best known plan time less the gap ``r`` (None before this process holds a plan)."""
        return self.best_known() * (1 - r) if self.inc is not None else None

    def publish(self) -> None:
        """Eq. PAR2c: this process's incumbent time made known to the other workers."""
        if self.shared is not None and self.inc_obj < self.shared.value:
            self.shared.value = self.inc_obj

    def offer(self, problem: Problem, a: Assignment | None, who: str, engine: bool = False, margin: float = 0.0) -> None:
        """``a`` becomes the incumbent if it beats it, polished (eq. LS1; an engine's plan on an interleaved copy eq.
        LS1f too); ``margin``: a plan up to that share above the incumbent is polished too, and kept if it then beats it
        (eq. LS4f)."""
        if a is None:
            return
        bad = violations(problem, a, time_bound=False)
        if not bad and over_time(problem, a):  # eq. TX1e: past T_max within the engine's rounding (eq. CP2) or
            return  # the DPs' plan of a node that T_max cuts; not a broken plan
        if bad:
            self.errors.append(f"{who}: decoded plan violates {bad[0]}")
            log.error("%s returned an infeasible plan: %s", who, bad)
            return
        obj = evaluate(problem, a)
        if obj < self.inc_obj * (1 + margin):
            run = Polish(problem, a, OFFER_MOVES)  # eq. LS1 (a move budget), then the form the models accept (eqs. D1, S1)
            run.step(OFFER_MOVES)
            a = run.best
            # eq. LS1f where the budget cut LS1's walk (at its local optimum the walk has tried LS1f on this plan)
            if USE_OFFER_EXCHANGE and engine and problem.variants[a.variant].num_stages and not (
                    run.optimal and polish_mod.USE_EXCHANGE_MOVES):
                a = exchange(problem, a, OFFER_MOVES)
            a = canonical(problem, build_tables(problem, a.variant), a)
            obj = evaluate(problem, a)
            if obj < self.inc_obj:  # (below it already, unless ``margin`` let a plan above it in)
                self.inc, self.inc_obj = a, obj
                self.publish()


def _steady(problem: Problem, a: Assignment) -> float:
    """tau of eq. T2 (eq. I2 for an interleaved variant) for the assignment."""
    var = problem.variants[a.variant]
    m = var.num_microbatches
    if var.vpp > 1:
        return interleaved_period(stage_times(problem, a), boundary_times(problem, a), m, var.vpp,
                                  wrap_time(problem, a))
    return steady_period(stage_times(problem, a), boundary_times(problem, a), m, blocking=problem.p2p_blocking)


def _m_eff(var) -> float:
    """M with (M - 1) the weight of tau: M itself (eq. T1), M + 1 - 1/vpp for an interleaved variant (eq. I1)."""
    return var.num_microbatches if var.vpp <= 1 else var.num_microbatches + 1 - 1 / var.vpp


def _worst_tau(t: Tables) -> float:
    c = t.coef
    # every stage and link of the pipeline in one period bounds the in-flight term of eq. T2
    return float(t.L * c["layer_time"].max() + c["first_time"].max() + c["last_time"].max()
                 + max(t.K - 1, 1) * t.p2p.max() * max(1, t.vpp))  # eq. I2-I3: vpp crossings (P >= 3)


def _primal(problem, options, st: _State, vb, tables, deadline, name, solve_node) -> dict:
    """Eq. N3: before branching, the engine improves the warm start on the whole range of its
    variant for PRIMAL_SHARE of the time (large models only); its bound floors that variant."""
    if st.inc is None or PRIMAL_SHARE <= 0:
        return {}
    v = st.inc.variant
    M = _m_eff(problem.variants[v])
    hi = (st.inc_obj - vb[v].rest_lb) / (M - 1) if M > 1 else None
    t = build_tables(problem, v, hi)
    if t.p_min == 0:
        return {}
    lm = build_model(problem, t, tau_lb=vb[v].tau_lb)
    if len(lm.names) <= SMALL_MODEL:
        return {}
    share = PRIMAL_SHARE * (deadline - time.perf_counter())
    res = _call(problem, options, st, lm, vb[v], st.inc_obj, share, st.inc, name, solve_node, v, primal=True)
    if res.status == "INFEASIBLE":  # nothing beats the warm start in this variant
        return {v: st.inc_obj}
    return {v: res.bound_s} if res.bound_s is not None else {}


def _call(problem, options, st: _State, lm, nb, cutoff, share, hint, name, solve_node, v, **kw) -> VariantResult:
    """One engine run, its statistics and its plan offered as incumbent."""
    t1 = time.perf_counter()
    try:
        res = solve_node(problem, lm, nb, cutoff, share, hint, options, **kw)
    except Exception as exc:  # a solver failure is a result, not a crash
        log.exception("%s failed on variant %d", name, v)
        res = VariantResult("ERROR", message=f"{type(exc).__name__}: {exc}")
    took = time.perf_counter() - t1
    st.engine_calls += 1
    st.engine_s += took
    st.stats[f"engine{st.engine_calls}"] = f"v{v} {res.status} {took:.2f}s"
    st.tol_s = max(st.tol_s, float(res.stats.get("tolerance_s", 0.0)))
    for key in ("vars", "rows"):
        if key in res.stats:
            st.stats[f"max_{key}"] = max(st.stats.get(f"max_{key}", 0), res.stats[key])
    if "race" in res.stats:  # eq. N21: which racer finished the node
        key = f"race_{res.stats['race']}"
        st.stats[key] = st.stats.get(key, 0) + 1
    if "fallback" in res.stats:  # the engine ran a node on its fallback backend (milp.py: CBC)
        st.stats["fallback_nodes"] = st.stats.get("fallback_nodes", 0) + 1
    if res.status == "ERROR":
        st.errors.append(res.message)
    st.offer(problem, res.assignment, name, engine=True)
    return res


def _roots(problem: Problem, st: _State, vb: list, tables: list, r: float, floors: dict) -> list:
    """Initial nodes (bound, variant, a, b, tries, P_lo, P_hi): each variant's tau range split in
    INITIAL_SPLIT; ``floors`` holds proven per-variant bounds (eq. N3)."""
    heap = []
    for v, b in enumerate(vb):
        if not math.isfinite(b.total_s) or floors.get(v, -math.inf) >= st.inc_obj:
            st.closed.append(min(floors.get(v, math.inf), math.inf))
            continue
        b = VariantBound(b.tau_lb, b.rest_lb, max(b.total_s, floors.get(v, -math.inf)))
        if USE_CAPPED_FILL and st.inc is not None:
            cut = st.cut(r)
            b = vb[v] = capped_bound(problem, tables[v], b, cut)
            if b.total_s >= cut:
                st.closed.append(cut)
                st.stats["capped_fill_closed"] = st.stats.get("capped_fill_closed", 0) + 1
                continue
        M = _m_eff(problem.variants[v])
        hi = _worst_tau(tables[v])
        if st.inc is not None and M > 1:
            hi = min(hi, (st.inc_obj - b.rest_lb) / (M - 1))  # eq. X1
        if M == 1 or hi <= b.tau_lb:
            heap.append((b.total_s, v, b.tau_lb, max(hi, b.tau_lb), 0, 0, 1 << 30, next(_SEQ), None, NO_KEEP, None))
            continue
        edges = [b.tau_lb + (hi - b.tau_lb) * i / INITIAL_SPLIT for i in range(INITIAL_SPLIT + 1)]
        for lo, up in itertools.pairwise(edges):
            heap.append((max((M - 1) * lo + b.rest_lb, floors.get(v, -math.inf)), v, lo, up, 0, 0, 1 << 30,
                         next(_SEQ), None, NO_KEEP, None))
    heapq.heapify(heap)
    return heap


def run_variants(problem: Problem, options, hint: Assignment | None, name: str, solve_node: SolveNode) -> RawResult:
    """Branch and bound over (variant, tau interval); see the module docstring."""
    t0 = time.perf_counter()
    dl = current()  # the command's deadline and Ctrl-C (deadline.py); the time limit is within it already
    deadline = t0 + min(options.time_limit_s, dl.remaining())
    r = options.relative_gap
    island = np.asarray(problem.group_island)
    st = _State(policy=node_policy(problem), several_types=len({island_split.gpu_type(g) for g in problem.groups}) > 1,
                several_groups=len(problem.groups) > 1,
                island_groups=len(island) > 1 and len(set(island.tolist())) == len(island))
    hint_ok = hint is not None and 0 <= hint.variant < len(problem.variants) and not violations(problem, hint)
    tables, vb = _variant_tables(problem, hint_ok, deadline, options.threads)
    if tables is None:
        return _unsearched(problem, hint, name, st, time.perf_counter() - t0)
    if hint_ok:
        st.offer(problem, canonical(problem, tables[hint.variant], hint), f"{name} hint")
        st.stats["hint_objective_s"] = st.inc_obj
    elif hint is not None:
        log.warning("%s: ignoring an infeasible hint", name)
    floors = _primal(problem, options, st, vb, tables, deadline, name, solve_node)
    _segment_scan(problem, st, vb, tables, r, t0 + SCAN_SHARE * (deadline - t0), name)
    # (eq. LS4c's budget counts from its own start: eq. LS4b's scan may have used the time since t0)
    _floor_dive(problem, st, vb, r, time.perf_counter() + min(DIVE_SHARE * (deadline - t0), DIVE_MAX_S), deadline, name,
                options.threads)
    heap = _roots(problem, st, vb, tables, r, floors)
    pool = _pool(problem, options, st, vb, deadline, name, solve_node)
    late = late_hint.current()

    def arrive() -> bool:  # eq. PAR4: the DP's plan as an incumbent once it is back; False while it is still to come
        a = late.take()
        if a is not None and 0 <= a.variant < len(problem.variants) and not violations(problem, a):
            st.stats["late_hint_objective_s"] = evaluate(problem, a)
            st.offer(problem, canonical(problem, tables[a.variant], a), f"{name} late hint")
        return not late.pending

    st.stats["prelude_wall_s"] = round(time.perf_counter() - t0, 4)  # before the first node (tables, eqs. LS4b, LS4c)
    try:
        _search(problem, options, st, vb, heap, pool, deadline, name, solve_node, t0, arrive)
    finally:
        for node in pool.drop():  # (nodes still running go back open: their bounds hold)
            heapq.heappush(heap, node)
    return _finish(problem, options, st, vb, heap, name, time.perf_counter() - t0)


def _variant_tables(problem: Problem, hint_ok: bool, deadline: float, threads: int) -> tuple:
    """Each variant's slot tables and eq. B2 bound: (tables, bounds), or (None, None) when the deadline or Ctrl-C comes
    first and there is a warm start that is a plan (``hint_ok``). The bounds of every other variant come from a forked child (eq.
    PAR5; the same results as the loop): 0.03-0.1 s a variant on 4096 GPUs x 6 groups, one table and bound each, not
    interruptible, 0.9 s in all on mixtral-8x7b x 4096 x 3 types x 2 islands. The child's tables are not sent back
    (tens of MB): they are built again here, a third of a variant's time."""
    dl = current()

    def bound_of(v: int) -> VariantBound | None:  # (None: the clock or Ctrl-C came first, with a plan in hand)
        if v and hint_ok and (time.perf_counter() > deadline or dl.interrupted):
            return None
        return root_setup(problem, v)[1]

    t0 = time.perf_counter()
    vb = [bound_of(0)] if problem.variants else []
    # (the variants the DP heuristic set up in this process are memoised: only the others are computed)
    rest = [v for v in range(1, len(problem.variants)) if not root_known(problem, v)]
    if (time.perf_counter() - t0) * len(rest) < SETUP_FORK_S:  # (a fork costs ~10 ms: small set-ups stay here)
        threads = 1
    got = dict(zip(rest, fork_map(bound_of, rest, threads, stop=lambda: dl.interrupted)))
    if any(b is None for b in got.values()) or (vb and vb[0] is None):
        return None, None
    setups = [root_setup(problem, v, got.get(v)) for v in range(len(problem.variants))]
    return [t for t, _ in setups], [b for _, b in setups]


def _search(problem, options, st: _State, vb, heap: list, pool: NodePool, deadline: float, name: str,
            solve_node, begun: float, arrive: Callable[[], bool] = lambda: True) -> None:
    """Best-first over the open nodes until none lies below the cut-off, the deadline or Ctrl-C; once the search has
    run POOL_AFTER_S since ``begun`` (its start, tables and primal steps included: a large problem starts its workers at
    the first node) with two threads or more, eq. PAR2's workers run the nodes and this process hands them out.
    ``arrive()`` takes eq. PAR4's late warm start between nodes once the search has run POOL_AFTER_S (before that, node
    for node the same on every run); the workers start only once it has come (False before: its process and this one
    already use two cores)."""
    dl, r = current(), options.relative_gap
    while heap or pool.busy:
        came = time.perf_counter() - begun >= POOL_AFTER_S and arrive()
        for node, reply in pool.replies(0.0):
            _merge(st, heap, node, reply)
        if not heap:  # (the replies just merged may have been the last: ``_wait`` then returns at once)
            _wait(pool, st, heap, deadline)
            continue
        node = heap[0]
        cutoff = st.cut(r)
        if cutoff is not None and node[0] >= cutoff:
            if pool.busy:  # (their nodes' children may lie below the cut-off)
                _wait(pool, st, heap, deadline)
                continue
            break  # every open node is pruned
        left = deadline - time.perf_counter()
        if (left < MIN_NODE_S and (st.inc is not None or st.nodes > 0)) or (st.inc is not None and left < st.build_s / max(st.builds, 1)):
            break  # (a node's model building is not interruptible: not started without the time it takes on average)
        if dl.interrupted:
            st.stats["interrupted"] = 1
            break
        if not pool.started and pool.size >= 2 and node_pool.available() and came and len(heap) >= 2:
            pool.start()
            st.stats["node_workers"] = pool.size
        if pool.started and pool.usable:  # eq. PAR2: the workers run the nodes, this process hands them out
            i = pool.idle()
            if i is None:
                _wait(pool, st, heap, deadline)
            else:
                heapq.heappop(heap)
                fails = st.probe_fails + st.worker_stats.get("probe_fails", 0)  # (eq. N17f: this process's and theirs)
                joint = st.joint_wins + st.worker_stats.get("joint_wins", 0)  # (eq. N20d: the same for eq. N20's closes)
                pool.submit(i, node, (node, st.inc, st.inc_obj, len(heap), fails, joint))
            continue
        heapq.heappop(heap)
        _node(problem, options, st, heap, vb[node[1]], node, cutoff, deadline, name, solve_node)
    while pool.busy and not dl.interrupted:  # their last nodes, until shortly past the deadline
        if not _wait(pool, st, heap, deadline):
            break


def _pool(problem, options, st: _State, vb, deadline: float, name: str, solve_node) -> NodePool:
    """Eq. PAR2's workers (not started yet): each runs ``_node`` on its own copy of the search's state from the fork,
    with the incumbent each request brings, and sends back what the node added (``_merge``)."""

    size = min(options.threads, POOL_SIZE, node_pool.cpus())
    scale = probe_scale(size, options.threads, node_pool.cpus())
    if size >= 2 and SHARE_CUTOFF:  # eq. PAR2c: made before the workers fork, so that they all map it
        st.shared = RawValue("d", st.inc_obj)

    def serve(request):
        st.probe_s = PROBE_S * scale  # (this worker's copy of the state)
        node, inc, inc_obj, st.open_elsewhere, fails, joint = request
        if inc is not None and inc_obj < st.inc_obj:
            st.inc, st.inc_obj = inc, inc_obj
        # eq. N17f: the search's unfinished probes so far, every worker's merged (before, each worker counted its own
        # from its fork, so two workers ran up to twice PROBE_FAILS unfinished probes)
        st.probe_fails = max(st.probe_fails, fails) if SHARE_PROBE_FAILS else st.probe_fails
        # eq. N20d: likewise eq. N20 stays on in a worker whose own first JOINT_TRIAL nodes it did not close (wide nodes
        # that went on to probes) while it closes nodes elsewhere (each worker judged its trial alone: mixtral-8x7b x
        # hetero3-4096 then left one worker without it, its nodes open to the engine, 10.5 % at 30 s in ~1 run of 4)
        st.joint_elsewhere = joint if SHARE_JOINT_WINS else 0
        marks, before, heap, was = (len(st.closed), len(st.errors)), st.inc_obj, [], dict(st.stats)
        was["probe_fails"] = st.probe_fails  # (a _State count: sent back as if a statistic)
        cutoff = st.cut(options.relative_gap)  # (eq. PAR2c: the best plan any worker holds, even if not handed out)
        if st.best_known() < st.inc_obj:
            st.stats["shared_starts"] = st.stats.get("shared_starts", 0) + 1
        _node(problem, options, st, heap, vb[node[1]], node, cutoff, deadline, name, solve_node)
        return (heap, st.closed[marks[0]:], st.inc if st.inc_obj < before else None, st.inc_obj,
                st.errors[marks[1]:], st.tol_s, stats_added(was, {**st.stats, "probe_fails": st.probe_fails}))

    return NodePool(serve, size)


def probe_scale(workers: int, threads: int, cpus: int) -> float:
    """Eq. PAR2b: how many times PROBE_S a worker's probe gets: the engine threads of every busy worker per CPU (each
    node's engines use ``threads``), at least 1, at most POOL_PROBE_SCALE."""
    return min(POOL_PROBE_SCALE, max(1.0, workers * threads / max(cpus, 1)))


def _merge(st: _State, heap: list, node, reply) -> None:
    """A worker's node as if this process had run it: its children pushed, its closed bounds, a better plan, errors.
    A failed worker's node goes back open (the others, or this process, run it again)."""
    if isinstance(reply, BaseException):
        log.warning("a node worker failed (%s); its node is run again", reply)
        heapq.heappush(heap, node)
        return
    children, closed, inc, inc_obj, errors, tol_s, added = reply
    add_stats(st.worker_stats, added)
    for bound, v, a, b, tries, plo, phi, _, mu, keep, lp in children:  # (pushed anew: the worker's tie-breaking
        _push(heap, bound, v, a, b, tries, plo, phi, mu, keep, lp)  # counter went on from the fork's)
    st.closed += closed
    st.errors += errors
    st.tol_s = max(st.tol_s, tol_s)
    if inc is not None and inc_obj < st.inc_obj:
        st.inc, st.inc_obj = inc, inc_obj
        st.publish()
    st.nodes += 1
    st.stats["worker_nodes"] = st.stats.get("worker_nodes", 0) + 1


def stats_added(was: dict, now: dict) -> dict:
    """Eq. PAR2: what one node added to a worker's ``stats``: each count's and time's increase (a count kept as a
    running total, e.g. ``joint_dp``, too), each ``max_`` key's new value, the engine runs' lines (under ``engines``)."""
    out: dict = {}
    for k, v in now.items():
        if k.startswith("engine") and k[6:].isdigit():
            if was.get(k) != v:
                out.setdefault("engines", []).append(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and v != was.get(k, 0):
            out[k] = v if k.startswith("max_") else v - was.get(k, 0)
    return out


def add_stats(into: dict, added: dict) -> None:
    """``stats_added``'s output summed into ``into`` (``max_`` keys: the larger; ``engines``: appended)."""
    for k, v in added.items():
        if k == "engines":
            into.setdefault(k, []).extend(v)
        else:
            into[k] = max(into.get(k, v), v) if k.startswith("max_") else into.get(k, 0) + v


def _wait(pool: NodePool, st: _State, heap: list, deadline: float) -> bool:
    """Until a worker's node is back (merged: True), POOL_GRACE_S past the deadline or Ctrl-C: then every worker is
    stopped and their nodes go back open (False; a worker that hangs never holds the search). With no worker busy,
    False at once, none stopped: no reply can come, and ``replies`` returns at once, so the loop would spin."""
    if not pool.busy:
        return False
    dl = current()
    while not dl.interrupted:
        left = deadline + POOL_GRACE_S - time.perf_counter()
        if left <= 0:
            break
        got = pool.replies(min(left, POOL_POLL_S))
        for node, reply in got:
            _merge(st, heap, node, reply)
        if got:
            return True
    for node in pool.drop():
        heapq.heappush(heap, node)
    return False


def _unsearched(problem: Problem, hint: Assignment, name: str, st: _State, wall_s: float) -> RawResult:
    """The warm start as the result when the time limit (or Ctrl-C) comes while the variants' tables are built, before
    any node: FEASIBLE with the bound 0 (T >= 0), which the planner raises to the presolve's eq. B1 bound. Measured:
    llama3-70b on 4096 GPUs of 3 types x 2 islands, --time-limit 3: the tables of every variant took 1.05 s past the
    heuristics and the command 3.3-3.4 s."""
    stopped = current().interrupted
    why = "interrupted" if stopped else "the time limit was reached"
    return RawResult("FEASIBLE", name, assignment=hint, objective_s=evaluate(problem, hint), bound_s=0.0, wall_time_s=wall_s,
                     message=f"{why} before the exact search began",
                     stats={**st.stats, "nodes": 0, **({"interrupted": 1} if stopped else {})})


def _node(problem, options, st: _State, heap, vb: VariantBound, node, cutoff, deadline, name, solve_node):
    """``_run_node``, its time added to ``st.node_s`` (this process's nodes)."""
    t0 = time.perf_counter()
    try:
        _run_node(problem, options, st, heap, vb, node, cutoff, deadline, name, solve_node)
    finally:
        st.node_s += time.perf_counter() - t0


def _node_capped(st: _State) -> bool:
    """Eq. B2i at a node: on this process's first NODE_CAPPED_TRIAL nodes, then where its nodes have taken at least
    NODE_CAPPED_MIN_S each on average (its LP costs ~2-5 ms: on Sailor's rows, whose nodes take ~50 ms, it closed
    only nodes that closed cheaply anyway and cost 0.15 s on the 80+240 row)."""
    done = st.nodes - 1  # (the node being run is counted already)
    return done < NODE_CAPPED_TRIAL or st.node_s >= NODE_CAPPED_MIN_S * done


def _run_node(problem, options, st: _State, heap, vb: VariantBound, node, cutoff, deadline, name, solve_node):
    """LP-prune or split the node (eq. N2); a narrow or small node goes to the exact engine."""
    bound, v, a, b, tries, plo, phi, _, mu, keep, point = node
    begun = time.perf_counter()
    st.nodes += 1
    st.lagr.clear()
    M = _m_eff(problem.variants[v])
    if cutoff is not None and M > 1:
        b = min(b, (cutoff - vb.rest_lb) / (M - 1))  # eq. X1 with the current incumbent
    if problem.max_time_s is not None and M > 1:  # eq. TX2e: T >= (M - 1) tau, so tau <= T_max / (M - 1)
        b = min(b, problem.max_time_s * (1 + TIME_RTOL) / (M - 1))
        if b < a:  # every plan of the node is slower than T_max: none is feasible
            st.closed.append(math.inf)
            return
    t = _node_tables(problem, v, b if M > 1 else None, keep, plo, phi)
    if t is not None and keep[1] < 0 and M > 1 and USE_ISLAND_SPLIT:
        t, keep, split = _islands_apart(problem, st, heap, t, node, b, keep)
        if split:
            return
    if t is None:  # no plan of this variant has tau <= b (memory and GPUs)
        st.closed.append(cutoff if cutoff is not None else math.inf)
        return
    if USE_CAPPED_FILL and NODE_CAPPED and cutoff is not None and M > 1 and tries == 0 and _node_capped(st):
        rest = capped_rest(problem, t, b)  # eq. B2i on the node's own tables and period cap b
        if rest is not None:
            bound = max(bound, (M - 1) * a + rest)
            if bound >= cutoff:
                st.closed.append(cutoff)
                st.stats["capped_fill_nodes"] = st.stats.get("capped_fill_nodes", 0) + 1
                return
    pol = st.policy
    use_dp = tries == 0 and USE_STAGE_DP and (st.dp_calls < DP_TRIAL or st.dp_wins > 0)
    # eqs. N4, N5 (their state is the p2p endpoint, so mixed options, eq. H5, take part)
    light = use_dp and not pol.lp_first and LIGHT_FIRST  # eq. N17: the costlier DPs after the LP
    if use_dp and not pol.lp_first:
        bound, mu, cutoff, done = _dps(problem, options, st, heap, t, v, a, b, bound, cutoff, mu, keep, name, deadline,
                                       extras=not light)
        if done:
            return
        plo, phi = t.p_min, t.p_max
        if st.inc is not None and time.perf_counter() > deadline:  # the DPs took the rest: back, with their bound
            _push(heap, bound, v, a, b, tries, plo, phi, mu, keep)  # (the model build below is not interruptible)
            return
    # eq. N13c: once the LP has neither closed a node nor lifted the DPs' bound in LP_TRIAL nodes, a node the DPs
    # bounded is split without its model (built only for the engine)
    lp_off = use_dp and not pol.lp_first and tries == 0 and st.lp_calls >= LP_TRIAL and st.lp_wins == 0
    if lp_off and light:
        bound, mu, cutoff, done = _dps(problem, options, st, heap, t, v, a, b, bound, cutoff, mu, keep, name, deadline)
        if done:
            return
        plo, phi, light = t.p_min, t.p_max, False
    if lp_off and _split_only(options, st, heap, vb, bound, v, a, b, M, t, mu, keep):
        st.stats["lp_skipped"] = st.stats.get("lp_skipped", 0) + 1
        return
    t0 = time.perf_counter()
    lm = build_model(problem, t, tau_lb=a * (1 - 1e-12))
    st.build_s += time.perf_counter() - t0
    st.builds += 1
    small = len(lm.names) <= pol.small_model
    # eq. N17b: a small model over a wide tau range gets the engine for PROBE_S only, then is split (eq. N16 makes many
    # models small while their range is wide)
    width = _split_width(options, a, M, vb.rest_lb)
    probe = small and tries == 0 and PROBE_S > 0 and M > 1 and b - a > width
    if not small and tries == 0:
        # eq. N2d: a node split on its stage count next whatever its LP gives (the LP's reduced cost only narrows
        # tau, eq. N19), whose parent's LP optimum lies in its own LP at its bound, skips the LP
        split_next = t.p_max > t.p_min and not _wide(st, M, a, b, width)
        inherited = USE_LP_POINT and point is not None and split_next and lp_point.holds(lm, point, bound)
        if inherited:
            st.stats["lp_inherited"] = st.stats.get("lp_inherited", 0) + 1
        lpr = None if inherited else lp_relaxation(lm, cutoff, time_limit_s=max(0.1, deadline - time.perf_counter()))
        solved, before = lm, bound  # (the model the LP was solved on)
        if lpr is not None:
            bound = max(bound, _lp_value(lpr))
        closed = math.isinf(bound) or (cutoff is not None and bound >= cutoff)
        if not closed and lpr is not None and cutoff is not None and M > 1 and USE_RC_TAU:
            t, lm, b, bound, closed, lpr, solved = _rc_narrow(problem, st, t, lm, lpr, v, a, b, bound, cutoff, plo,
                                                              phi, keep, deadline)
        if (not closed and lpr is not None and cutoff is not None and SIGMA_LIFT_ROUNDS
                and (st.lift_calls < SIGMA_LIFT_TRIAL or st.lift_wins > 0)):
            bound, closed = _sigma_lift(problem, st, lm, bound, cutoff, deadline)
        if use_dp and not pol.lp_first and not inherited:  # eq. N13c's trial: the LP after the DPs
            st.lp_calls += 1
            st.lp_wins += closed or bound > before + LP_LIFT * abs(before)
        if closed:
            st.closed.append(min(bound, cutoff) if cutoff is not None else bound)
            return
        # the DPs where the LP leaves the node open: in full after eq. N17's light pass, or (eq. N2b) only now
        if light or (use_dp and pol.lp_first):
            bound, mu, cutoff, done = _dps(problem, options, st, heap, t, v, a, b, bound, cutoff, mu, keep, name,
                                           deadline, floor=bound)
            if done:
                return
            if (plo, phi) != (t.p_min, t.p_max):  # (the LP above covered the wider range: the engine gets the new one)
                plo, phi = t.p_min, t.p_max
                lm = build_model(problem, t, tau_lb=a * (1 - 1e-12))
        if not inherited:  # (an inherited point is passed on as it came)
            point = lp_point.keyed(solved, lpr.x) if USE_LP_POINT and lpr is not None and lpr.x is not None else None
        sigs = _signatures(problem, t) if pol.sig_first and keep[0] < 0 else []
        if len(sigs) > 1:  # eq. N2b: one child per uniform signature (eq. U1: every plan has exactly one)
            for s_ in sigs:
                _push(heap, bound, v, a, b, 0, t.p_min, t.p_max, mu, (s_, keep[1]), point)
            return
        wide = _wide(st, M, a, b, width)
        probe = M > 1 and b - a > width and PROBE_S > 0  # eq. N17c: the engine first, then the split
        if wide and not (pol.p_first and t.p_max > t.p_min):
            _split(heap, bound, v, a, b, M, vb, t.p_min, t.p_max, mu, keep, point)
            return
        if t.p_max > t.p_min:  # then (eq. N2b: first) on the number of stages
            mid = (t.p_min + t.p_max) // 2
            _push(heap, bound, v, a, b, 0, t.p_min, mid, mu, keep, point)
            _push(heap, bound, v, a, b, 0, mid + 1, t.p_max, mu, keep, point)
            return
    finished = _engine(problem, options, st, heap, lm, VariantBound(a, vb.rest_lb, bound),
                       (bound, v, a, b, tries, plo, phi, None, mu, keep, None), cutoff, deadline, name, solve_node,
                       probe=probe, spent_s=time.perf_counter() - begun)
    if probe and not small:  # eq. N17c's probe (eq. N17b's are not counted)
        st.stats["engine_probes"] = st.stats.get("engine_probes", 0) + 1
        st.probe_fails += not finished


def _dps(problem, options, st: _State, heap, t: Tables, v, a, b, bound, cutoff, mu, keep, name, deadline,
         extras: bool = True, floor: float | None = None):
    """The stage DPs on the node, then eq. N16 on what they leave open: (bound, multipliers, cut-off, node done)."""
    bound, mu, cutoff, done, per_p = _dp_step(problem, options, st, t, a, b, bound, cutoff, mu, name, deadline, extras,
                                              floor)
    if not done and USE_DP_TAU_CAP and cutoff is not None and st.node_cap < b - RC_SHRINK * (b - a):
        # eq. N26: the part of the tau range above the cap holds no plan under the cut-off; the rest goes back to the
        # heap, to be bounded again on the layer bounds of the cap (eq. X1), which shrink the tables
        st.closed.append(cutoff)
        st.stats["dp_tau_caps"] = st.stats.get("dp_tau_caps", 0) + 1
        if st.node_cap >= a:
            _push(heap, bound, v, a, st.node_cap, 0, t.p_min, t.p_max, mu, keep)
        return bound, mu, cutoff, True
    if not done:
        bound, done = _stage_counts(st, heap, t, per_p, bound, cutoff, v, a, b, mu, keep)
    return bound, mu, cutoff, done


def _stage_counts(st: _State, heap, t: Tables, per_p, bound, cutoff, v, a, b, mu, keep) -> tuple[float, bool]:
    """Eq. N16 on a node the DPs leave open: the stage counts whose own bound reaches the cut-off are dropped. One run
    of counts left: the node's range narrowed to it in place (``t.p_min``, ``t.p_max``) with the least of their bounds;
    several: one child per run with its own least bound, and the node is done. (bound, node done)."""
    if not USE_PER_P or per_p is None or cutoff is None or t.p_max <= t.p_min:
        return bound, False
    ks = np.arange(t.p_min, t.p_max + 1)
    vals = _safe_all(per_p[ks])
    live = vals < cutoff
    if live.all():
        return max(bound, float(vals.min())), False
    st.stats["p_pruned"] = st.stats.get("p_pruned", 0) + int((~live).sum())
    if not live.any():
        st.closed.append(cutoff)
        return math.inf, True
    cuts = np.flatnonzero(np.diff(live.astype(np.int8)) != 0) + 1
    runs = [r for r in np.split(np.arange(len(ks)), cuts) if live[r[0]]]
    if len(runs) == 1:
        r = runs[0]
        t.p_min, t.p_max = int(ks[r[0]]), int(ks[r[-1]])
        return max(bound, float(vals[r].min())), False
    for r in runs:
        _push(heap, max(bound, float(vals[r].min())), v, a, b, 0, int(ks[r[0]]), int(ks[r[-1]]), mu, keep)
    return bound, True


def _node_tables(problem, v: int, b, keep: tuple[int, int], plo: int, phi: int) -> Tables | None:
    """The slot tables of variant v at tau <= b (eq. X1; None: no cap), kept to ``keep`` = (uniform signature, eq.
    U1; island, eq. N9b; -1: any) and to the node's stage counts [plo, phi] (eq. N1); None when no plan of the variant
    fits them."""
    sig, island = keep
    t = build_tables(problem, v, b)
    if sig >= 0:
        _keep_signature(problem, t, sig)
    if island >= 0:
        t = island_split.restrict(problem, t, island_split.option_islands(problem, t), island)
    if t.p_min > 0:
        t.p_min, t.p_max = max(t.p_min, plo), min(t.p_max, phi)
    return None if t.p_min == 0 or t.p_min > t.p_max else t


def _islands_apart(problem, st: _State, heap, t: Tables, node, b: float, keep):
    """Eq. N9b on a node whose plans all lie inside one island (no link between islands usable at tau <= b): one
    child per island that holds usable options and no other kept island dominates (``island_split``), or the node
    itself kept to the only such island. Returns (tables, keep, whether children were pushed); tables None: no plan."""
    parts = island_split.kept_parts(problem, t, b)
    if parts is None:
        return t, keep, False
    st.stats["island_nodes"] = st.stats.get("island_nodes", 0) + 1
    own, kept = parts
    if len(kept) > 1:
        bound, v, a, _, tries, plo, phi, _, mu, _, _ = node
        for k in kept:
            _push(heap, bound, v, a, b, tries, t.p_min, t.p_max, mu, (keep[0], k))
        return t, keep, True
    if not kept:
        return None, keep, False
    plo, phi = t.p_min, t.p_max  # (the node's stage counts, eq. N1)
    t = island_split.restrict(problem, t, own, kept[0])
    t.p_min, t.p_max = max(t.p_min, plo), min(t.p_max, phi)
    return (t if 0 < t.p_min <= t.p_max else None), (keep[0], kept[0]), False


def _lp_value(lpr: LPRelaxation) -> float:
    """The LP's value as a bound, less a relative 1e-7 for HiGHS' tolerances."""
    return lpr.value - 1e-7 * abs(lpr.value) if math.isfinite(lpr.value) else lpr.value


def _rc_narrow(problem, st: _State, t: Tables, lm: LinModel, lpr: LPRelaxation, v, a, b, bound, cutoff, plo, phi,
               keep, deadline):
    """Eq. N19 on a node its LP leaves open: tau's reduced cost caps the node's tau at ``tau_cap``; while that cuts
    at least RC_SHRINK of the range, the node is rebuilt on [a, cap] (eq. X1's layer bounds at the cap) and its LP
    solved again, at most RC_ROUNDS times; not again where the last LP's optimum lies in the rebuilt model (eq. N2d:
    it cannot lift the bound). The part cut off holds no plan below the cut-off. Returns (tables, model, b, bound,
    closed, the last LP solved and its model)."""
    solved = lm
    for _ in range(RC_ROUNDS):
        cap = tau_cap(lpr, lm, cutoff)
        if cap >= b - RC_SHRINK * (b - a) or time.perf_counter() > deadline:
            break
        st.stats["rc_narrowed"] = st.stats.get("rc_narrowed", 0) + 1
        st.closed.append(cutoff)  # the range (cap, b]: every plan there reaches the cut-off
        if cap < a:
            return t, lm, b, cutoff, True, lpr, solved
        b = cap
        nt = _node_tables(problem, v, b, keep, plo, phi)
        if nt is None:
            return t, lm, b, cutoff, True, lpr, solved
        t = nt
        lm = build_model(problem, t, tau_lb=a * (1 - 1e-12))
        if USE_LP_POINT and lpr.x is not None and lp_point.holds(lm, lp_point.keyed(solved, lpr.x), bound):
            st.stats["lp_inherited"] = st.stats.get("lp_inherited", 0) + 1
            break
        lpr = lp_relaxation(lm, cutoff, time_limit_s=max(0.1, deadline - time.perf_counter()))
        if lpr is None:
            break
        solved = lm
        bound = max(bound, _lp_value(lpr))
        if math.isinf(bound) or bound >= cutoff:
            return t, lm, b, bound, True, lpr, solved
    return t, lm, b, bound, False, lpr, solved


def _sigma_lift(problem, st: _State, lm: LinModel, bound: float, cutoff: float, deadline: float) -> tuple[float, bool]:
    """Eq. N22b on a node its LP leaves open (a model of more than SIGMA_CAP_MIN_VARS variables): sigma capped by eq.
    N22, each slot's sync limited by the cap (``model.sigma_limit_rows``, added to ``lm``, which the engine then
    gets), and the LP solved again; up to SIGMA_LIFT_ROUNDS times while the cap falls. A win (the node closed, or its
    bound lifted by LP_LIFT) keeps it on past SIGMA_LIFT_TRIAL nodes. (bound, node closed)."""
    if len(lm.names) <= SIGMA_CAP_MIN_VARS:
        return bound, False
    st.lift_calls += 1
    before, cap = bound, math.inf
    for _ in range(SIGMA_LIFT_ROUNDS):
        left = deadline - time.perf_counter()
        new = sigma_cap(lm, cutoff, time_limit_s=max(0.1, left))
        if new is None or new >= cap * (1 - SIGMA_LIFT_MIN) or left < 0:
            break
        st.stats["sigma_lifts"] = st.stats.get("sigma_lifts", 0) + 1
        if new < lm.lb[lm.sigma]:  # (-inf: no point of the node's LP reaches below the cut-off)
            st.lift_wins += 1
            st.closed.append(cutoff)
            return cutoff, True
        cap = new
        sigma_limit_rows(lm, cap, sync_beta(problem, lm.t))
        lpr = lp_relaxation(lm, cutoff, time_limit_s=max(0.1, deadline - time.perf_counter()))
        if lpr is None:
            break
        bound = max(bound, _lp_value(lpr))
        if math.isinf(bound) or bound >= cutoff:
            st.lift_wins += 1
            st.stats["sigma_lift_closed"] = st.stats.get("sigma_lift_closed", 0) + 1
            st.closed.append(min(bound, cutoff))
            return bound, True
    st.lift_wins += bound > before + LP_LIFT * abs(before)
    return bound, False


def _engine_width(st: _State) -> float:
    """Eq. N17c: how many split widths a node's tau range may span when it goes to the engine."""
    return ENGINE_WIDTH if st.probe_fails < PROBE_FAILS and PROBE_S > 0 else 1.0


def _wide(st: _State, M, a: float, b: float, width: float) -> bool:
    """Whether a node's tau range [a, b] is split on tau rather than given to the engine (eq. N17c)."""
    return M > 1 and b - a > _engine_width(st) * width


def _split_only(options, st: _State, heap, vb: VariantBound, bound, v, a, b, M, t: Tables, mu, keep) -> bool:
    """Eq. N13c: the node split as eq. N2 would after its LP (tau while wide, then the stage count); False when it would
    go to the engine instead (the model is then built)."""
    if _wide(st, M, a, b, _split_width(options, a, M, vb.rest_lb)):
        _split(heap, bound, v, a, b, M, vb, t.p_min, t.p_max, mu, keep)
        return True
    if t.p_max > t.p_min:
        mid = (t.p_min + t.p_max) // 2
        _push(heap, bound, v, a, b, 0, t.p_min, mid, mu, keep)
        _push(heap, bound, v, a, b, 0, mid + 1, t.p_max, mu, keep)
        return True
    return False


def _signatures(problem: Problem, t: Tables) -> list[int]:
    """The uniform signatures (eq. U1) some option of the node may use (none without U1)."""
    if not problem.uniform:
        return []
    ok = np.zeros(t.n, bool)
    for k in range(1, t.p_max + 1):
        ok |= t.nonfirst_ok(k) | t.first_ok(k)
    return np.unique(t.sig[ok]).tolist()


def _keep_signature(problem: Problem, t: Tables, sig: int) -> None:
    """The node's tables with only the options of uniform signature ``sig`` usable (the others hold no layer),
    and its stage-count range recomputed from them. ``U``, ``Uf`` are the node's own arrays (build_tables)."""
    drop = t.sig != sig
    t.U[:, drop] = 0
    t.Uf[:, drop] = 0
    stage_count_bounds(problem, t)


def _dp_step(problem, options, st: _State, t: Tables, a, b, bound, cutoff, mu, name, deadline, extras: bool = True,
             floor: float | None = None):
    """The stage DPs on a node (eqs. N4-N6): (bound, multipliers, cut-off after their plans, node closed, eq. N16's
    bounds per stage count or None)."""
    st.dp_calls += extras
    before = st.inc_obj
    bound, mu, per_p = _dp_bounds(problem, options, st, t, a, b, bound, cutoff, mu, name, deadline, extras, floor)
    st.dp_wins += st.inc_obj < before
    cutoff = st.cut(options.relative_gap)
    if math.isinf(bound) or (cutoff is not None and bound >= cutoff):
        st.dp_wins += 1
        st.closed.append(min(bound, cutoff) if cutoff is not None else bound)
        return bound, mu, cutoff, True, per_p
    return bound, mu, cutoff, False, per_p


def _dp_bounds(problem, options, st: _State, t: Tables, a, b, bound, cutoff, mu, name, deadline=math.inf,
               extras: bool = True, floor: float | None = None):
    """The node's bound by the stage DPs: under eq. U1 the least over the uniform signatures (one DP each, the
    paths kept to that signature), else one. Their fitting paths are offered as incumbents. Also eq. N16's bounds
    per stage count (the least over the DPs, P by P; None when a DP gave none)."""
    sigs = np.unique(t.sig).tolist() if problem.uniform else [None]
    best, best_mu = math.inf, mu
    per_p: np.ndarray | None = None
    tracked = USE_PER_P
    st.node_cap = -math.inf  # eq. N26: the largest of the runs' caps (a run without one: no cap)
    for sig in sigs:
        if sig is not None and cutoff is not None and USE_SIG_FLOOR and _sig_floor(problem, st, t, sig, a, b) >= cutoff:
            st.stats["sig_skipped"] = st.stats.get("sig_skipped", 0) + 1
            continue  # eq. U1c: no plan of this signature in the node lies below the cut-off (as a DP finding none)
        # eq. U1b: a signature's DPs on its own options' tables (the node's stage-count range kept), not on all the
        # node's options masked: a DP's set-up is then as large as the signature (megatron-uniform MoE nodes held
        # 1296 options in ~140 signatures, and their masked set-ups took most of a 1-7 s node)
        ts = t if sig is None else subset(t, t.sig == sig)
        dp = PathDP(problem, ts, b, t.p_min, t.p_max)
        parts = island_parts(problem, dp) if USE_ISLAND_PARTS else None  # eq. N9: no usable link between islands
        if parts is not None:  # (the islands with usable options: one under eq. N9b's node of one island)
            usable = ts.holding()
            parts = [part for part in parts if (usable & part).any()]
            parts = None if len(parts) == 1 else parts
        for j, part in enumerate([None] if parts is None else parts):
            one = dp if part is None else PathDP(problem, ts, b, t.p_min, t.p_max, part)
            st.run_cap = math.inf
            val, mu_s, pp = _dp_bound(problem, st, one, a, b, cutoff, mu, name, deadline, extras, (sig, j), floor)
            st.node_cap = max(st.node_cap, st.run_cap if math.isfinite(val) else -math.inf)
            if val < best:
                best, best_mu = val, mu_s
            if math.isinf(val):
                continue  # (no plan of this part: it adds nothing to any stage count)
            if pp is None or len(pp) != t.p_max + 1:
                tracked = False
            else:
                per_p = pp if per_p is None else np.minimum(per_p, pp)
    if not tracked or per_p is None:
        per_p = None
    return max(bound, best), best_mu, per_p


def _sig_floor(problem: Problem, st: _State, t: Tables, sig: int, a: float, b: float) -> float:
    """Eq. U1c: a bound on every plan of uniform signature ``sig`` in the node (variant ``t.v``, tau in [a, b]):
    (M - 1) max(a, tau_B2) + rest_B2 from eq. B2 on the variant's tables of that signature's options alone (kept per
    variant and signature; signature ids are the variant's, ``slot_bounds._memory_part``), inf when tau_B2 > b."""
    floors = st.sig_floors.get(t.v)
    if floors is None:  # (every signature of the variant at once: one set of tables)
        floors = st.sig_floors[t.v] = signature_bounds(problem, build_tables(problem, t.v))
    vb = floors[sig]
    if not math.isfinite(vb.total_s) or vb.tau_lb > b:
        return math.inf
    return t.tau_weight * max(a, vb.tau_lb) + vb.rest_lb


def _dp_bound(problem, st: _State, dp: PathDP, a, b, cutoff, mu, name, deadline=math.inf, extras: bool = True,
              key=None, floor: float | None = None):
    """Eq. N4 (Lagrangian stage DP), then, while the node survives,
    eq. N5 with each group the Lagrangian path overfills in the DP's state in turn (the most overfilled first).
    ``extras`` False: eq. N4/N11 alone, its result kept under ``key`` for the node's full pass (eq. N17), which then
    reuses it (a bound of the node's plans at the multipliers found, also when its stage-count range has narrowed).
    ``floor``: the node's bound after its LP (eq. N17e: the bound-only DPs N15, N6 and N5 run while their trial
    lasts, and count as a win where they lift the bound above it or give a better plan)."""
    t = dp.t
    t0 = time.perf_counter()
    kept = st.lagr.pop(key, None) if extras else None
    if kept is not None:
        nb, warm = kept
        if dual_bundle.USE_GPU_TIME and math.isfinite(b) and len(warm) > len(dp.cap):
            dual_bundle.price_rows(dp, t, b)  # (eq. N12's rows for this node's DP, at the kept lam)
    elif USE_BUNDLE and np.count_nonzero(dp.usage.any(axis=0)) > 1:  # eq. N11 (one row: eq. N4's bisection)
        nb = bundle_bound(problem, t, a, dp, cutoff, mu, deadline=deadline, b=b)
        warm, nb.mu = nb.mu, nb.mu[:len(dp.cap)]  # (the children's warm start keeps eq. N12's lam after mu)
    else:
        nb = node_bound(problem, t, a, b, t.p_min, t.p_max, cutoff, mu, dp)
        warm = nb.mu
    # before the first capacity DP, guess it from one stage DP run (measured: 10-60 runs' time)
    if kept is None:
        st.cap_dp_s = max(st.cap_dp_s, 20 * (time.perf_counter() - t0) / max(nb.steps, 1))
        st.stats["dp_bound_steps"] = st.stats.get("dp_bound_steps", 0) + nb.steps
    plans = [nb.plan] if kept is None else []
    bound = _safe(nb.bound_s)
    if not extras:  # eq. N17: the Lagrangian bound alone, its plan offered
        st.lagr[key] = (nb, warm)
        if nb.plan is not None and not violations(problem, nb.plan):
            st.offer(problem, nb.plan, f"{name} stage DP")
        return bound, warm, nb.per_p
    if (USE_SIGMA and cutoff is not None and math.isfinite(bound) and bound < cutoff
            and (st.sigma_calls < DP_TRIAL or st.sigma_wins > 0) and _room(st, deadline)):  # eq. N8: sigma's rows
        t0 = time.perf_counter()
        found: list = []
        bound = max(bound, _safe(sigma_bound(dp, a, nb.mu, cutoff, sync_share(problem.p2p_blocking), found)))
        plans += found[-SIGMA_OFFERS:]  # (the last ones: the thresholds split finest there)
        st.sigma_calls += 1
        st.sigma_wins += bound >= cutoff
        st.stats["sigma_dp_s"] = st.stats.get("sigma_dp_s", 0.0) + time.perf_counter() - t0
        st.stats["sigma_prunes"] = st.sigma_wins
    per_p = nb.per_p
    if math.isfinite(bound) and (cutoff is None or bound < cutoff):
        bound, per_p = _joint(problem, st, dp, a, bound, nb.mu, cutoff, per_p, deadline, name)
    trial = False  # eq. N17e: after the node's LP (``floor``) the bound-only DPs run while their trial lasts
    if (floor is None or st.post_idle < POST_LP_TRIAL) and math.isfinite(bound) and (cutoff is None or bound < cutoff):
        trial, pre, had = floor is not None, max(bound, -math.inf if floor is None else floor), st.inc_obj
        bound = _bound_only_dps(problem, st, dp, a, warm, nb, bound, cutoff, deadline, plans)
    for plan in plans:
        if plan is not None and not violations(problem, plan):  # the DPs leave U2 out
            st.offer(problem, plan, f"{name} stage DP")
    if trial:  # eq. N17e's trial, per DP run (one a node, or one per uniform signature / island part); a better plan
        # from the run's paths counts (eq. N8's are offered in the same loop)
        won = bound > pre + LP_LIFT * abs(pre) or st.inc_obj < had
        st.post_idle = 0 if won else st.post_idle + 1
        st.stats["post_lp_bounds"] = st.stats.get("post_lp_bounds", 0) + 1
        st.stats["post_lp_bound_wins"] = st.stats.get("post_lp_bound_wins", 0) + int(won)
    if math.isfinite(bound) and (cutoff is None or bound < cutoff):
        _segments(problem, st, dp, name, deadline)
    return bound, warm, per_p


def _bound_only_dps(problem, st: _State, dp: PathDP, a, warm, nb, bound: float, cutoff, deadline: float,
                    plans: list) -> float:
    """Eqs. N15, N6 and N5 (eq. N12's lam around each; eq. N14c) on a DP run the earlier DPs leave open: the run's
    bound; their paths are appended to ``plans``."""
    t = dp.t
    bound = max(bound, _group_split(st, dp, a, warm, nb.mu, cutoff, deadline))
    cap = np.asarray(problem.group_capacity, float)
    over = np.zeros(len(cap))  # GPUs used / capacity per group (not the budget row; a group of none: 0)
    if nb.used is not None:
        np.divide(nb.used[:len(cap)], cap, out=over, where=cap > 0)
    blocks = island_blocks(problem, dp) if np.any(over > 1) else None
    if blocks is not None and math.isfinite(bound) and (cutoff is None or bound < cutoff) and _room(st, deadline):
        t0 = time.perf_counter()
        empty = _empty_islands(problem, dp, blocks) if USE_EMPTY_ISLANDS else frozenset()  # eq. N6c
        ib, fits = with_gpu_time(dp, t, a, warm, island_bound, problem, dp, a, blocks, nb.mu, empty)  # eqs. N6, N12
        st.cap_dp_s = max(st.cap_dp_s, time.perf_counter() - t0)
        st.stats["island_dp"] = st.stats.get("island_dp", 0) + 1
        bound = max(bound, _safe(ib))
        plans += fits
        over[:] = 0  # (the per-group DPs below add little once each island's GPUs are in the state)
    if USE_SLACK_CAP and blocks is None and len(cap) == 1 and nb.used is not None and nb.mu[0] > 0 and over[0] <= 1:
        over[0] = 1 + 1e-9  # eq. N14c: one group, its multiplier priced yet its least path fits: a duality gap
    for s in np.argsort(-over, kind="stable").tolist():
        if over[s] <= 1 or math.isinf(bound) or (cutoff is not None and bound >= cutoff) or not _room(st, deadline):
            break  # (measured: a group that fits adds little and costs 0.1 s a DP on 1278 MoE options)
        t0 = time.perf_counter()
        cb, plan = with_gpu_time(dp, t, a, warm, capacity_bound, problem, dp, a, nb.mu, s)  # eqs. N5, N12
        st.cap_dp_s = max(st.cap_dp_s, time.perf_counter() - t0)
        st.stats["capacity_dp"] = st.stats.get("capacity_dp", 0) + 1
        bound = max(bound, _safe(cb))
        plans.append(plan)
    return bound


def _empty_islands(problem: Problem, dp: PathDP, blocks: np.ndarray) -> frozenset:
    """Eq. N6c: the islands (``blocks``) that hold no plan of the node on their own: eq. N11b finds a ray on the stage DP
    of the node's options of that island alone (its GPUs cannot carry the node's layers within tau <= b)."""
    own = blocks[dp.t.group]
    out = set()
    for blk in np.unique(blocks[blocks >= 0]).tolist():
        mine = dp.keep & (own == blk)
        if not mine.any() or resource_ray(PathDP(problem, dp.t, dp.b, dp.t.p_min, dp.t.p_max, mine))[0]:
            out.add(blk)
    return frozenset(out)


def _joint(problem, st: _State, dp: PathDP, a, bound, mu, cutoff, per_p, deadline: float, name: str):
    """Eqs. N20, N20b on a node the DPs leave open, where every group's GPUs fit in one state (``joint_units``): (bound,
    per stage count bounds); its paths that pass the check are offered as plans. Where it leaves the node open eqs.
    N15, N5 and N6 still run (for their plans too). It runs only where ``_joint_on`` says so (its trial, eqs. N20d,
    N20f)."""
    if not (USE_JOINT and _joint_on(st) and _room(st, deadline)):
        return bound, per_p
    types = [island_split.gpu_type(g) for g in problem.groups]
    u = joint_units(dp, types, big=_big_on(st))
    if u is None:
        return bound, per_p
    was = bound
    t0 = time.perf_counter()
    found: list | None = [] if JOINT_PLANS else None
    inc = st.inc_obj if USE_PRUNE and st.inc is not None else None  # eq. N27
    info: dict = {}
    jb, jp = joint_capacity.joint_bound(dp, a, mu, cutoff, sync_share(problem.p2p_blocking), u,
                                        min(deadline, t0 + JOINT_S), found, inc, _cases_on(st), info)
    if info["case_runs"]:  # eq. N20h's record
        st.case_calls += 1
        st.case_wins += cutoff is not None and info["plain"] < cutoff <= jb
        st.case_s += info["case_s"]
        st.stats["joint_cases"], st.stats["joint_case_wins"] = st.case_calls, st.case_wins
    blocks = island_blocks(problem, dp) if USE_CROSSINGS and len(u.R) < dp.G else None  # (eq. N20 pooled by type)
    if blocks is not None and (cutoff is None or jb < cutoff):  # eq. N25
        cb = island_crossings.crossing_bound(dp, a, mu, u, types, problem.group_island, blocks, jp, found,
                                             cutoff if inc is not None else None, inc)
        if cb is not None:
            jp = np.maximum(jp, cb)
            jb = float(jp.min())
            st.stats["crossing_dp"] = st.stats.get("crossing_dp", 0) + 1
    if USE_OWN_DIGITS and len(u.R) < dp.G and (cutoff is None or jb < cutoff):  # eq. N20i: pooled, left open
        jp = _own_digits(st, dp, a, mu, cutoff, problem.p2p_blocking, jp, found, inc, deadline)
        jb = float(jp.min())
    if USE_DP_TAU_CAP and cutoff is not None:  # eq. N26: jb is tau_weight * a + a part that does not depend on tau
        st.run_cap = joint_capacity.tau_cap(dp, a, _safe(jb), cutoff)
    for plan in found or ():  # (each within every group's GPUs; the check decides the rows the DP leaves out)
        if not violations(problem, plan):
            st.offer(problem, plan, f"{name} joint DP")
    st.cap_dp_s = max(st.cap_dp_s, time.perf_counter() - t0)
    st.joint_calls += 1
    bound = max(bound, _safe(jb))
    st.joint_wins += cutoff is not None and bound >= cutoff
    st.joint_drops += cutoff is not None and _drops(per_p, jp, cutoff)
    st.joint_s += time.perf_counter() - t0
    st.stats["joint_dp"] = st.joint_calls
    if u.big:  # eq. N20k's record
        st.big_calls += 1
        st.big_wins += cutoff is not None and bound >= cutoff
        st.big_s += time.perf_counter() - t0
        if cutoff is not None and math.isfinite(was) and cutoff > 0:
            st.big_lift = max(st.big_lift, (min(bound, cutoff) - was) / cutoff)
        st.stats["joint_big"], st.stats["joint_big_wins"] = st.big_calls, st.big_wins
        st.stats["joint_big_s"] = st.big_s
    st.stats["joint_wins"] = st.joint_wins
    st.stats["joint_dp_s"] = st.joint_s  # (this process's, as the other statistics: the workers' added in _merge)
    if per_p is not None and len(per_p) == len(jp):
        per_p = np.maximum(per_p, _safe_all(jp))
    return bound, per_p


def _own_digits(st: _State, dp: PathDP, a, mu, cutoff, blocking: bool, jp: np.ndarray, found, inc, deadline: float
                ) -> np.ndarray:
    """Eq. N20i: eq. N20 again with every group its own digit (``joint_capacity.own_units``: at most WIDE_MAX states
    and OWN_STEPS steps) where the pooled state left the node open, while its trial lasts (OWN_TRIAL runs) or it has
    closed a node: the per stage count bounds ``jp`` lifted elementwise. Its paths (within every group's GPUs) go to
    ``found``; sigma's cases (eq. N20b) are not run on it."""
    if not ((st.own_calls < OWN_TRIAL or st.own_wins > 0) and _room(st, deadline)):
        return jp
    w = joint_capacity.own_units(dp)
    if w is None:
        return jp
    t0 = time.perf_counter()
    _, op = joint_capacity.joint_bound(dp, a, mu, cutoff, sync_share(blocking), w, deadline, found, inc, cases=False)
    jp = np.maximum(jp, op)
    st.own_calls += 1
    st.own_wins += cutoff is not None and float(jp.min()) >= cutoff
    st.stats["own_digit_dp"] = st.own_calls
    st.stats["own_digit_wins"] = st.own_wins
    st.stats["own_digit_s"] = st.stats.get("own_digit_s", 0.0) + time.perf_counter() - t0
    return jp


def _joint_on(st: _State) -> bool:
    """Whether eq. N20 runs on the node: during its trial (the first JOINT_TRIAL nodes it runs on), after a close in
    this process or (eq. N20d) elsewhere in the search, or (eq. N20f) after a dropped stage count while an engine run
    has cost JOINT_DROP_RATIO times a run of eq. N20 on average (a dropped count is engine work saved only where that
    work costs more than the DP: on Sailor's 32+96 row, engine runs of ~0.03 s, eq. N20 cost 0.3-0.7 s more)."""
    if st.joint_calls < JOINT_TRIAL or st.joint_wins > 0 or st.joint_elsewhere > 0:
        return True
    engine = _engine_mean(st)
    return JOINT_DROP_WINS and st.joint_drops > 0 and engine is not None and \
        engine > JOINT_DROP_RATIO * st.joint_s / st.joint_calls


def _big_on(st: _State) -> bool:
    """Eq. N20k: whether eq. N20 may take its by-group state past WIDE_MAX / WIDE_STEPS (up to BIG_MAX / BIG_STEPS) on
    the node: where every island holds one group, on the first BIG_TRIAL nodes of this process that need it, then only
    once one of them has closed a node or lifted its bound by BIG_LIFT of the cut-off (a run costs up to ~2 s on the
    2-core VM; where they lift little, the trial caps what they cost)."""
    return USE_BIG and st.island_groups and (st.big_calls < BIG_TRIAL or st.big_wins > 0 or st.big_lift >= BIG_LIFT)


def _cases_on(st: _State) -> bool:
    """Eq. N20h: whether eq. N20b's sigma cases run on the node: during their trial (the first CASE_TRIAL nodes they
    run on), then only after a close of theirs, and once an engine has run, while their closes times an engine run's
    mean time stay at least CASE_RATIO times their time (where an engine finishes a node in 0.01-0.3 s, as on Sailor's
    rows, 0.05-0.6 s of cases a node for one close in ten does not pay)."""
    if not USE_CASE_GATE or st.case_calls < CASE_TRIAL:
        return True
    if st.case_wins == 0:
        return False
    engine = _engine_mean(st)
    return engine is None or st.case_wins * engine >= CASE_RATIO * st.case_s


def _engine_mean(st: _State) -> float | None:
    """The mean time of this process's engine runs (s; None before the first): what eqs. N20f and N20h price a bound's
    runs against."""
    return st.engine_s / st.engine_calls if st.engine_calls else None


def _drops(before, after, cutoff: float) -> bool:
    """Eq. N20f: whether ``after``'s per stage count bounds reach the cut-off at a count ``before``'s left under it
    (False where the two do not line up)."""
    if before is None or after is None or len(before) != len(after):
        return False
    return bool(np.any((np.asarray(after) >= cutoff) & (np.asarray(before) < cutoff)))


def _group_split(st: _State, dp: PathDP, a, warm, mu, cutoff, deadline: float) -> float:
    """Eq. N15 (with eq. N12's lam around it) on a node that survives eqs. N4/N11/N8, -inf where it does not run:
    several GPU types, rows of two groups, time left; it stops for the rest of a search after DP_TRIAL nodes without
    a prune."""
    if not (USE_GROUP_SPLIT and st.several_types and group_split.applies(dp)
            and (st.split_calls < DP_TRIAL or st.split_wins > 0) and _room(st, deadline)):
        return -math.inf
    t0 = time.perf_counter()
    gs = _safe(with_gpu_time(dp, dp.t, a, warm, group_split.priced_bound, dp, a, mu)[0])
    st.cap_dp_s = max(st.cap_dp_s, time.perf_counter() - t0)  # (not interruptible: _room counts it)
    st.split_calls += 1
    st.split_wins += cutoff is not None and gs >= cutoff
    st.stats["group_split"] = st.split_calls
    st.stats["group_split_s"] = st.stats.get("group_split_s", 0.0) + time.perf_counter() - t0
    st.stats["group_split_prunes"] = st.split_wins
    return gs


def _segments(problem, st: _State, dp: PathDP, name: str, deadline: float) -> None:
    """Eq. LS4 on a node the DPs leave open: the least plan of contiguous group segments, offered as an incumbent;
    with NODE_SEGMENT_PLANS also eqs. LS4h and LS4j's (``_segment_plans``), the best one offered. It stops for the
    rest of a search after SEG_TRIAL such nodes in a row without a better plan."""
    island = problem.group_island
    if not (USE_SEGMENT_DP and st.several_types and st.seg_idle < SEG_TRIAL and segment_dp.applies(dp, island)
            and _room(st, deadline)):
        return
    t0 = time.perf_counter()
    plans = _segment_plans(problem, dp, island, st.inc_obj, deadline, node=True) if NODE_SEGMENT_PLANS else \
        [segment_dp.segment_plan(dp, island)]
    plan = _least_valid(problem, plans)
    st.cap_dp_s = max(st.cap_dp_s, time.perf_counter() - t0)  # (not interruptible either: _room counts it)
    st.stats["segment_dp"] = st.stats.get("segment_dp", 0) + 1
    st.stats["segment_dp_s"] = st.stats.get("segment_dp_s", 0.0) + time.perf_counter() - t0
    before = st.inc_obj
    if plan is not None:
        st.offer(problem, plan, f"{name} segment DP")
    st.seg_idle = 0 if st.inc_obj < before else st.seg_idle + 1


def _segment_scan(problem: Problem, st: _State, vb: list, tables: list, r: float, until: float, name: str) -> None:
    """Eq. LS4b: per variant (least bound first, while it beats the incumbent) the segment DP's plan under eq. X1's
    tau cap b, then under caps just below the variant's best plan's own tau (eq. T2), the step doubling while the
    plans improve and back to SCAN_STEP when one does not, until a cap at SCAN_STEP brings nothing. The plans are
    offered as incumbents; a heuristic that proves nothing, run where eq. LS4 does and every island holds one group
    (so that every pipeline is a segment plan over the islands). Until ``until``, or Ctrl-C."""
    island = problem.group_island
    if not (USE_SEGMENT_DP and st.several_types and SCAN_CALLS > 0 and len(island) > 1
            and np.bincount(island).max() == 1):
        return
    calls = 0
    for v in sorted(range(len(vb)), key=lambda i: vb[i].total_s):
        M = _m_eff(problem.variants[v])
        if M <= 1 or not math.isfinite(vb[v].total_s) or vb[v].total_s >= st.inc_obj * (1 - r):
            continue
        b = _worst_tau(tables[v])
        if st.inc is not None:
            b = min(b, (st.inc_obj * (1 - r) - vb[v].rest_lb) / (M - 1))  # eq. X1
        best, tau, step = math.inf, b, 0.0
        while (b >= vb[v].tau_lb and calls < SCAN_CALLS and time.perf_counter() + st.cap_dp_s <= until
               and not current().interrupted):
            t0 = time.perf_counter()
            plan = _segment_at(problem, v, b, island, inc_obj=st.inc_obj)
            st.cap_dp_s = max(st.cap_dp_s, time.perf_counter() - t0)
            calls += 1
            obj = evaluate(problem, plan) if plan is not None else math.inf
            if obj < best:
                st.offer(problem, plan, f"{name} segment scan")
                best, tau, step = obj, min(b, _steady(problem, plan)), min(2 * step, 0.1) if step else SCAN_STEP
            elif step <= SCAN_STEP:
                break
            else:
                step = SCAN_STEP
            b = tau * (1 - step)
    st.stats["segment_scan"] = calls


def _floor_dive(problem: Problem, st: _State, vb: list, r: float, until: float, deadline: float, name: str,
                threads: int = 1) -> None:
    """Eq. LS4c: on the incumbent's variant (interleaved or not) and then on its neighbours (``_dive_order``: the
    DIVE_VARIANTS - 1 of vpp = 1 nearest its micro-batch count, or eq. LS4d's list), the least period b at which
    eq. N11b still finds a path mix within the GPUs, by bisection between the variant's eq. B2 floor and the
    incumbent's own period (its variant) or eq. X1's cap (DIVE_RTOL wide). Every plan of the variant has tau above the last b proven empty, so its bound rises to
    (M - 1) b + rest_lb ((M - 1/vpp) b interleaved, eq. I1; ``vb``
    updated in place; past the cap: the variant cannot beat the incumbent). Then eq. LS4's plan at DIVE_SLACK above
    the floor is offered when it may start before ``until`` and, at twice the longest such run so far (or, before any,
    SEG_GUESS probes' time), end before ``deadline`` (its segment DPs stop at ``deadline``, with no plan). Eq. LS4i:
    a process's first plan runs past ``until`` too, stopped after FIRST_PLAN_DIVES dives' time. Where there are several
    groups (also
    one GPU type on several islands: mixtral-8x7b on 32 H100 @ib + 32 @roce, the warm start 23.634 s, the dive's plan
    22.537 s, proven at 4.0 s end to end against 5.3 % gap at 10 s without it), until ``until`` or Ctrl-C.
    Eq. PAR5c: with two threads and two CPUs the variants are dived here and on a forked child, each until ``until``;
    the child's floors and plan are taken when it is back. Eq. PAR5e: the two take the list's variants in turn as they
    go (a shared index), and each one's caps read the best plan time either holds (``_State.shared``)."""
    if not (USE_FLOOR_DIVE and USE_SEGMENT_DP and st.several_groups and st.inc is not None):
        return
    order = _dive_order(problem, st.inc.variant, len(st.inc.stages))
    if not (PAR_DIVE and len(order) > 1 and forks(threads)):
        st.stats["dive_probes"], st.stats["dives"] = _dive(problem, st, vb, r, until, deadline, name, order)
        return
    dl = current()
    made = SHARE_DIVE and st.shared is None  # (the dive's own: the node workers make theirs, eq. PAR2c)
    if SHARE_DIVE:  # eq. PAR5e: made before the fork, so that both processes map them
        queue, shares = shared_queue(), [False, True]
        if made:
            st.shared = RawValue("d", st.inc_obj)
        dive = lambda report: _dive(problem, st, vb, r, until, deadline, name, order, report, queue)
    else:  # eq. PAR5c: the incumbent's variant here (and under eq. LS4d every second variant after it), the rest there
        queue = None
        shares = [order[:1], order[1:]] if len(order) <= DIVE_VARIANTS else [order[:1] + order[2::2], order[1::2]]
        dive = lambda share: _dive(problem, st, vb, r, until, deadline, name, share, share is shares[1])
    try:
        here, there = fork_map(dive, shares, threads, stop=lambda: dl.interrupted, interrupt=dl.interrupt, rerun=False)
    finally:
        if made:
            st.shared = None
    probes, dives, floors, plan, cap_s = there if isinstance(there, tuple) and len(there) == 5 else (0, 0, {}, None, 0.0)
    for v, b in floors.items():
        vb[v] = VariantBound(max(vb[v].tau_lb, b.tau_lb), vb[v].rest_lb, max(vb[v].total_s, b.total_s))
    st.cap_dp_s = max(st.cap_dp_s, cap_s)
    st.offer(problem, plan, f"{name} floor dive")
    st.stats["dive_probes"], st.stats["dives"] = here[0] + probes, here[1] + dives


def _dive_order(problem: Problem, home: int, stages: int = 0) -> list[int]:
    """The variants eq. LS4c dives, in turn: the incumbent's (``home``), then those of vpp = 1 nearest its micro-batch
    count M (by ratio), DIVE_VARIANTS in all. Eq. LS4d: where the incumbent is interleaved, instead every variant of
    its vpp or of vpp = 1 whose M lies within DIVE_M_RATIO of its M, nearest M first, then its own vpp, then the
    nearest stages per micro-batch P / M (the dive's clock ends the list). Why: an interleaved variant's stage count
    P is fixed, so the incumbent's neighbours are its other stage counts and the nearby M of its vpp; at twice M the
    data-parallel degree halves (the global batch is fixed), so the same GPUs at the same tp make twice the stages:
    P / M, and with it the bubble (P - 1) / (vpp M), stays as it is."""
    var = problem.variants[home]
    M, vpp = var.num_microbatches, var.vpp

    def near(v: int) -> tuple:
        w = problem.variants[v]
        return (v != home, abs(math.log(w.num_microbatches / M)), w.vpp != vpp,
                abs(math.log(max(w.num_stages, 1) * M / (max(var.num_stages, 1) * w.num_microbatches))), v)

    if vpp == 1:
        kin = [v for v, w in enumerate(problem.variants) if (w.vpp == 1 or v == home) and w.num_microbatches > 1]
        order = sorted(kin, key=near)[:DIVE_VARIANTS]
        copies = [v for v, w in enumerate(problem.variants) if w.vpp > 1
                  and max(w.num_microbatches / M, M / w.num_microbatches) <= DIVE_M_RATIO] if stages > 0 else []
        if DIVE_COPY and copies:  # eq. LS4k: the incumbent's stage count (the nearest) interleaved, second
            best = min(copies, key=lambda v: (abs(math.log(problem.variants[v].num_stages / stages)),
                                              abs(math.log(problem.variants[v].num_microbatches / M)),
                                              -problem.variants[v].vpp, v))
            order.insert(1, best)
        return order
    kin = [v for v, w in enumerate(problem.variants) if w.vpp in (1, vpp) and w.num_microbatches > 1
           and max(w.num_microbatches / M, M / w.num_microbatches) <= DIVE_M_RATIO]
    return sorted(kin, key=near)


def _dive(problem: Problem, st: _State, vb: list, r: float, until: float, deadline: float, name: str, order: list,
          report: bool = False, queue=None):
    """Eq. LS4c on the variants of ``order`` in turn (``_floor_dive``): (probes, dives), and with ``report`` (the
    child's share, eq. PAR5c) also the floors it set ({variant: VariantBound}), the best plan it offered (or None) and
    its longest segment run (s). ``queue``: eq. PAR5e's shared index (only the variants this process takes)."""
    island = problem.group_island
    probes = dives = 0
    t_start = time.perf_counter()
    first = st.inc
    for v in taken(order, queue):
        W = _m_eff(problem.variants[v]) - 1  # tau's weight: M - 1, or M - 1/vpp interleaved (eq. I1)
        # eq. X1 at the best plan time known (eq. PAR5e: the other dive's too); a floor set below it is proven anyway
        cap = (st.best_known() * (1 - r) - vb[v].rest_lb) / W
        if not math.isfinite(vb[v].total_s) or vb[v].tau_lb >= cap:
            continue
        if time.perf_counter() >= until or current().interrupted:
            break
        lo, hi = vb[v].tau_lb, min(cap, _steady(problem, st.inc)) if v == st.inc.variant else cap
        if v != st.inc.variant:
            probes += 1
            if _holds_no_plan(problem, v, hi):  # no plan of v beats the incumbent
                vb[v] = VariantBound(hi, vb[v].rest_lb, max(vb[v].total_s, W * hi + vb[v].rest_lb))
                continue
        while hi - lo > DIVE_RTOL * hi and time.perf_counter() < until and not current().interrupted:
            mid = (lo + hi) / 2
            probes += 1
            if _holds_no_plan(problem, v, mid):
                lo = mid
            else:
                hi = mid
        vb[v] = VariantBound(lo, vb[v].rest_lb, max(vb[v].total_s, W * lo + vb[v].rest_lb))
        for slack in DIVE_SLACKS:  # eq. LS4e: the least of them at which the segment DP finds a plan
            guess = max(st.cap_dp_s, SEG_GUESS * (time.perf_counter() - t_start) / max(probes, 1))
            b = hi * (1 + slack)
            now = time.perf_counter()
            if now < until and now + 2 * guess < deadline:
                stop = deadline
            elif FIRST_PLAN and dives == 0 and slack == DIVE_SLACKS[0] and now < deadline:
                stop = min(deadline, now + FIRST_PLAN_DIVES * (until - t_start))  # eq. LS4i
            else:
                break
            if b > cap and slack > DIVE_SLACKS[0]:  # (the first run as before, a retry only below the cap)
                break
            t0 = now
            ran: list = []
            plan = _segment_at(problem, v, b, island, ran, st.inc_obj, stop)
            st.offer(problem, plan, f"{name} floor dive", margin=DIVE_POLISH_MARGIN)
            st.cap_dp_s = max(st.cap_dp_s, time.perf_counter() - t0)
            dives += 1
            if plan is not None or not ran:  # (no DP applies: none will at a larger slack either)
                break
    if not report:
        return probes, dives
    return probes, dives, {v: vb[v] for v in order}, (st.inc if st.inc is not first else None), st.cap_dp_s


def _holds_no_plan(problem: Problem, v: int, b: float) -> bool:
    """No plan of variant v has its period tau <= b: no stage count fits the layer bounds of tau <= b (eq. X1), or eq.
    N11b finds a ray on the node's stage DP (on each island's own, eq. N9b). Interleaved too: tau_v >= max_j t_j and its
    links' vpp c/2 (eq. I2) are the tables' and the DP's (eq. I6)."""
    return all(resource_ray(PathDP(problem, t, b, t.p_min, t.p_max))[0] for t in _island_tables(problem, v, b))


def _segment_at(problem: Problem, v: int, b: float, island, ran: list | None = None,
                inc_obj: float = math.inf, stop: float = math.inf) -> Assignment | None:
    """Eq. LS4's plan of variant v with every stage and link within tau <= b (None: none, or not a valid plan); under
    eq. N9b the best of each island's. Where a GPU type lies on several islands, eq. N25b's crossing plan too (the
    better of the two). ``ran``: True is appended for each DP that ran (none: neither applies to the variant's
    options, e.g. under eq. Q2, whatever b). ``stop``: the segment DPs' runs end there with no plan (eq. LS4i)."""
    found: list = []
    types = [island_split.gpu_type(g) for g in problem.groups]
    for t in _island_tables(problem, v, b):
        dp = PathDP(problem, t, b, t.p_min, t.p_max)
        applies = segment_dp.applies(dp, island)
        plans = _segment_plans(problem, dp, island, inc_obj, stop) if applies else [None]
        blocks = island_blocks(problem, dp) if USE_CROSSING_PLAN and len(set(types)) < dp.G else None
        if blocks is not None:  # eq. N25b: a GPU type on several islands, the at-most-once case's plan too
            plans.append(island_crossings.crossing_plan(dp, types, problem.group_island, blocks))
        if ran is not None:
            ran.extend([True] * (int(applies) + int(blocks is not None)))
        found.extend(plans)
    return _least_valid(problem, found)


def _least_valid(problem: Problem, plans: list) -> Assignment | None:
    """The plan of least objective among ``plans`` that breaks no constraint (None: none; Nones skipped)."""
    scored = [(evaluate(problem, a), i) for i, a in enumerate(plans) if a is not None and not violations(problem, a)]
    return plans[min(scored)[1]] if scored else None


def _segment_plans(problem: Problem, dp: PathDP, island, inc_obj: float = math.inf,
                   stop: float = math.inf, node: bool = False) -> list[Assignment | None]:
    """Eq. LS4's plan, eq. LS4h's sync-capped ones, and under eq. U2 eq. LS4g's too (both ends of one tp, with and
    without a head), within their time budget (LS4's run first: where the budget cuts LS4g short, LS4's plan may
    still keep eq. U2). ``node``: on a search node, LS4h only under NODE_SYNC_ROOM, no LS4g, and eq. LS4j's tail
    plans where LS4h ran (not in the dives: their clock is short, and a dive's next variant gains more there)."""
    plans = [segment_dp.segment_plan(dp, island, stop=stop)]
    capped = _sync_capped(problem, dp, island, plans[0], inc_obj * (NODE_SYNC_ROOM if node else 1.0), stop)
    plans.extend(plan for plan, _ in capped)
    if problem.same_tp_first_last and USE_SAME_TP_PLANS and not node:  # (on nodes it cost more than it found)
        plans.extend(segment_dp.same_tp_plans(dp, island, SAME_TP_BUDGET_S, stop))
    if node and USE_TAIL_PLANS and capped:  # eq. LS4j where LS4h ran (sigma set late): on the node's DP and the
        dps = [dp] + [d for plan, d in capped if plan is not None][-1:]  # last capped one with a plan
        plans.extend(segment_dp.tail_plans(dps, island, _fastest_groups(dp.t), TAIL_BUDGET_S, stop))
    return plans


def _fastest_groups(t: Tables) -> list[int]:
    """The GPU groups of the tables' own (unmixed) options, least per-layer time first (eq. LS4j's tail order: the
    last stage holds the output layer, a fast group's job)."""
    own = (t.use > 0).sum(axis=1) == 1
    best = {}
    for o in np.flatnonzero(own):
        g = int(np.argmax(t.use[o] > 0))
        best[g] = min(best.get(g, math.inf), float(t.coef["layer_time"][o]))
    return sorted(best, key=best.get)


def _sync_capped(problem: Problem, dp: PathDP, island, plan: Assignment | None,
                 inc_obj: float = math.inf, stop: float = math.inf) -> list[tuple[Assignment | None, PathDP]]:
    """Eq. LS4h: while the plan's sigma (eq. T3, I1) is set by a stage j > 0, eq. LS4's plan with sigma capped at
    (e_0 + e_j) / 2 of the last plan (e_j = s_j - beta sum_{k<j} t_k, its terms; eq. LS4h': where a cap finds no
    plan, the next cap lies halfway from it to the last plan's e_j, once a call, USE_SYNC_RETRY), the stages
    before each taken at SYNC_PREFIX_SHARE of the node's tau cap each; SYNC_CAP_ROUNDS times at most, and not where
    LS4's plan, its sigma down to e_0, would still not beat ``inc_obj`` (the capped plans trade time for sync) or
    where that would gain less than SYNC_CAP_MIN of its time."""
    out: list = []
    if not USE_SYNC_CAP or plan is None:
        return out
    terms, obj = sync_terms(problem, plan), evaluate(problem, plan)
    if obj - (max(terms) - terms[0]) >= inc_obj or max(terms) - terms[0] < SYNC_CAP_MIN * obj:
        return out
    per_stage = sigma_share(problem.variants[dp.t.v].vpp, problem.p2p_blocking) * SYNC_PREFIX_SHARE * dp.b
    cap, failed, retried = math.inf, None, False  # (failed: the last cap that found no plan, while none has come since)
    for _ in range(SYNC_CAP_ROUNDS):
        j = int(np.argmax(terms))
        if j == 0 or terms[j] <= terms[0]:
            break
        if failed is None:  # (the cap only falls while plans come)
            if (terms[0] + terms[j]) / 2 >= cap:
                break
            cap = (terms[0] + terms[j]) / 2
        else:  # eq. LS4h': halfway from the cap that found none back up to the last plan's e_j
            cap = (failed + terms[j]) / 2
        capped = segment_dp.sync_capped(dp, cap, per_stage)
        found = segment_dp.segment_plan(capped, island, stop=stop)
        out.append((found, capped))
        if found is None and (retried or not USE_SYNC_RETRY):  # (one retry a call)
            break
        if found is None:
            failed, retried = cap, True
        else:
            terms, failed = sync_terms(problem, found), None
    return out


def _island_tables(problem: Problem, v: int, b: float) -> list[Tables]:
    """The tables of variant v at tau <= b (eq. X1) that hold a stage count: one, or under eq. N9b (no link between
    islands usable) one per island that another kept island does not dominate, each kept to it."""
    t = build_tables(problem, v, b)
    if t.p_min == 0:
        return []
    parts = island_split.kept_parts(problem, t, b) if USE_ISLAND_SPLIT else None
    if parts is None:
        return [t]
    own, kept = parts
    return [tk for tk in (island_split.restrict(problem, t, own, k) for k in kept) if tk.p_min > 0]


def _room(st: _State, deadline: float) -> bool:
    """Time for one more capacity DP (eqs. N5, N6) before the deadline: they are not interruptible, and one took
    up to 2 s on a loaded machine (llama3-70b on 3 types, 1024 GPUs), so twice the longest one so far."""
    return deadline - time.perf_counter() > 2 * st.cap_dp_s


def _safe(x: float) -> float:
    """A DP bound less its float noise (sums of up to ~100 terms)."""
    return x - 1e-9 * abs(x) if math.isfinite(x) else x


def _safe_all(x: np.ndarray) -> np.ndarray:
    """``_safe`` on each entry (eq. N16's bounds per stage count; inf stays inf)."""
    return x - 1e-9 * np.abs(np.where(np.isfinite(x), x, 0.0))


SPLIT_BY_T = True


def _split_width(options, a: float, M: float = 2.0, rest_lb: float = 0.0) -> float:
    """Intervals are split by LP until the (M - 1) tau term is known to within half the requested gap of the
    node's least T ((M - 1) a + rest_lb, eq. B2). Any width is exact (the engine solves the node); only the
    work changes. Before: half the gap of tau itself, which split (M - 1) times finer than T needs."""
    if not SPLIT_BY_T:
        return max(options.relative_gap, 2e-3) * a / 2
    return max(options.relative_gap, 2e-3) * (a + max(rest_lb, 0.0) / max(M - 1, 1.0)) / 2


def _split(heap, bound, v, a, b, M, vb: VariantBound, plo: int, phi: int, mu=None, keep=NO_KEEP, lp=None) -> None:
    mid = (a + b) / 2 if b <= 4 * a or a <= 0 else math.sqrt(a * b)
    _push(heap, max(bound, (M - 1) * a + vb.rest_lb), v, a, mid, 0, plo, phi, mu, keep, lp)
    _push(heap, max(bound, (M - 1) * mid + vb.rest_lb), v, mid, b, 0, plo, phi, mu, keep, lp)


def _engine(problem, options, st: _State, heap, lm, nb: VariantBound, node, cutoff, deadline, name, solve_node,
            probe: bool = False, spent_s: float = 0.0) -> bool:
    """The exact engine on the node; unfinished, it is pushed back with more time next (``probe``: split instead,
    after at most the larger of PROBE_S and PROBE_SPENT times ``spent_s``, the node's time before the engine, eqs. N17b,
    N17c, N17d). Returns whether the engine finished the node."""
    bound, v, a, b, tries, plo, phi, _, mu, keep, _ = node
    if cutoff is not None:  # eq. PAR2c: a plan another worker found since the node began
        cutoff = min(cutoff, st.cut(options.relative_gap))
        if bound >= cutoff:
            st.closed.append(cutoff)
            st.stats["shared_cuts"] = st.stats.get("shared_cuts", 0) + 1
            return True
    left = deadline - time.perf_counter()
    # doubling per retry, capped: 2**tries overflowed a float after ~1000 retries of a failing HiGHS node; the time left
    # shared with the open nodes (eq. PAR2d: on a node worker those of the search, not of its own empty heap)
    n_open = max(len(heap), st.open_elsewhere) if SHARE_OPEN else len(heap)
    share = min(left, max(MIN_ENGINE_S * 2 ** min(tries, 20), left / max(2, n_open + 1)))
    if probe:  # eq. N17d: at least PROBE_SPENT times the node's bounding (``spent_s``), which a split pays twice over
        share = min(share, max(st.probe_s, PROBE_SPENT * spent_s))
    if cutoff is not None and USE_SIGMA_CAP and len(lm.names) > SIGMA_CAP_MIN_VARS:  # eq. N22
        cap = sigma_cap(lm, cutoff, time_limit_s=max(0.1, left))
        if cap is not None and cap < lm.lb[lm.sigma]:
            st.closed.append(cutoff)
            return True
        if cap is not None:
            lm.ub[lm.sigma] = min(lm.ub[lm.sigma], cap)
    inc = st.inc
    h = inc if inc is not None and inc.variant == v and a <= _steady(problem, inc) <= b * (1 + TIME_RTOL) else None
    if h is not None and keep[1] >= 0 and not island_split.inside(problem, h, keep[1]):
        h = None  # (a node of another island, eq. N9b)
    # eqs. N28, N28b: never under the cut-off (a gap under ASPIRE_RTOL), so a node the engine proves empty under ``aim``
    # is empty under the cut-off it is closed at
    aspire = cutoff is not None and st.inc is not None and (ASPIRE is True or (ASPIRE == "probe" and probe))
    aim = max(cutoff, st.best_known() * (1 - ASPIRE_RTOL)) if aspire else cutoff
    if RESTART_SEED and tries:  # eq. PAR2e: a retry from another seed (the same input still gives the same seeds)
        options = options.model_copy(update={"seed": options.seed + min(tries, 20)})
    res = _call(problem, options, st, lm, nb, aim, share, h, name, solve_node, v)
    if res.status == "INFEASIBLE":
        st.closed.append(cutoff if cutoff is not None else math.inf)
        return True
    nbound = max(res.bound_s if res.bound_s is not None else -math.inf, bound)
    if res.status == "OPTIMAL":
        st.closed.append(min(nbound, cutoff) if cutoff is not None else nbound)
        return True
    if probe:
        _split(heap, nbound, v, a, b, _m_eff(problem.variants[v]), VariantBound(a, nb.rest_lb, nb.total_s), plo, phi,
               mu, keep)
    else:
        _push(heap, nbound, v, a, b, tries + 1, plo, phi, mu, keep)  # not finished: again later with more time
    return False


def _finish(problem, options, st: _State, vb, heap, name: str, wall_s: float) -> RawResult:
    bound = min(st.closed + [n[0] for n in heap], default=math.inf)
    workers = dict(st.worker_stats)  # eq. PAR2: the workers' nodes' counts beside this process's
    for line in workers.pop("engines", []):
        st.engine_calls += 1
        st.stats[f"engine{st.engine_calls}"] = f"{line} (worker)"
    fails = st.probe_fails + workers.pop("probe_fails", 0)
    add_stats(st.stats, workers)
    st.stats["tolerance_s"] = st.tol_s
    st.stats["nodes"] = st.nodes
    if fails:
        st.stats["probe_fails"] = fails
    st.stats["open_nodes"] = len(heap)
    if current().interrupted:  # (also where Ctrl-C came before the node loop looked: root bounds, dives, first node)
        st.stats["interrupted"] = 1
    msg = "; ".join(dict.fromkeys(st.errors))  # (one failure repeated on many nodes is said once)
    if st.inc is None:
        if math.isinf(bound) and not st.errors:
            return RawResult("INFEASIBLE", name, wall_time_s=wall_s, message=infeasibility_reason(problem, vb),
                             stats=st.stats)
        status = "ERROR" if st.errors else "NO_SOLUTION"
        return RawResult(status, name, bound_s=bound if math.isfinite(bound) else None, wall_time_s=wall_s,
                         message=msg or "time limit reached before any plan was found", stats=st.stats)
    bound = min(bound, st.inc_obj)
    gap_abs = st.inc_obj - bound
    # an engine that failed on a node (st.errors) is said in the message; the proof stands: the failed node went back
    # open with its earlier bound (eqs. N2-N27), which holds for its plans, and was closed later by another run or
    # still bounds the result (the absurd inputs that overflowed CP-SAT's integers are refused at load, fuzz #1)
    proven = within_gap(st.inc_obj, bound, options.relative_gap, st.tol_s)
    if not proven and not msg:
        why = "interrupted" if st.stats.get("interrupted") else "the time limit was reached"
        msg = f"gap {gap_abs / st.inc_obj:.2%} when {why}"
    return RawResult("OPTIMAL" if proven else "FEASIBLE", name, assignment=st.inc, objective_s=st.inc_obj,
                     bound_s=bound, wall_time_s=wall_s, message=msg, stats=st.stats)
