"""Batch benchmarks (``haap-solve bench``): the public entry points of bench.spec / bench.run / bench.report.

    from haap_milp.bench import load_spec, run_bench
    run_bench(load_spec("benchmarks/specs/quick.yaml"), Path("out"), workers=2)
"""

from haap_milp.bench.report import GAP_DEFINITIONS, summarize, write_report
from haap_milp.bench.run import COLUMNS, BenchRun, Task, read_rows, run_bench, run_task
from haap_milp.bench.spec import BenchSpec, default_spec, load_spec, parse_spec

__all__ = ["COLUMNS", "GAP_DEFINITIONS", "BenchRun", "BenchSpec", "Task", "default_spec", "load_spec", "parse_spec",
           "read_rows", "run_bench", "run_task", "summarize", "write_report"]
