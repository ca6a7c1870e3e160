"""Issue 11's bar on instances outside the bench grids: the held-out sets of `specs/outside.yaml`, each instance solved
by `haap-solve solve` as a fresh process, end to end, with 2 solver threads (``--threads``) and `--time-limit`.

These sets are for measuring, not for tuning against: a change is judged on all of them together. Each entry is
``model | cluster | global batch (sequences) | sequence length (tokens)``, solved with the CLI's defaults otherwise
(bf16, --target any, --gap 0.01). An instance in several of the chosen sets is solved once per repeat and its result
counted in each of them. Infeasible instances are listed as such (their explanation is the result).

    python benchmarks/outside_sweep.py [--spec SPEC.yaml] [--sets fresh20 isl18 ...] [--limit 10] [--threads 2] \\
        [--repeats 1] [--only SUBSTRING] [--out F.csv]

Prints one line per solve as it finishes, then per set the count proven within 1 % at or under the limit and the
open instances with their gap; writes the CSV (one row per solve) with ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_end_to_end import timed_solve

from haap_milp.outputs import write_atomic

GAP = 0.01  # the CLI's default --gap (fraction): the bar is "proven within 1 %"
FIELDS = ("set", "model", "cluster", "gbs", "seq", "repeat", "status", "gap_pct", "iteration_time_s", "wall_s",
          "proven", "load1", "code")


class Instance(NamedTuple):
    model: str
    cluster: str
    gbs: int  # global batch, sequences
    seq: int  # sequence length, tokens

    def label(self) -> str:
        return f"{self.model} | {self.cluster} | {self.gbs} | {self.seq}"


def parse_instance(text, set_name: str) -> Instance:
    """One entry ``"model | cluster | gbs | seq"`` (a malformed one: ValueError naming the set and the entry)."""
    parts = [p.strip() for p in text.split("|")] if isinstance(text, str) else []
    if len(parts) != 4 or not parts[0] or not parts[1] or not parts[2].isdigit() or not parts[3].isdigit():
        raise ValueError(f"set {set_name!r}: entry {text!r} is not 'model | cluster | gbs | seq' "
                         "(gbs and seq positive integers)")
    inst = Instance(parts[0], parts[1], int(parts[2]), int(parts[3]))
    if inst.gbs < 1 or inst.seq < 1:
        raise ValueError(f"set {set_name!r}: entry {text!r}: gbs and seq must be positive")
    return inst


def load_sets(path: str | Path) -> dict[str, list[Instance]]:
    """The spec's sets in file order: name -> its instances (ValueError on a malformed set or entry)."""
    data = yaml.safe_load(Path(path).read_text())
    sets = data.get("sets") if isinstance(data, dict) else None
    if not isinstance(sets, dict) or not sets:
        raise ValueError(f"{path}: expected a mapping 'sets: {{NAME: {{description, instances: [...]}}}}'")
    out = {}
    for name, body in sets.items():
        entries = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"{path}: set {name!r} has no 'instances' list")
        insts = [parse_instance(e, name) for e in entries]
        if len(set(insts)) != len(insts):
            raise ValueError(f"{path}: set {name!r} lists an instance twice")
        out[str(name)] = insts
    return out


def schedule(sets: dict[str, list[Instance]], names: list[str], only: str | None) -> dict[Instance, list[str]]:
    """Each instance to solve (first appearance order) -> the chosen sets it belongs to; ``only`` filters on the
    "model | cluster" text."""
    plan: dict[Instance, list[str]] = {}
    for name in names:
        for inst in sets[name]:
            if only is None or only in f"{inst.model} | {inst.cluster}":
                plan.setdefault(inst, []).append(name)
    return plan


def code_version() -> str:
    """The short commit of ROOT, "+dirty" when tracked files differ from it; "unknown" without git."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", str(ROOT), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True, check=True,
                               timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def command(inst: Instance, limit: float, threads: int, doc: Path) -> list[str]:
    return [sys.executable, "-m", "haap_milp.cli", "solve", "-m", inst.model, "-c", inst.cluster,
            "--gbs", str(inst.gbs), "--seq", str(inst.seq), "--threads", str(threads),
            "--time-limit", str(limit), "--json", str(doc)]


def solve(inst: Instance, limit: float, threads: int, doc: Path) -> dict:
    """One fresh `haap-solve solve` process: status, gap_pct, iteration_time_s, wall_s (s, start to exit), proven."""
    head = {"model": inst.model, "cluster": inst.cluster, "gbs": inst.gbs, "seq": inst.seq}
    return timed_solve(command(inst, limit, threads, doc), doc, limit, GAP, head)


def set_summary(name: str, rows: list[dict], limit: float, repeats: int) -> list[str]:
    """Per repeat: "P of N proven within 1 % in <= LIMIT s (feasible: F)" (F: not reported INFEASIBLE; an ERROR or a
    hang counts as feasible and open), then the open instances with their status and gap."""
    out = [] if repeats == 1 else [f"{name}:"]
    for rep in range(repeats):
        mine = [r for r in rows if name in r["set"].split("+") and r["repeat"] == rep]
        feasible = [r for r in mine if r["proven"] != ""]
        count = (f"{sum(r['proven'] for r in feasible)} of {len(mine)} proven within {100 * GAP:g} % in <= "
                 f"{limit:g} s (feasible: {len(feasible)})")
        out.append(f"{name}: {count}" if repeats == 1 else f"  repeat {rep}: {count}")
        for r in feasible:
            if r["proven"] != 1:
                out.append(f"    open: {r['model']} | {r['cluster']} | {r['gbs']} | {r['seq']}  {r['status']} "
                           f"gap {r.get('gap_pct')} % wall {r['wall_s']:.2f} s")
    return out


def write_csv(path: Path, rows: list[dict]) -> None:
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=FIELDS)
    w.writeheader()
    w.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.getvalue(), flag="--out")  # (whole or not at all)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "benchmarks/specs/outside.yaml")
    ap.add_argument("--sets", nargs="+", default=None, metavar="NAME", help="sets to run (default: all, file order)")
    ap.add_argument("--limit", type=float, default=10.0, help="--time-limit of each solve, s (the bar is the same)")
    ap.add_argument("--threads", type=int, default=2, help="solver threads (issue 11's bar: 2)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="CSV, one row per solve (default: print only)")
    ap.add_argument("--only", default=None, metavar="SUBSTRING", help="run only instances whose 'model | cluster' "
                    "text contains it")
    a = ap.parse_args(argv)
    try:
        sets = load_sets(a.spec)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        ap.error(f"--spec {a.spec}: {exc}")
    names = list(dict.fromkeys(a.sets)) if a.sets else list(sets)
    unknown = [n for n in names if n not in sets]
    if unknown:
        ap.error(f"--sets: unknown {', '.join(unknown)} (known: {', '.join(sets)})")
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    plan = schedule(sets, names, a.only)
    code = code_version()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            for inst, member in plan.items():
                r = {"set": "+".join(member), "repeat": rep, **solve(inst, a.limit, a.threads, Path(tmp) / "plan.json"),
                     "code": code}
                rows.append(r)
                print(f"[{r['set']}] {inst.label()}  {r['status']} gap {r.get('gap_pct')}% "
                      f"T {r.get('iteration_time_s')} wall {r['wall_s']:.2f} s load {r['load1']}", flush=True)
    for name in names:
        for line in set_summary(name, rows, a.limit, a.repeats):
            print(line)
    if a.out is not None:
        write_csv(a.out, rows)
        print(f"wrote {a.out} (code {code})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
