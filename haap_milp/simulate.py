"""Event-by-event replay of one training iteration under a pipeline schedule.

An independent judge of the planner's closed-form objective (eqs. T1-T3, ``haap_milp/pipeline.py``)::

    T = (M - 1) * tau + sum_j t_j + sum_j c_j + sigma
    tau = max(max_j t_j, max_j c_j / 2, max_{j <= k, P-j < M} (sum_{j<=i<=k} t_i + sum_{j<=i<k} c_i) / (k - j + 1))
    sigma = max_j (s_j - BWD_SHARE * sum_{k<j} t_k)

The simulator never imports solvers or presolve; it reads plain numbers (per-stage forward and
backward time of one micro-batch, p2p time per boundary, DP sync per stage) and replays:

* **stages** are compute resources executing their operations in the engine's fixed order
  (GPipe: all forwards then all backwards; 1F1B and interleaved 1F1B: Megatron-LM's warm-up /
  steady / cool-down order, ``megatron/core/pipeline_parallel/schedules.py``);
* **links** are resources too: the activation of a forward (and the gradient of a backward)
  crosses the boundary as a transfer that occupies the link for half of ``c_j`` (activation and
  its gradient have the same shape), one transfer at a time per direction (``duplex="full"``) or
  one at a time on the link (``duplex="half"``), served first-come first-served. Transfers are
  asynchronous: the sending stage goes on computing; the receiving operation waits for arrival;
* **DP sync** of stage j starts after its last backward and lasts ``s_j``; the iteration ends
  when the last stage finishes its sync.

The replay commits one event at a time (a heap of each stage's and link's earliest start) and refuses plans of
more than ``MAX_REPLAY_EVENTS`` events (``check_replay_size``), whose time and memory grow with the events.

The order of operations fixes memory: a stage holds the activations of every micro-batch whose
forward has started and whose backward has not finished; ``peak_inflight`` reports the maximum.

Where replay and closed form differ (measured: ``benchmarks/sim_vs_closed_form.py``, results in
``benchmarks/results/sim_vs_closed_form.md``):

* uniform stages, no p2p: identical (``(M + P - 1)(f + b) + s``), 1F1B and GPipe;
* uneven stages, no p2p: the closed form is an upper bound (it charges the slowest stage M - 1
  times plus every stage once); replay is lower by 0-22 % at M = P, by at most ~7 % for M >= 4P;
* 1F1B with p2p: stage j keeps at most P - j micro-batches in flight and each waits a full round
  trip through the later stages and links, so the steady period is at least
  ``(sum_{k>=j} t_k + c_k) / (P - j)`` — above ``max(t, c)`` once links matter. The textbook form
  with tau = max(max t, max c) (``link_free_iteration_s``, the planner's first objective) is then
  optimistic: +(M-1)(P-1)c/P on uniform stages; +17 % mean (up to +48 %) when c ~ t/2 and M >= 4P.
  The planner's objective (eq. T2, ``closed_form_iteration_s`` here) adds that bound and, since
  2026-12-07, every shorter window j..k of stages with their links (a cycle of the 1F1B order through
  k - j + 1 micro-batches): with the round trips alone it was up to 30 % below the replay (a slow link
  between two full stages), with the windows it is never below it (mean -1.3 %, min -17.7 %);
* GPipe with p2p: within -13 % / +11 % (mean about -1 %).
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from haap_milp.errors import HaapInputError
from haap_milp.pipeline import BWD_SHARE, bwd_share, compose_iteration_time, inflight_1f1b, iteration_time

log = logging.getLogger(__name__)

ScheduleName = Literal["gpipe", "1f1b", "interleaved"]

@dataclass(frozen=True)
class Event:
    """One interval of the replay. ``kind``: F, B (compute), send_fwd, send_bwd (link), sync."""

    kind: str
    stage: int  # compute/sync: the stage; transfers: the sending stage
    microbatch: int  # -1 for sync
    chunk: int  # virtual chunk on that stage (0 without interleaving)
    start_s: float
    end_s: float
    link: str = ""  # transfers: "j->k"


@dataclass(frozen=True)
class SimulationResult:
    """What one replayed iteration looked like."""

    schedule: str
    num_stages: int
    num_microbatches: int
    vpp: int
    iteration_time_s: float
    closed_form_s: float  # eq. T1 on the same inputs (vpp, schedule and duplex ignored)
    busy_fraction: tuple[float, ...]  # compute time / iteration time, per stage
    bubble_fraction: tuple[float, ...]  # idle (not compute, not own DP sync) / iteration time
    sync_fraction: tuple[float, ...]
    peak_inflight: tuple[float, ...]  # micro-batches of activations held at the peak, per stage
    compute_end_s: tuple[float, ...]  # end of each stage's last backward
    events: tuple[Event, ...] = field(repr=False)
    stage_labels: tuple[str, ...] = ()

    @property
    def relative_difference(self) -> float:
        """(simulated - closed form) / closed form."""
        return (self.iteration_time_s - self.closed_form_s) / self.closed_form_s if self.closed_form_s else 0.0

    def to_dict(self, with_events: bool = False) -> dict:
        d = asdict(self)
        d["relative_difference"] = self.relative_difference
        if not with_events:
            d.pop("events")
        return d


def split_stage_time(stage_s: float, bwd_fraction: float = BWD_SHARE) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch from the stage's fwd+bwd time."""
    if not 0.0 < bwd_fraction < 1.0:
        raise HaapInputError(f"bwd_fraction must lie in (0, 1), got {bwd_fraction}", field="bwd_fraction",
                             value=bwd_fraction)
    return stage_s * (1.0 - bwd_fraction), stage_s * bwd_fraction


def closed_form_iteration_s(stage_s: Sequence[float], p2p_s: Sequence[float], sync_s: Sequence[float],
                            num_microbatches: int, schedule: str = "1f1b", blocking: bool = False) -> float:
    """Eqs. T1-T3 (what the planner optimises): ``pipeline.iteration_time`` (full-duplex links; GPipe:
    no round-trip term; no sync times: sigma = 0; ``blocking``: eq. T2b and beta = 0)."""
    return iteration_time(list(stage_s), list(p2p_s), list(sync_s), num_microbatches, schedule, blocking=blocking)


def link_free_iteration_s(stage_s: Sequence[float], p2p_s: Sequence[float], sync_s: Sequence[float],
                          num_microbatches: int) -> float:
    """The textbook form the planner used first: tau = max(max t, max c), sigma = max s (eq. T1's parts
    composed by ``pipeline.compose_iteration_time``). Kept to measure what the in-flight term of eq. T2
    changes (benchmarks/sim_vs_closed_form.py)."""
    steady = max(list(stage_s) + list(p2p_s))
    return compose_iteration_time(num_microbatches, steady, sum(stage_s), sum(p2p_s),
                                  max(sync_s) if len(sync_s) else 0.0)


def inflight_bound_iteration_s(stage_s: Sequence[float], p2p_s: Sequence[float], sync_s: Sequence[float],
                               num_microbatches: int, duplex: str = "full") -> float:
    """Eq. T2 with a choice of duplex: full-duplex equals ``closed_form_iteration_s``; half-duplex
    links carry all of c_j per micro-batch in one direction's queue.

    Under 1F1B stage j keeps at most ``min(P - j, M)`` micro-batches in flight, and each needs a
    round trip ``R_j = sum_{k>=j} t_k + sum_{k>=j} c_k`` before its backward returns, so by Little's
    law the steady period is at least ``R_j / min(P - j, M)`` (sigma: max s, as in the textbook form).
    """
    if duplex == "full":
        return closed_form_iteration_s(stage_s, p2p_s, sync_s, num_microbatches)
    p, m = len(stage_s), num_microbatches
    trip = [(sum(stage_s[j:]) + sum(p2p_s[j:])) / inflight_1f1b(p - j, m) for j in range(p)]
    steady = max(max(stage_s), max(p2p_s, default=0.0), max(trip))
    return compose_iteration_time(m, steady, sum(stage_s), sum(p2p_s), max(sync_s) if len(sync_s) else 0.0)


# --------------------------------------------------------------------------- schedules


def op_order(schedule: str, stage: int, num_stages: int, num_microbatches: int, vpp: int = 1
             ) -> list[tuple[str, int, int]]:
    """The (kind, micro-batch, chunk) sequence one stage executes."""
    p, m = num_stages, num_microbatches
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == "1f1b" or (schedule == "interleaved" and vpp == 1):
        # Megatron forward_backward_pipelining_without_interleaving: P - rank - 1 warm-up forwards
        warm = min(p - stage - 1, m)
        ops = [("F", i, 0) for i in range(warm)]
        for i in range(m - warm):
            ops += [("F", warm + i, 0), ("B", i, 0)]
        return ops + [("B", i, 0) for i in range(m - warm, m)]
    if schedule == "interleaved":
        return _interleaved_order(stage, p, m, vpp)
    raise HaapInputError(f"unknown schedule {schedule!r}; use gpipe, 1f1b or interleaved", field="schedule",
                         value=schedule)


def _interleaved_order(stage: int, p: int, m: int, vpp: int) -> list[tuple[str, int, int]]:
    """Megatron-Core 0.16 forward_backward_pipelining_with_interleaving (microbatch group size = P, its
    default ``microbatch_group_size_per_vp_stage``): warm-up (P - rank - 1)*2 + (vpp - 1)*P virtual
    micro-batches (all of them when that reaches M*vpp), then 1F1B over the schedule table, backward chunks in
    reverse (schedules.py get_pp_rank_microbatches, get_schedule_table). Earlier Megatron versions put every
    rank in warm-up when M == P; 0.16 no longer does."""
    table: list[tuple[int, int]] = []
    for lo in range(0, m, p):
        hi = min(m, lo + p)
        table += [(mb, ch) for ch in range(vpp) for mb in range(lo, hi)]
    total = m * vpp
    warm = min((p - stage - 1) * 2 + (vpp - 1) * p, total)
    fwd = [("F", mb, ch) for mb, ch in table]
    bwd = [("B", mb, vpp - 1 - ch) for mb, ch in table]
    ops = fwd[:warm]
    for k in range(total - warm):
        ops += [fwd[warm + k], bwd[k]]
    return ops + bwd[total - warm:]


# --------------------------------------------------------------------------- replay


@dataclass
class _Transfer:
    request_s: float
    duration_s: float
    kind: str  # send_fwd | send_bwd
    src: int
    dst: int
    mb: int
    vstage: int  # virtual stage that receives


def _check_inputs(fwd_s, bwd_s, p2p_s, sync_s, m, schedule, vpp, wrap_p2p_s) -> None:
    p = len(fwd_s)
    if p < 1 or len(bwd_s) != p:
        raise HaapInputError(f"need one forward and one backward time per stage, got {len(fwd_s)} and {len(bwd_s)}",
                             field="fwd_s")
    if len(p2p_s) != p - 1:
        raise HaapInputError(f"need {p - 1} boundary times for {p} stages, got {len(p2p_s)}", field="p2p_s")
    if sync_s is not None and len(sync_s) != p:
        raise HaapInputError(f"need {p} sync times, got {len(sync_s)}", field="sync_s")
    if m < 1:
        raise HaapInputError(f"num_microbatches must be >= 1, got {m}", field="num_microbatches", value=m)
    if vpp < 1 or (vpp > 1 and schedule != "interleaved"):
        raise HaapInputError(f"vpp={vpp} needs schedule 'interleaved' (got {schedule!r})", field="vpp", value=vpp)
    values = list(fwd_s) + list(bwd_s) + list(p2p_s) + list(sync_s or []) + [wrap_p2p_s or 0.0]
    if any(not (v >= 0 and math.isfinite(v)) for v in values):
        raise HaapInputError("times must be finite and non-negative", field="times")


MAX_REPLAY_EVENTS = 1_000_000  # compute and transfer events; measured ~10 s and ~0.45 GB of events on a 2-CPU box
# (about 10 us and 450 bytes each); realistic plans stay below it (2048 micro-batches x 64 stages x vpp 4 is 2.1e6
# only with dp 1), while --gbs 1e8 at one sample per micro-batch would take 2e8 events (hours)


def replay_events(num_stages: int, num_microbatches: int, vpp: int = 1) -> int:
    """Events a replay records: a forward and a backward per micro-batch and virtual stage (2 M P vpp), and a
    transfer each way across every virtual boundary (2 M (P vpp - 1))."""
    virtual = num_stages * vpp
    return 2 * num_microbatches * virtual + 2 * num_microbatches * (virtual - 1)


def check_replay_size(num_stages: int, num_microbatches: int, vpp: int = 1,
                      fields: tuple[str, str] = ("num_microbatches", "vpp")) -> None:
    """Refuses (HaapInputError, naming ``fields``: micro-batches, vpp) a replay of more than MAX_REPLAY_EVENTS
    events: the replay is event by event, so its time and memory grow with the events."""
    n = replay_events(num_stages, num_microbatches, vpp)
    if n <= MAX_REPLAY_EVENTS:
        return
    field, value = (fields[1], vpp) if vpp > num_microbatches else (fields[0], num_microbatches)
    raise HaapInputError(f"{field} = {value}: replaying {num_microbatches} micro-batches x vpp {vpp} on {num_stages} "
                         f"stage(s) takes {n:,} events, more than the simulator's limit of {MAX_REPLAY_EVENTS:,} "
                         f"(about 10 s and 0.5 GB); `haap-solve estimate --plan` prices the plan with the closed form "
                         f"(eqs. T1-T3, I1) without replaying it.", field=field, value=value)


def simulate(fwd_s: Sequence[float], bwd_s: Sequence[float], p2p_s: Sequence[float] = (),
             sync_s: Sequence[float] | None = None, num_microbatches: int = 1, schedule: str = "1f1b",
             vpp: int = 1, wrap_p2p_s: float | None = None, duplex: Literal["full", "half"] = "full",
             stage_labels: Sequence[str] = (), blocking: bool = False) -> SimulationResult:
    """Replay one iteration.

    ``fwd_s[j]``/``bwd_s[j]``: stage j's forward/backward time of one micro-batch over all its layers
    (with ``vpp`` chunks each chunk takes 1/vpp of it). ``p2p_s[j]``: boundary j -> j+1, activation
    plus gradient of one micro-batch (the ``c_j`` of eq. T1). ``wrap_p2p_s``: the last -> first stage
    link interleaving uses (default: the slowest boundary). ``sync_s[j]``: exposed DP sync.
    ``blocking`` (the DeepSpeed runtime, eqs. T2b and T3 with beta = 0): a send occupies its sender's stream
    until it is delivered, an end stage's receive occupies the end stage's stream too (its one neighbour's
    sends and its own share that stream), and every stage's DP sync starts after the pipeline flush.
    """
    p, m = len(fwd_s), num_microbatches
    _check_inputs(fwd_s, bwd_s, p2p_s, sync_s, m, schedule, vpp, wrap_p2p_s)
    check_replay_size(p, m, vpp)
    sync = list(sync_s) if sync_s is not None else [0.0] * p
    wrap = (max(p2p_s) if p2p_s else 0.0) if wrap_p2p_s is None else wrap_p2p_s
    orders = [op_order(schedule, j, p, m, vpp) for j in range(p)]
    state = _Replay(p, m, vpp, [f / vpp for f in fwd_s], [b / vpp for b in bwd_s], list(p2p_s), wrap, duplex)
    state.blocking = blocking and schedule != "interleaved"
    state.run(orders)
    compute_end, busy = [0.0] * p, [0.0] * p
    for e in state.events:  # one pass (a scan per stage cost O(P x events))
        if e.kind in "FB":
            compute_end[e.stage] = max(compute_end[e.stage], e.end_s)
            busy[e.stage] += e.end_s - e.start_s
    sync_start = [max(compute_end)] * p if blocking else compute_end  # eq. T3, beta = 0: after the flush
    events = list(state.events)
    for j in range(p):
        if sync[j] > 0:
            events.append(Event("sync", j, -1, 0, sync_start[j], sync_start[j] + sync[j]))
    total = max([sync_start[j] + sync[j] for j in range(p)] + [e.end_s for e in events])
    stage_s = [f + b for f, b in zip(fwd_s, bwd_s)]
    safe = total if total > 0 else 1.0
    return SimulationResult(
        schedule=schedule, num_stages=p, num_microbatches=m, vpp=vpp, iteration_time_s=total,
        closed_form_s=closed_form_iteration_s(stage_s, p2p_s, sync, m, schedule, blocking),
        busy_fraction=tuple(b / safe for b in busy),
        bubble_fraction=tuple(max(0.0, 1.0 - (b + s) / safe) for b, s in zip(busy, sync)),
        sync_fraction=tuple(s / safe for s in sync),
        peak_inflight=tuple(x / vpp for x in state.peak),
        compute_end_s=tuple(compute_end),
        events=tuple(sorted(events, key=lambda e: (e.start_s, e.stage, e.kind))),
        stage_labels=tuple(stage_labels),
    )


class _Replay:
    """List scheduling: always commit the action (operation or transfer) that can start earliest; ties go to a
    stage before a link, then to the lower stage, then to the link first used.

    Each resource's earliest start is kept in one heap (stale entries skipped by a version number) and recomputed
    only when one of its inputs changes, so a step costs O(log) instead of a scan of every stage and link (the scan
    made deep pipelines cost ~1 us per stage and event)."""

    def __init__(self, p, m, vpp, fwd, bwd, p2p, wrap, duplex):
        self.p, self.m, self.vpp, self.fwd, self.bwd, self.p2p, self.wrap = p, m, vpp, fwd, bwd, p2p, wrap
        self.duplex = duplex
        self.arrival: dict[tuple[str, int, int], float] = {}  # (kind, mb, vstage) -> input ready
        self.done_f: dict[tuple[int, int], float] = {}  # (mb, vstage) -> forward end
        self.queues: dict[str, list] = {}  # link -> heap of (request_s, bwd first?, seq, _Transfer): FCFS
        self.link_index: dict[str, int] = {}  # link -> order of first use (the tie-break among links)
        self.links: list[str] = []  # order of first use -> link
        self.link_free: dict[str, float] = {}
        self.events: list[Event] = []
        self.inflight = [0] * p
        self.peak = [0] * p
        self.blocking = False
        self.free: list[float] = [0.0] * p  # when each stage's stream is next free
        self.pending = [0] * p  # blocking: sends a stage has issued and not yet delivered
        self._seq = 0
        self._heap: list[tuple[float, int, int, int]] = []  # (start, 0 stage / 1 link, index, version)
        self._version: dict[tuple[int, int], int] = {}

    def _link_key(self, t: _Transfer) -> str:
        a, b = sorted((t.src, t.dst))
        return f"{a}-{b}" if self.duplex == "half" else f"{t.src}->{t.dst}"

    def _ready(self, j: int, op: tuple[str, int, int]) -> float | None:
        kind, mb, ch = op
        v = ch * self.p + j
        if kind == "F":
            return 0.0 if v == 0 else self.arrival.get(("F", mb, v))
        if v == self.p * self.vpp - 1:
            return self.done_f.get((mb, v))
        return self.arrival.get(("B", mb, v))

    def _request(self, kind: str, mb: int, v: int, end: float) -> str:
        """Queue the transfer that feeds virtual stage ``v`` (F: from v-1; B: from v+1); returns its link."""
        src_v = v - 1 if kind == "F" else v + 1
        src, dst = src_v % self.p, v % self.p
        if self.blocking:
            self.pending[src] += 1
        lo = min(src, dst)
        wrap = abs(src - dst) != 1 or self.p == 1
        dur = (self.wrap if wrap else self.p2p[lo]) / 2.0
        t = _Transfer(end, dur, "send_fwd" if kind == "F" else "send_bwd", src, dst, mb, v)
        key = self._link_key(t)
        if key not in self.queues:
            self.queues[key] = []
            self.link_index[key] = len(self.link_index)
            self.links.append(key)
        self._seq += 1  # equal (request, kind): first queued, first served
        heapq.heappush(self.queues[key], (t.request_s, t.kind != "send_fwd", self._seq, t))
        return key

    def _blocks_receiver(self, t: _Transfer) -> bool:
        """Blocking runtime: an end stage's stream also carries what it receives."""
        return self.blocking and self.p > 1 and t.dst in (0, self.p - 1)

    def _offer(self, what: int, idx: int, start: float | None) -> None:
        """Resource (what, idx)'s earliest start is now ``start`` (None: nothing it can start)."""
        ver = self._version.get((what, idx), 0) + 1
        self._version[(what, idx)] = ver
        if start is not None:
            heapq.heappush(self._heap, (start, what, idx, ver))

    def _offer_stage(self, j: int, orders, nxt) -> None:
        r = None
        if nxt[j] < len(orders[j]) and not self.pending[j]:
            r = self._ready(j, orders[j][nxt[j]])
        self._offer(0, j, None if r is None else max(r, self.free[j]))

    def _offer_link(self, key: str) -> None:
        q = self.queues[key]
        start = None
        if q:
            head = q[0][3]
            start = max(head.request_s, self.link_free.get(key, 0.0))
            if self._blocks_receiver(head):
                start = max(start, self.free[head.dst])
        self._offer(1, self.link_index[key], start)

    def run(self, orders: list[list[tuple[str, int, int]]]) -> None:
        nxt = [0] * self.p
        free = self.free
        last_v = self.p * self.vpp - 1
        for j in range(self.p):
            self._offer_stage(j, orders, nxt)
        while self._heap:
            start, what, idx, ver = heapq.heappop(self._heap)
            if self._version.get((what, idx)) != ver:
                continue  # stale: that resource's start changed since
            self._version[(what, idx)] = ver + 1  # consumed
            touched_stages: set[int] = set()
            touched_links: set[str] = set()
            if what == 1:
                who = self.links[idx]
                t = heapq.heappop(self.queues[who])[3]
                self.link_free[who] = start + t.duration_s
                touched_links.add(who)
                if self.blocking:  # the sender waits for delivery; an end stage's receive holds its stream
                    self.pending[t.src] -= 1
                    free[t.src] = max(free[t.src], start + t.duration_s)
                    if self._blocks_receiver(t):
                        free[t.dst] = max(free[t.dst], start + t.duration_s)
                    touched_stages.add(t.src)
                self.arrival[("F" if t.kind == "send_fwd" else "B", t.mb, t.vstage)] = start + t.duration_s
                touched_stages.add(t.dst)
                self.events.append(Event(t.kind, t.src, t.mb, t.vstage // self.p, start, start + t.duration_s,
                                         f"{t.src}->{t.dst}"))
            else:
                j = idx
                kind, mb, ch = orders[j][nxt[j]]
                nxt[j] += 1
                v = ch * self.p + j
                end = start + (self.fwd[j] if kind == "F" else self.bwd[j])
                free[j] = end
                touched_stages.add(j)
                self.events.append(Event(kind, j, mb, ch, start, end))
                if kind == "F":
                    self.inflight[j] += 1
                    self.peak[j] = max(self.peak[j], self.inflight[j])
                    self.done_f[(mb, v)] = end
                    if v < last_v:
                        touched_links.add(self._request("F", mb, v + 1, end))
                else:
                    self.inflight[j] -= 1
                    if v > 0:
                        touched_links.add(self._request("B", mb, v - 1, end))
            if self.blocking:  # a stage's stream (free) feeds the start of a link whose head it receives (an end
                # stage, ``_blocks_receiver``); its pending sends are its own, and the stages they change are touched
                touched_links.update(k for k, q in self.queues.items() if q and q[0][3].dst in touched_stages)
            for j in sorted(touched_stages):
                self._offer_stage(j, orders, nxt)
            for key in touched_links:
                self._offer_link(key)
        left = sum(len(o) for o in orders) - sum(nxt)
        if left:  # cannot happen for the schedules above; an internal invariant
            raise AssertionError(f"pipeline replay deadlocked with {left} operations left")


# --------------------------------------------------------------------------- from a plan


def stage_label(j: int, stage) -> str:
    """Short label of a StagePlan for plots and tables."""
    rc = "" if stage.recompute == "none" else f" rc={stage.recompute}"
    if stage.replicas:  # a mixed stage (formulations/ eq. H1): replayed as one stage paced by its slowest type
        who = " + ".join(f"{r.gpu_type} tp{r.tp} x{r.count}" for r in stage.replicas)
        return f"{j}: {who} {stage.num_layers}L{rc}"
    return f"{j}: {stage.gpu_type} tp{stage.tp} dp{stage.dp} {stage.num_layers}L{rc}"


def bwd_fraction_for(recompute: str) -> float:
    """Backward share of t_j for the stage's recompute mode (``pipeline.bwd_share``: 2/3, full recompute 3/4)."""
    return bwd_share(recompute)


def plan_timings(plan, estimator) -> tuple[list[float], list[float], list[float], float]:
    """(t_j, c_j, s_j, c_wrap) of a plan, all from ``estimator.estimate(plan)``: t_j and s_j per stage,
    c_j and the last -> first wrap boundary from the PlanEstimate's ``boundary_s`` / ``wrap_boundary_s``
    (the estimator's own p2p model at the plan's batch and sequence)."""
    est = estimator.estimate(plan)
    t = [s.time_s for s in est.stages]
    sync = [s.breakdown.get("sync_s", 0.0) for s in est.stages]
    return t, list(est.boundary_s), sync, est.wrap_boundary_s


def simulate_plan(plan, estimator, duplex: Literal["full", "half"] = "full",
                  bwd_fraction: float | None = None) -> SimulationResult:
    """Replay ``plan`` with per-stage numbers from ``estimator`` (an ``estimator.Estimator``).

    Forward/backward split per stage by its recompute (``bwd_fraction_for``) unless ``bwd_fraction``
    is given; the estimator's t_j already contains the recompute time. Interleaving uses the
    last -> first stage link for the wrap. A plan of more than MAX_REPLAY_EVENTS events is refused, naming
    ``plan.num_microbatches`` (or ``plan.vpp``).
    """
    check_replay_size(plan.pp, plan.num_microbatches, plan.vpp, ("plan.num_microbatches", "plan.vpp"))
    t, c, s, wrap = plan_timings(plan, estimator)
    fracs = [bwd_fraction if bwd_fraction is not None else bwd_fraction_for(st.recompute) for st in plan.stages]
    fwd, bwd = zip(*(split_stage_time(tj, f) for tj, f in zip(t, fracs)))
    schedule = plan.schedule if plan.vpp > 1 or plan.schedule != "interleaved" else "1f1b"
    return simulate(list(fwd), list(bwd), c, s, num_microbatches=plan.num_microbatches, schedule=schedule,
                    vpp=plan.vpp, wrap_p2p_s=wrap, duplex=duplex,
                    stage_labels=[stage_label(j, st) for j, st in enumerate(plan.stages)],
                    blocking=bool(getattr(estimator, "p2p_blocking", False)))
