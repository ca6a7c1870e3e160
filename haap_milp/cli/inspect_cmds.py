"""Inspection commands: `catalog`, `show`, `schema`, `validate` (parsing and printing only)."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from haap_milp.catalog import data as cat
from haap_milp.catalog.cluster_file import cluster_file_schema, preset_cluster
from haap_milp.catalog.detect import load_file, resolve_any
from haap_milp.catalog.prices import prices_schema
from haap_milp.catalog.summary import cluster_summary, gpu_summary, model_summary
from haap_milp.cli.common import console, print_json
from haap_milp.cli.typer_app import app
from haap_milp.errors import HaapInputError
from haap_milp.estimator.profile_format import profile_schema
from haap_milp.network.spec import MeasuredNetwork
from haap_milp.specs import GPUSpec, ModelSpec, Plan, SolveOptions, SolveResult, TrainingSpec

PIPED_WIDTH = 140
JSON_HELP = "Print JSON (stable keys) instead of tables."
CATALOG_KINDS = {"models": "models", "model": "models", "gpus": "gpus", "gpu": "gpus", "clusters": "clusters",
                 "cluster": "clusters", "all": "all"}


def _b(n: float) -> str:
    """Parameters in billions, 2 decimals ('70.55B')."""
    return f"{n / 1e9:,.2f}B"


def _opt(x: float | None, fmt: str = "{:g}") -> str:
    return "-" if x is None else fmt.format(x)


def _out() -> Console:
    """The terminal console, or a 140-column one when piped (rich assumes 80 and folds the tables)."""
    return console if console.is_terminal else Console(file=sys.stdout, width=PIPED_WIDTH)


def _kv_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in rows:
        table.add_row(key, str(value))
    return table


# ----------------------------------------------------------------------------- catalog


def _compact(title: str, columns: tuple[str, ...]) -> Table:
    """A borderless table that fits 80 columns (the width rich assumes when output is piped)."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
    for col in columns:
        table.add_column(col, no_wrap=col == "name", overflow="fold")
    return table


def _models_table() -> Table:
    table = _compact("Models (haap-solve show NAME for details)",
                     ("name", "params (active)", "L", "hidden", "heads/kv", "ffn", "vocab", "MoE", "seq"))
    for name, entry in cat.catalog().models.items():
        m = entry.spec
        params = f"{_b(m.num_params_total)} ({m.num_params_active / 1e9:,.1f})" if m.is_moe else \
            _b(m.num_params_total)
        table.add_row(name, params, str(m.num_layers), str(m.hidden), f"{m.num_heads}/{m.kv_heads}",
                      str(m.expert_ffn if m.is_moe else m.ffn_hidden), str(m.vocab_size),
                      f"{m.num_experts}x top{m.top_k}" if m.is_moe else "", str(m.seq_len))
    return table


def _gpus_table() -> Table:
    table = _compact("GPUs (dense peak TF/s; GB/s per direction; default node: GPUs, NIC GB/s)",
                     ("name", "GiB", "bf16", "fp16", "fp8", "HBM", "intra", "default node"))
    for name, entry in cat.catalog().gpus.items():
        g, node = entry.spec, entry.default_node
        table.add_row(name, f"{g.memory_gib:g}", _opt(g.bf16_tflops), _opt(g.fp16_tflops),
                      _opt(g.fp8_tflops), f"{g.hbm_bandwidth_gbps:g}", f"{g.intra_node_bandwidth_gbps:g}",
                      f"{node.gpus_per_node}, {node.nic} {node.nic_bandwidth_gbps:g}")
    return table


def _clusters_table() -> Table:
    table = _compact("Clusters (or a shorthand such as 'a100-80g:64,h100-80g:32/8@roce')",
                     ("name", "GPUs", "per type", "islands"))
    for name in cat.cluster_names():
        c = preset_cluster(name)
        per_type = " + ".join(f"{n} {t}" for t, n in c.gpus_per_type.items())
        islands = ", ".join(f"{i} ({n})" for i, n in c.gpus_per_island.items())
        table.add_row(name, str(c.total_gpus), per_type, islands)
    return table


def _catalog_json(kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if kind in ("models", "all"):
        out["models"] = [{"name": n, "aliases": list(e.aliases), "source": e.source,
                          "num_params_total": e.spec.num_params_total, "num_params_active": e.spec.num_params_active,
                          "spec": e.spec.model_dump(mode="json")} for n, e in cat.catalog().models.items()]
    if kind in ("gpus", "all"):
        out["gpus"] = [gpu_summary(e.spec) for e in cat.catalog().gpus.values()]
    if kind in ("clusters", "all"):
        out["clusters"] = [{k: v for k, v in cluster_summary(preset_cluster(n)).items() if k != "spec"}
                           for n in cat.cluster_names()]
    return out


@app.command("catalog")
def catalog_cmd(
    what: str = typer.Argument("all", help="models | gpus | clusters (default: all three)."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """List the built-in models, GPUs and clusters."""
    kind = CATALOG_KINDS.get(what.strip().lower())
    if kind is None:
        raise HaapInputError(f"unknown catalog {what!r}; use one of: models, gpus, clusters (or nothing for all).",
                             field="what", value=what)
    if json_out:
        print_json(_catalog_json(kind))
        return
    for name, render in (("models", _models_table), ("gpus", _gpus_table), ("clusters", _clusters_table)):
        if kind in (name, "all"):
            _out().print(render())


# ----------------------------------------------------------------------------- show


def _print_model(s: dict[str, Any]) -> None:
    rows: list[tuple[str, Any]] = [("parameters (total)", _b(s["num_params_total"])),
                                   ("parameters (active per token)", _b(s["num_params_active"])),
                                   ("weights at bf16", f"{s['weight_memory_bf16_gib']:,.1f} GiB"),
                                   ("weights+grads+Adam (18 B/param)", f"{s['training_state_memory_gib']:,.1f} GiB")]
    rows += list(s["shapes"].items()) + list((s["moe"] or {}).items())
    rows += [(f"params: {k}", f"{v:,}") for k, v in s["params_breakdown"].items()]
    rows += [(k, s[k]) for k in ("source", "notes") if s[k]]
    _out().print(_kv_table(f"Model {s['name']}", rows))


def _print_cluster(s: dict[str, Any]) -> None:
    head = f"Cluster {s['name']}: {s['total_gpus']} GPUs, {s['total_memory_gib']:,.0f} GiB, " \
           f"{s['peak_bf16_pflops']:,.1f} PF/s bf16 peak"
    out = _out()
    out.print(head + (f"\n{s['description']}" if s["description"] else ""), highlight=False)
    types = Table(title="Per GPU type", title_justify="left")
    for col in ("gpu", "GPUs", "GiB each", "bf16 TF/s each", "PF/s bf16"):
        types.add_column(col)
    for t in s["types"]:
        types.add_row(t["gpu"], str(t["num_gpus"]), f"{t['memory_gib']:g}", _opt(t["bf16_tflops"]),
                      _opt(t["peak_bf16_pflops"], "{:.1f}"))
    islands = Table(title="Per island", title_justify="left")
    for col in ("island", "GPUs", "per type", "NIC"):
        islands.add_column(col)
    for i in s["islands"]:
        islands.add_row(i["island"], str(i["num_gpus"]), ", ".join(f"{n} {t}" for t, n in i["gpus_per_type"].items()),
                        ", ".join(i["nics"]))
    groups = Table(title="Node groups", title_justify="left")
    for col in ("gpu", "nodes", "GPUs/node", "NIC", "NIC GB/s per node", "island"):
        groups.add_column(col)
    for g in s["node_groups"]:
        groups.add_row(g["gpu"], str(g["num_nodes"]), str(g["gpus_per_node"]), g["nic"],
                       f"{g['nic_bandwidth_gbps']:g}", g["island"])
    out.print(types, islands, groups)
    if s["island_links"]:
        links = Table(title="Island links", title_justify="left")
        for col in ("a", "b", "GB/s", "latency us"):
            links.add_column(col)
        for lk in s["island_links"]:
            links.add_row(lk["a"], lk["b"], f"{lk['bandwidth_gbps']:g}", f"{lk['latency_us']:g}")
        out.print(links)


def _print_gpu(s: dict[str, Any]) -> None:
    rows = [(k, "-" if v is None else v) for k, v in s["spec"].items() if k not in ("name", "source")]
    if "default_node" in s:
        node = s["default_node"]
        text = f"{node['gpus_per_node']} GPUs, {node['nic']} {node['nic_bandwidth_gbps']:g} GB/s ({node['rationale']})"
        rows.append(("default node", text))
        rows += [(k, s[k]) for k in ("aliases", "confidence", "notes") if s.get(k)]
    rows.append(("source", s["spec"]["source"]))
    _out().print(_kv_table(f"GPU {s['name']}", rows))


def _summary(kind: str, obj: Any) -> dict[str, Any]:
    if kind == "model":
        return model_summary(obj)
    if kind == "cluster":
        return cluster_summary(obj)
    if kind == "gpu":
        return gpu_summary(obj)
    if kind == "prices":  # (a PriceBook: the file's rows over the catalog's)
        rows = {g: {k: v for k, v in vars(r).items() if v is not None} for g, r in sorted(obj.gpus.items())}
        return {"kind": kind, "spec": {"price": obj.kind, "source": obj.source, "gpus": rows,
                                       "default_idle_fraction": obj.default_idle_fraction}}
    if kind == "profile":  # (measured points keyed by GPU, tp, micro-batch)
        return {"kind": kind, "spec": {"source": obj.source, "points": len(obj.entries),
                                       "gpus": sorted({k[0] for k in obj.entries}), "seq_len": obj.seq_len}}
    return {"kind": kind, "spec": obj.model_dump(mode="json")}


@app.command("show")
def show_cmd(
    name: str = typer.Argument(..., help="A model, cluster or GPU: catalog name, file path, or cluster shorthand."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Show a model (parameters, shapes, weight memory), a cluster (GPU totals per type and island) or a GPU."""
    kind, obj = resolve_any(name)
    summary = _summary(kind, obj)
    if json_out:
        print_json(summary)
    elif kind == "model":
        _print_model(summary)
    elif kind == "cluster":
        _print_cluster(summary)
    elif kind == "gpu":
        _print_gpu(summary)
    else:
        console.print_json(data=summary["spec"])


# ----------------------------------------------------------------------------- schema / validate

SCHEMAS = {"model": ModelSpec.model_json_schema, "cluster": cluster_file_schema, "gpu": GPUSpec.model_json_schema,
           "training": TrainingSpec.model_json_schema, "plan": Plan.model_json_schema,
           "result": SolveResult.model_json_schema, "options": SolveOptions.model_json_schema,
           "network": MeasuredNetwork.model_json_schema, "profile": profile_schema, "prices": prices_schema}


@app.command("schema")
def schema_cmd(
    kind: str = typer.Argument(
        "all", help="model | cluster | gpu | training | plan | result | options | network | profile | all."
    ),
    json_out: bool = typer.Option(False, "--json", help="Accepted for symmetry; the schema is always JSON."),
) -> None:
    """JSON Schema of an input file (model, cluster, training) or an output (plan, result)."""
    key = kind.strip().lower()
    if key == "all":
        print_json({k: make() for k, make in SCHEMAS.items()})
        return
    if key not in SCHEMAS:
        raise HaapInputError(f"unknown schema {kind!r}; use one of: {', '.join(SCHEMAS)}, all.", field="kind",
                             value=kind)
    schema = SCHEMAS[key]()
    if key == "model":
        schema["properties"]["base"] = {"type": "string", "description": "Catalog model whose fields this file "
                                        "overrides (only in model files)."}
        schema["properties"]["source"] = {"type": "string", "description": "Where the shapes come from (ignored)."}
        schema["required"] = [k for k in schema["required"] if k != "name"]  # files default it to the file name
    print_json(schema)


@app.command("validate")
def validate_cmd(
    file: str = typer.Argument(..., help="A model YAML / HF config.json, cluster YAML, training YAML, plan or "
                                         "result JSON, network, profile or prices file."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Check an input or output file; report what it is (exit 2 with one paragraph when it is wrong)."""
    kind, obj = load_file(file)
    checked = _check_plan_file(file) if kind == "plan" or (kind == "result" and obj.plan is not None) else None
    summary = _summary(kind, obj)
    if json_out:
        print_json({"ok": True, "file": file, "kind": kind, "summary": summary})
        return
    detail = ""
    if kind == "model":
        detail = f" {obj.name}: {_b(obj.num_params_total)} parameters ({_b(obj.num_params_active)} active)"
    elif kind == "cluster":
        detail = f" {obj.name}: {obj.total_gpus} GPUs " + \
            ", ".join(f"{n} {t}" for t, n in obj.gpus_per_type.items())
    elif kind == "plan":
        detail = f" for {obj.model}: {obj.pp} stages, {obj.num_gpus} GPUs"
    elif kind == "result":
        detail = f": {obj.status.value} from {obj.solver}"
    elif kind == "network":
        detail = f": {len(obj.links)} measured link(s)"
    elif kind == "profile":
        detail = f": {summary['spec']['points']} measured point(s) on {', '.join(summary['spec']['gpus']) or 'no GPU'}"
    elif kind == "prices":
        kind, detail = "prices file", f": {summary['spec']['source']}"
    if checked:
        detail += f"; checked against {checked}"
    console.print(f"OK: {file} is a valid {kind}{detail}.", highlight=False, markup=False, soft_wrap=True)


def _check_plan_file(file: str) -> str | None:
    """Run the checker's rules on a plan (or a result's plan) when the file names or holds its model and
    cluster; a broken rule, or a file estimate/simulate/emit would refuse (a model mismatch, a bad embedded
    training), exits 2. Returns 'model X and cluster Y' when checked, None when it cannot be."""
    from haap_milp.cli.common import enforce_plan
    from haap_milp.planfile import read_plan_file

    pf = read_plan_file(file)
    if pf.model is None or pf.cluster is None:
        return None
    training = pf.training or TrainingSpec(global_batch_size=pf.plan.global_batch_size, seq_len=pf.plan.seq_len,
                                           precision=pf.plan.precision)
    enforce_plan(pf.plan, pf.model, pf.cluster, training, what=f"plan in {file!r}")
    return f"model {pf.model.name} and cluster {pf.cluster.name}"
