"""The measured network of a cluster: bandwidth as a function of message size, per link class.

A ``MeasuredLink`` is one measured figure:

* ``link``: the class of link it describes -
  ``intra_node`` (GPUs of one node of ``gpu_types[0]``: NVLink / PCIe),
  ``inter_node`` (between two nodes of ``gpu_types[0]``),
  ``cross_type`` (from a node of ``gpu_types[0]`` to a node of ``gpu_types[1]``; directional, sender first),
  ``inter_island`` (from island ``islands[0]`` to island ``islands[1]``; directional).
  ``islands`` on the first three classes restricts the figure to one island (empty: every island).
* ``per`` and ``senders``: what the figure is a bandwidth *of*. ``gpu_stream``: what each one GPU's stream
  got while ``senders`` GPUs of its node sent at the same time (nccl-tests' busbw is this: per rank).
  ``node_nic``: what the ``senders`` GPUs of one node got *together* (a node's NICs as a whole when
  ``senders`` = GPUs per node). Sailor's fig-8b table: n = 1 is one stream (1.5 GB/s at 8 MB between
  A100 VMs), n = 4 the whole VM (about 6 GB/s) - not 4 x 1.5: the NIC is shared.
* ``op``: the operation it was measured with (``all_reduce`` ... ``p2p``); pricing prefers a figure
  measured with the collective it prices and otherwise uses any figure of the class.
* ``curve``: bandwidth in GB/s (1e9 bytes/s) against the message size in bytes, either a table
  interpolated linearly in bandwidth against log(message size) between its points and held constant
  beyond its first and last point (what nccl-tests prints: sizes in powers of two), or Sailor's fit
  a·x² + b·x + c with x = log2(message MB), capped at ``max_gbps``.
* ``latency_us``: a per-message start-up added on top of size / bandwidth (0 when the curve already holds
  it, as fitted curves of measured transfer times do).

Measured figures are used as given: no efficiency factor multiplies them (estimator.comm's calibrated
``nvlink_eff`` / ``nic_eff`` apply only to datasheet bandwidths).

This module imports nothing from haap (``specs.ClusterSpec.network`` is a ``MeasuredNetwork``).
"""

from __future__ import annotations

import bisect
import itertools
import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

LinkClass = Literal["intra_node", "inter_node", "cross_type", "inter_island"]
Per = Literal["gpu_stream", "node_nic"]
Op = Literal["all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv", "p2p", "unknown"]
MB_BYTES = 1e6  # Sailor's x = log2(message MB); decimal MB, as its GB/s and "bytes / 1e9 / bandwidth"
# The slowest link bandwidth accepted, GB/s: 1e-3 GB/s is 8 Mbit/s, below any NIC, PCIe or WAN link a training job
# runs over (1 Gb Ethernet is 0.125 GB/s). A slower figure is a typo, and its transfer times (1e12 s and more at
# 1e-15 GB/s) overflowed CP-SAT's integer time scale. The home of this bound (specs.cluster's links use it too).
MIN_LINK_GBPS = 1e-3
# A measured table point: its message goes through within this many seconds (size / bandwidth). Small messages
# legitimately measure far below MIN_LINK_GBPS (8 bytes in 100 us of WAN latency is 8e-8 GB/s), so a point's floor
# grows with its size; no benchmark times one message for an hour.
MAX_TRANSFER_S = 3600.0


def slowest_gbps(message_bytes: float) -> float:
    """The least bandwidth (GB/s) a measured figure may give at ``message_bytes``: MAX_TRANSFER_S for the message."""
    return message_bytes / 1e9 / MAX_TRANSFER_S


class _Frozen(BaseModel):
    # (defer_build: built on first use, as specs/base.py's Frozen)
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, defer_build=True)


class TablePoint(_Frozen):
    """One measured point."""

    message_bytes: float = Field(description="Message size, bytes.", gt=0, le=1e15)
    bandwidth_gbps: float = Field(description="Bandwidth at that size, GB/s (1e9 bytes/s); the message takes at most "
                                  f"{MAX_TRANSFER_S:g} s.", gt=0, le=1e6)

    @field_validator("bandwidth_gbps")
    @classmethod
    def _not_too_slow(cls, v: float, info: ValidationInfo) -> float:
        size = info.data.get("message_bytes")
        if size is not None and v < slowest_gbps(size):
            raise ValueError(f"{v:g} GB/s moves {size:g} bytes in {size / 1e9 / v:.3g} s, more than {MAX_TRANSFER_S:g} s "
                             f"(at least {slowest_gbps(size):.3g} GB/s at that size)")
        return v


class TableCurve(_Frozen):
    """Measured points; linear in bandwidth against log(message size) between them, constant beyond."""

    kind: Literal["table"] = "table"
    points: tuple[TablePoint, ...] = Field(description="Points in increasing message size.", min_length=1,
                                           max_length=10_000)

    @model_validator(mode="after")
    def _increasing(self) -> TableCurve:
        sizes = [p.message_bytes for p in self.points]
        for a, b in itertools.pairwise(sizes):
            if b <= a:
                raise ValueError(f"table points must have strictly increasing message_bytes; {b:g} follows {a:g}")
        return self

    def bandwidth_gbps(self, message_bytes: float) -> float:
        pts = self.points
        if message_bytes <= pts[0].message_bytes:
            return pts[0].bandwidth_gbps
        if message_bytes >= pts[-1].message_bytes:
            return pts[-1].bandwidth_gbps
        i = bisect.bisect_right([p.message_bytes for p in pts], message_bytes)
        lo, hi = pts[i - 1], pts[i]
        w = math.log(message_bytes / lo.message_bytes) / math.log(hi.message_bytes / lo.message_bytes)
        return lo.bandwidth_gbps + w * (hi.bandwidth_gbps - lo.bandwidth_gbps)


class Log2QuadraticCurve(_Frozen):
    """Sailor's fit: bandwidth GB/s = a·x² + b·x + c, x = log2(message bytes / 1e6), capped at ``max_gbps``.

    Outside the range a fit can be trusted in it is held constant: below ``min_message_bytes`` (default
    1 MB, x = 0: the quadratic falls to zero a few powers of two lower; small messages are latency-bound)
    and, for a < 0, beyond the vertex (a larger message never moves slower)."""

    kind: Literal["log2_quadratic"] = "log2_quadratic"
    coefficients: tuple[float, float, float] = Field(description="(a, b, c) of a·x² + b·x + c, GB/s.")
    max_gbps: float = Field(description="Cap, GB/s.", ge=MIN_LINK_GBPS, le=1e6)
    min_message_bytes: float = Field(default=MB_BYTES, description="Sizes below this use its bandwidth.", gt=0)

    @model_validator(mode="after")
    def _positive(self) -> Log2QuadraticCurve:
        a, b, _ = self.coefficients
        xs = [math.log2(self.min_message_bytes / MB_BYTES)]
        if a > 0 and -b / (2 * a) > xs[0]:
            xs.append(-b / (2 * a))  # the curve's minimum
        for x in xs:
            size, bw = MB_BYTES * 2 ** x, self._raw(x)
            if bw <= 0:
                raise ValueError(f"curve {self.coefficients} is not positive at message size {size:g} bytes; raise "
                                 "min_message_bytes")
            if bw < slowest_gbps(size):
                raise ValueError(f"curve {self.coefficients} gives {bw:g} GB/s at message size {size:g} bytes, more "
                                 f"than {MAX_TRANSFER_S:g} s for that message; raise min_message_bytes")
        return self

    def _raw(self, x: float) -> float:
        a, b, c = self.coefficients
        return a * x * x + b * x + c

    def bandwidth_gbps(self, message_bytes: float) -> float:
        a, b, _ = self.coefficients
        x = math.log2(max(message_bytes, self.min_message_bytes) / MB_BYTES)
        if a < 0:
            x = min(x, -b / (2 * a))
        return min(self._raw(x), self.max_gbps)


Curve = Annotated[TableCurve | Log2QuadraticCurve, Field(discriminator="kind")]


class MeasuredLink(_Frozen):
    """One measured figure of one link class (see the module docstring)."""

    link: LinkClass = Field(description="intra_node | inter_node | cross_type | inter_island.")
    gpu_types: tuple[str, ...] = Field(default=(), description="intra_node / inter_node: [type]; cross_type: "
                                       "[sender type, receiver type]; inter_island: [] (any).")
    islands: tuple[str, ...] = Field(default=(), description="inter_island: [sender island, receiver island]; "
                                     "other classes: [] (every island) or [one island].")
    per: Per = Field(description="gpu_stream: each GPU's stream got this; node_nic: the senders of one node "
                     "together got this.")
    senders: int = Field(default=1, description="GPUs of one node sending at the same time when measured.",
                         ge=1, le=1024)
    op: Op = Field(default="p2p", description="Operation measured (nccl-tests tool or p2p).")
    curve: Curve = Field(description="Bandwidth (GB/s) against message size (bytes).")
    latency_us: float = Field(default=0.0, description="Start-up per message on top of the curve, microseconds.",
                              ge=0, le=1e7)
    source: str = Field(default="", description="Where the figure comes from.", max_length=2000)

    @model_validator(mode="after")
    def _shape(self) -> MeasuredLink:
        want_types = {"intra_node": 1, "inter_node": 1, "cross_type": 2, "inter_island": 0}[self.link]
        if len(self.gpu_types) != want_types:
            raise ValueError(f"a {self.link} link names {want_types} GPU type(s) in gpu_types, got "
                             f"{list(self.gpu_types)}")
        if self.link == "inter_island":
            if len(self.islands) != 2 or self.islands[0] == self.islands[1]:
                raise ValueError(f"an inter_island link names two different islands, got {list(self.islands)}")
        elif len(self.islands) > 1:
            raise ValueError(f"a {self.link} link names at most one island, got {list(self.islands)}")
        if self.link == "cross_type" and self.gpu_types[0] == self.gpu_types[1]:
            raise ValueError(f"a cross_type link joins two different GPU types, got {list(self.gpu_types)} "
                             "(use inter_node)")
        return self

    def bandwidth_gbps(self, message_bytes: float) -> float:
        return self.curve.bandwidth_gbps(message_bytes)


class MeasuredNetwork(_Frozen):
    """Measured links of a cluster (``haap-solve network import`` writes one; ``--network FILE`` reads it)."""

    kind: Literal["network"] = Field(default="network", description="File kind marker.")
    name: str = Field(default="measured", description="Display name.", min_length=1, max_length=200)
    links: tuple[MeasuredLink, ...] = Field(description="Measured links (at least one).", min_length=1,
                                            max_length=100_000)
    dp_bucket_bytes: float | None = Field(
        default=None, gt=0, description="Message size of the data-parallel gradient collectives, bytes (None: "
        "Megatron-Core's default bucket, max(4e7, 1e6 x dp) elements).")
    source: str = Field(default="", description="Where the measurements come from.", max_length=2000)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for lk in self.links for t in lk.gpu_types))

    @property
    def islands(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(i for lk in self.links for i in lk.islands))
