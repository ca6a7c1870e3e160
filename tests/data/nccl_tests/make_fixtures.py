"""Writes the nccl-tests fixtures of this folder: synthetic timings (latency + size / bandwidth, +-1 % noise)
printed in nccl-tests' exact format (src/common.cu, util.cu: '%12li  %12li  %8s  %6s  %6s' then
'  %7s  %6s  %6s  %6g' out of place and in place; rank lines '#  Rank %2d Group %2d Pid %6d on %10s device %2d
[0x%02x] %s'). Run it from anywhere: python tests/data/nccl_tests/make_fixtures.py"""
# ruff: noqa: UP031  (printf formats on purpose: they are nccl-tests' own)

import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
HDR = """# nThread 1 nGpus {ngpus} minBytes {minb} maxBytes {maxb} step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 \
validation: 1 graph: 0
#
# Using devices
{ranks}#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
"""
BUS = [0x07, 0x0B, 0x48, 0x4C, 0x88, 0x8B, 0xC8, 0xCB]


def num(v: float, w: int) -> str:
    """nccl-tests' getFloatStr: %.2f, else %.1f, else %.0f, else %.1e within the width."""
    for fmt in ("%*.2f", "%*.1f", "%*.0f"):
        s = fmt % (w, v)
        if len(s) <= w:
            return s
    return "%*.1e" % (w, v)


def write(name, tool, hosts, per_host, devices, lat_us, peak_algbw, redop, dtype="float", procs_per_host=None,
          sizes=None, noise=False):
    n = len(hosts) * per_host
    ranks, r = "", 0
    one_proc = procs_per_host == 1
    for hi, h in enumerate(hosts):
        for d in range(per_host):
            pid = 41000 + 100 * hi + (0 if one_proc else d)
            ranks += "#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s\n" % (r, 0, pid, h, d, BUS[d % 8],
                                                                                        devices[hi])
            r += 1
    sizes = sizes or [2 ** k for k in range(20, 31)]
    busf = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "alltoall": (n - 1) / n, "sendrecv": 1.0}[tool]
    out = "# Collective test starting: %s_perf\n" % tool
    out += HDR.format(ngpus=per_host if one_proc else 1, minb=sizes[0], maxb=sizes[-1], ranks=ranks)
    tot = 0.0
    elem = 4 if dtype == "float" else 2
    for s in sizes:
        line = "%12li  %12li  %8s  %6s  %6s" % (s, s // elem, dtype, redop, "-1")
        for _ in range(2):
            t = (lat_us + s / (peak_algbw * 1e3)) * random.uniform(0.99, 1.01)
            alg = s / t / 1e3
            line += "  %7s  %6s  %6s  %6g" % (num(t, 7), num(alg, 6), num(alg * busf, 6), 0)
            tot += alg * busf
        out += line + "\n"
        if noise and s == 2 ** 12:
            out += "node01:41000:41012 [0] NCCL INFO Channel 00/08 : 0 1 2 3 4 5 6 7\n"
    out += "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : %g \n#\n\n" % (tot / 2 / len(sizes))
    (HERE / name).write_text(out)


if __name__ == "__main__":
    random.seed(7)
    a80, a40, v16, h100 = "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-16GB", "NVIDIA H100 80GB HBM3"
    write("all_reduce_perf_1node_a100.txt", "all_reduce", ["node01"], 8, [a80], 30.0, 130.0, "sum", procs_per_host=1,
          sizes=[2 ** k for k in range(3, 31)], noise=True)
    write("all_gather_perf_2node_h100.txt", "all_gather", ["gpu-a17", "gpu-a18"], 8, [h100] * 2, 45.0, 42.0, "none",
          dtype="half")
    write("reduce_scatter_perf_2node_h100.txt", "reduce_scatter", ["gpu-a17", "gpu-a18"], 8, [h100] * 2, 50.0, 40.0,
          "sum", dtype="half")
    write("sendrecv_perf_2node_a100.txt", "sendrecv", ["node01", "node02"], 1, [a40] * 2, 20.0, 11.5, "sum")
    write("alltoall_perf_2node_h100.txt", "alltoall", ["gpu-a17", "gpu-a18"], 8, [h100] * 2, 60.0, 80.0, "none",
          dtype="half")
    write("sendrecv_perf_a100_v100.txt", "sendrecv", ["node01", "node07"], 1, [a40, v16], 25.0, 6.0, "sum")
