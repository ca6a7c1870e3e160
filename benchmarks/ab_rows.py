"""Two settings of the search compared on the same bench rows, in the same minutes (issue 11's measurements).

On a shared 2-core VM the speed of identical runs moves by 30 % within minutes and by up to 2x within an hour
(benchmarks/results/solve_scaling.md, 2026-12-06), and a row proven at 9.5 s in one run is open at 10 s in the next,
so two codes compared in two separate grid runs cannot be told apart. This script runs each row once per arm per
repeat, the arms back to back and in alternating order (A B, then B A), each solve a fresh `haap-solve solve` process
(2 threads) with the bench spec's inputs, and reports per row the time to the proof (the process's wall clock where
the plan is proven within the spec's gap, else "open") with a limit long enough that the hard rows prove (default
30 s): a continuous measure instead of a 10 s cut. An arm is a list of module switches (``MODULE:NAME=VALUE``, as
``bench_end_to_end.py --set``); the empty list is the code as it is.

    python benchmarks/ab_rows.py --a haap_milp.solvers.dp:SHARE_LOOK_AHEAD=False --b \\
        [--rows mixtral-8x7b@3types-1024 ...] [--limit 30] [--repeats 2] [--out F.csv]

Prints one line per solve, then per row the median time to the proof per arm and B / A, and the geometric mean of
B / A over the rows every run of both arms proved; writes the CSV (one row per solve).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_end_to_end import run

from haap_milp.bench.spec import load_spec
from haap_milp.outputs import write_atomic

# the bench rows that were open or near the 10 s bar on 2026-12-06 (solve_scaling.md)
HARD = ("mixtral-8x7b@3types-1024", "mixtral-8x7b@3types-4096", "llama3-70b@3types-4096", "qwen3-235b-a22b@3types-1024",
        "qwen3-235b-a22b@3types-4096", "gpt3-13b@3types-4096")


def _tasks(spec, names: list[str]) -> list:
    """The spec's tasks named ``MODEL@CLUSTER_LABEL``, in the order given (an unknown name is an error)."""
    by_name = {f"{t.model}@{t.cluster}": t for t in spec.tasks()}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise SystemExit(f"--rows: {', '.join(missing)} not in the spec (known: {', '.join(by_name)})")
    return [by_name[n] for n in names]


def summary(rows: list[dict]) -> list[str]:
    """Per row the median time to the proof per arm (over its proven runs; "open k/n" where some were not) and B / A
    where every run of both arms proved, then the geometric mean of those ratios."""
    out, ratios = [], []
    for name in dict.fromkeys(r["row"] for r in rows):
        med, line = {}, f"{name:32s}"
        for arm in ("A", "B"):
            runs = [r for r in rows if r["row"] == name and r["arm"] == arm]
            done = [r["wall_s"] for r in runs if r["proven"] == 1]
            med[arm] = statistics.median(done) if len(done) == len(runs) else None
            line += f"  {arm} " + (f"{med[arm]:6.2f} s" if med[arm] is not None else f"open {len(runs) - len(done)}/"
                                    f"{len(runs)}")
        if med["A"] is not None and med["B"] is not None:
            ratios.append(med["B"] / med["A"])
            line += f"  B/A {ratios[-1]:.3f}"
        out.append(line)
    if ratios:
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        out.append(f"geometric mean B/A over {len(ratios)} rows proven in every run: {gm:.3f}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=str(ROOT / "benchmarks/specs/default.yaml"))
    ap.add_argument("--rows", nargs="+", default=list(HARD), metavar="MODEL@CLUSTER_LABEL")
    ap.add_argument("--a", nargs="*", default=[], metavar="MODULE:NAME=VALUE", help="arm A's switches")
    ap.add_argument("--b", nargs="*", default=[], metavar="MODULE:NAME=VALUE", help="arm B's switches")
    ap.add_argument("--limit", type=float, default=30.0, help="--time-limit of each solve, s")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/ab_rows.csv")
    a = ap.parse_args(argv)
    spec = load_spec(a.spec)
    tasks = _tasks(spec, a.rows)
    arms = {"A": a.a, "B": a.b}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            for task in tasks:
                for arm in ("A", "B") if rep % 2 == 0 else ("B", "A"):  # (A B, B A: a drift in speed cancels)
                    r = {"row": f"{task.model}@{task.cluster}", "arm": arm, "repeat": rep,
                         **run(spec, task, a.limit, a.threads, Path(tmp), arms[arm])}
                    rows.append(r)
                    print(f"{r['row']:32s} {arm} {r['status']:10s} gap {r.get('gap_pct')}% "
                          f"T {r.get('iteration_time_s')} wall {r['wall_s']:.2f} s load {r['load1']}", flush=True)
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    w.writeheader()
    w.writerows(rows)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(a.out, text.getvalue(), flag="--out")  # (whole or not at all)
    print(f"A: {' '.join(a.a) or '(as it is)'}; B: {' '.join(a.b) or '(as it is)'}; limit {a.limit:g} s")
    for line in summary(rows):
        print(line)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
