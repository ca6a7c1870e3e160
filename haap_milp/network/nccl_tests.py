"""Import nccl-tests output (github.com/NVIDIA/nccl-tests): all_reduce_perf, all_gather_perf,
reduce_scatter_perf, sendrecv_perf, alltoall_perf.

What is read (the format of nccl-tests' src/common.cu / util.cu):

* ``#  Rank  R Group  G Pid  P on  HOST device  D [BUS] NAME`` lines: the ranks, their hosts and GPU names
  (rank count n, host count N, g = n / N ranks per host);
* the column header ``#  size  count  type  redop  root  time  algbw  busbw  #wrong  time ...`` (older
  versions have no ``root`` column: the first ``time`` column is found by name);
* data lines: size (bytes), count, type, redop, [root], then out-of-place time (us), algbw, busbw, #wrong,
  then the same in place. The out-of-place time is used; bandwidths are recomputed from size / time (the
  printed GB/s are rounded to 0.00 for small sizes).
* the tool: from a ``# Collective test starting: all_reduce_perf`` line or from the file name.

How a measurement becomes a figure (S = size column, t = time, algbw = S / t; f = 2 for all-reduce and
1 for all-gather / reduce-scatter, as in estimator.comm.FACTOR): chosen so that estimator.comm's formula
for the same collective gives back the measured time at the measured size and rank count.

* one host: ``intra_node``, ``per: gpu_stream``, ``senders: n``, figure = busbw = f·(n-1)/n·algbw
  (all-to-all: (n-1)/n·algbw; sendrecv: algbw) - the per-GPU link of a ring (comm.ring) among n GPUs.
* several hosts, all-reduce / all-gather / reduce-scatter: ``inter_node``, ``per: node_nic``, ``senders: g``,
  figure = f·(N-1)/N·algbw - the node NIC throughput of comm.group_collective's hierarchical form
  (each node moves f·(N-1)/N·S through its NICs);
* several hosts, alltoall: ``inter_node``, ``per: gpu_stream``, ``senders: g``, figure = (n-g)/n·algbw - the
  remote part of each rank's buffer over its share of the NICs (comm.all_to_all);
* several hosts, sendrecv: each rank sends S to the next rank; the ring crosses each host boundary on one
  GPU's stream: ``per: gpu_stream``, ``senders: 1``, figure = algbw. Two hosts of different GPU types:
  ``cross_type`` both ways.

The curve is a table of (size, GB/s) points; ``latency_us`` is 0 because the small sizes' points hold it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from haap_milp.catalog.files import read_text
from haap_milp.catalog.validation import format_validation_error
from haap_milp.errors import HaapInputError
from haap_milp.network import names
from haap_milp.network.spec import MeasuredLink, TableCurve, TablePoint

TOOLS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter",
         "sendrecv_perf": "sendrecv", "alltoall_perf": "alltoall"}
FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}
RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$")
STARTING = re.compile(r"test starting:\s*(\w+)")


@dataclass(frozen=True)
class Run:
    """One parsed output: the tool, the ranks' hosts and GPU names, (size bytes, out-of-place time us) rows."""

    op: str
    hosts: tuple[str, ...]  # per rank
    devices: tuple[str, ...]  # per rank
    rows: tuple[tuple[float, float], ...]

    @property
    def ranks(self) -> int:
        return len(self.hosts)


def _tool(text: str, path: Path) -> str:
    m = STARTING.search(text)
    for candidate in ([m.group(1)] if m else []) + [path.name]:
        for tool, op in TOOLS.items():
            if tool in candidate or tool.removesuffix("_perf") in candidate:
                return op
    raise HaapInputError(f"nccl-tests file {str(path)!r}: cannot tell which test produced it; name the file after "
                         f"the tool (one of {', '.join(TOOLS)}), e.g. all_reduce_perf.txt.", field="file",
                         value=str(path))


def parse(text: str, path: Path) -> Run:
    """Parse one nccl-tests output (errors name the file and line)."""
    op = _tool(text, path)
    ranks: dict[int, tuple[str, str]] = {}
    time_col = 5  # size count type redop root | time ...
    rows: dict[float, float] = {}
    for no, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            if (m := RANK.match(s)) is not None:
                ranks[int(m.group(1))] = (m.group(2), m.group(3))
            elif "size" in s.split() and "time" in s.split():
                cols = s.lstrip("#").split()
                time_col = cols.index("time")
            continue
        tok = s.split()
        if not re.fullmatch(r"\d+", tok[0]):
            if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", tok[0]):  # a size, but not a byte count
                raise HaapInputError(f"nccl-tests file {str(path)!r}, line {no}: size {tok[0]!r} is not a whole "
                                     "number of bytes.", field="file", value=str(path))
            continue  # other output (NCCL INFO lines, warnings)
        try:
            size, t_us = float(tok[0]), float(tok[time_col])
        except (IndexError, ValueError):
            raise HaapInputError(f"nccl-tests file {str(path)!r}, line {no}: {s[:120]!r} is not 'size count type "
                                 "redop root time algbw busbw #wrong ...'.", field="file", value=str(path)) from None
        if size > 0 and not (math.isfinite(t_us) and t_us > 0):  # (size 0 rows time nothing; nccl-tests prints them)
            raise HaapInputError(f"nccl-tests file {str(path)!r}, line {no}: time {tok[time_col]!r} us for {tok[0]} "
                                 "bytes is not a positive number.", field="file", value=str(path))
        if size > 0:
            rows[size] = t_us
    if not ranks:
        raise HaapInputError(f"nccl-tests file {str(path)!r} has no '#  Rank N Group ... device ... NAME' lines; keep "
                             "the whole output (they tell the rank count, hosts and GPU type).", field="file",
                             value=str(path))
    if not rows:
        raise HaapInputError(f"nccl-tests file {str(path)!r} has no result lines (size count type ... time algbw "
                             "busbw).", field="file", value=str(path))
    order = sorted(ranks)
    return Run(op, tuple(ranks[r][0] for r in order), tuple(ranks[r][1] for r in order),
               tuple(sorted(rows.items())))


def _point(path: Path, size: float, gbps: float) -> TablePoint:
    """One measured point; a bandwidth no link has (a time of 1e-300 us) names the file and the row, not the spec's
    field."""
    try:
        return TablePoint(message_bytes=size, bandwidth_gbps=gbps)
    except ValidationError as exc:
        raise format_validation_error(TablePoint, exc, f"nccl-tests file {str(path)!r}: the row of {size:.0f} bytes "
                                      f"gives {gbps:.3g} GB/s, which no link measures") from None


def import_links(path: Path, gpu_names: dict[str, str]) -> list[MeasuredLink]:
    """The measured link(s) of one nccl-tests output file (see the module docstring)."""
    text = read_text(path, "nccl-tests file")  # bounded: a FIFO, /dev/zero or a folder is refused, not read
    run = parse(text, path)
    mapped = names.resolve(list(run.devices), gpu_names, f"nccl-tests file {str(path)!r}")
    host_list = list(dict.fromkeys(run.hosts))
    per_host = {h: run.hosts.count(h) for h in host_list}
    if len(set(per_host.values())) != 1:
        raise HaapInputError(f"nccl-tests file {str(path)!r}: hosts run different rank counts ({per_host}); haap "
                             "reads runs with the same number of GPUs on every host.", field="file", value=str(path))
    host_type = {}
    for h, d in zip(run.hosts, run.devices, strict=True):
        host_type.setdefault(h, set()).add(mapped[d])
    if any(len(t) > 1 or None in t for t in host_type.values()):
        raise HaapInputError(f"nccl-tests file {str(path)!r}: every host must hold one GPU type that is imported "
                             f"(found {({h: sorted(map(str, t)) for h, t in host_type.items()})}).", field="file",
                             value=str(path))
    types = list(dict.fromkeys(next(iter(t)) for t in host_type.values()))
    n, hosts = run.ranks, len(host_list)
    g = n // hosts
    src = f"nccl-tests {path.name}: {run.op}, {n} ranks on {hosts} host(s)"

    def link(cls: str, gpu_types: tuple[str, ...], per: str, senders: int, scale: float) -> MeasuredLink:
        pts = tuple(_point(path, s, s / (t * 1e3) * scale) for s, t in run.rows)
        return MeasuredLink(link=cls, gpu_types=gpu_types, per=per, senders=senders, op=run.op,  # type: ignore[arg-type]
                            curve=TableCurve(points=pts), source=src)

    if len(types) > 1:
        if run.op != "sendrecv" or hosts != 2:
            raise HaapInputError(f"nccl-tests file {str(path)!r} mixes GPU types {', '.join(types)}; only "
                                 "sendrecv_perf between two hosts of different types is read (as cross_type).",
                                 field="file", value=str(path))
        return [link("cross_type", (types[0], types[1]), "gpu_stream", 1, 1.0),
                link("cross_type", (types[1], types[0]), "gpu_stream", 1, 1.0)]
    t = (types[0],)
    if hosts == 1:
        if n < 2:
            raise HaapInputError(f"nccl-tests file {str(path)!r} ran on one GPU: it measures no link.", field="file",
                                 value=str(path))
        scale = {"sendrecv": 1.0, "alltoall": (n - 1) / n}.get(run.op, FACTOR.get(run.op, 1.0) * (n - 1) / n)
        return [link("intra_node", t, "gpu_stream", n, scale)]
    if run.op in FACTOR:
        return [link("inter_node", t, "node_nic", g, FACTOR[run.op] * (hosts - 1) / hosts)]
    if run.op == "alltoall":
        return [link("inter_node", t, "gpu_stream", g, (n - g) / n)]
    return [link("inter_node", t, "gpu_stream", 1, 1.0)]
