"""The benchmark spec: a grid of models x clusters x methods x time limits (YAML, pydantic-validated).

A spec file looks like ``benchmarks/specs/quick.yaml``::

    name: quick
    methods: [cpsat, milp, dp, uniform]
    time_limits_s: [10]
    gbs: [512]                 # grid default(s); a model may override
    seq: [4096]
    models:
      - llama3-8b              # catalog name, HF config.json or model YAML
      - {name: llama3-70b, gbs: [1024]}
    clusters:
      - h100-80g:16            # catalog name, cluster YAML or shorthand
      - {label: mixed-nic-256, cluster: "h100-80g:128@ib,a100-80g:128@roce"}
      - {label: sailor, cluster: "a100-40g:32/4,v100-16g:96/4", precision: fp16,
         profile: [a100.json, profiles/OPT-350], profile_device: {A100: a100-40g}, profile_fallback: none}
    exclude:
      - {model: llama3-405b, cluster: h100-80g:16}

Every (model, cluster, gbs, seq) is one *task*: presolved once, then every method runs on it.
Heuristics (dp, uniform) run once per task; exact methods (cpsat, milp) once per time limit
(kinds from the method registry, ``haap_milp.methods``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from haap_milp.errors import HaapInputError
from haap_milp.methods import EXACT, LISTED
from haap_milp.specs import Target
from haap_milp.specs.solve import SOLVE_SPACE

Method = Literal[LISTED]  # the method registry (methods.py), less the test oracle
# run order inside a task: heuristics first (they warm-start the exact solvers), then the exact methods
METHOD_ORDER = tuple(m for m in LISTED if m not in EXACT) + EXACT


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _as_list(v):
    return [v] if isinstance(v, (int, float)) else v


class BenchModel(_Frozen):
    """One model of the grid; gbs/seq override the grid's when given."""

    name: str = Field(description="Catalog name, HF config.json or model YAML.", min_length=1)
    gbs: tuple[int, ...] | None = Field(default=None, description="Global batch sizes (sequences) for this model.")
    seq: tuple[int, ...] | None = Field(default=None, description="Sequence lengths (tokens) for this model.")

    @field_validator("gbs", "seq", mode="before")
    @classmethod
    def _scalar(cls, v):
        return _as_list(v)

    @field_validator("gbs", "seq")
    @classmethod
    def _positive(cls, v):
        if v is not None and (not v or any(x < 1 for x in v)):
            raise ValueError(f"must be a non-empty list of positive integers, got {list(v)}")
        return v


class BenchCluster(_Frozen):
    """One cluster of the grid: what to load and the label its rows carry."""

    cluster: str = Field(description="Catalog name, cluster YAML path or shorthand 'a100-80g:64,h100-80g:32'.",
                         min_length=1)
    label: str | None = Field(default=None, description="Name in results (default: the cluster string).")
    precision: Literal["bf16", "fp16", "fp8"] | None = Field(
        default=None, description="Overrides the grid precision (e.g. fp16 for V100 clusters).")
    network: str | None = Field(default=None, description="Measured network YAML (haap-solve network import) "
                                "merged into the cluster, as --network does.")
    profile: tuple[str, ...] | None = Field(default=None, description="Measured profile(s) (Metis directories or "
                                            "native profile files), as --profile does; one path or a list.")
    profile_device: dict[str, str] | None = Field(default=None, description="Metis device type -> catalog GPU, "
                                                  "as --profile-device A100=a100-80g does.")
    profile_fallback: Literal["none", "interpolate", "analytic"] | None = Field(
        default=None, description="Points the profile lacks, as --profile-fallback (default none).")

    @field_validator("label")
    @classmethod
    def _one_cell(cls, v):
        if v is not None and (any(not c.isprintable() for c in v) or "|" in v):
            raise ValueError(f"label {v!r} must be one line of printable characters without '|' (it is a cell of "
                             "summary.md's tables and a row of results.csv)")
        return v

    @field_validator("profile", mode="before")
    @classmethod
    def _one_profile(cls, v):
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _profile_flags(self) -> BenchCluster:
        if self.profile is not None and not self.profile:
            raise ValueError("profile must name at least one profile")
        if self.profile is None and (self.profile_device or self.profile_fallback):
            raise ValueError("profile_device and profile_fallback apply to a profile; give profile too")
        return self

    @property
    def name(self) -> str:
        return self.label or self.cluster


class Exclude(_Frozen):
    """Skip (model, cluster) pairs; an omitted side matches everything."""

    model: str | None = None
    cluster: str | None = None

    def matches(self, model: str, cluster: str) -> bool:
        return (self.model is None or self.model == model) and (self.cluster is None or self.cluster == cluster)


class BenchSpec(_Frozen):
    """The whole grid and how each run is solved."""

    name: str = Field(default="bench", description="Name of the sweep (shown in the summary).")
    description: str = Field(default="", description="Free text shown in the summary.")
    models: tuple[BenchModel, ...] = Field(description="Models (at least one).", min_length=1)
    clusters: tuple[BenchCluster, ...] = Field(description="Clusters (at least one).", min_length=1)
    methods: tuple[Method, ...] = Field(default=LISTED, min_length=1)
    time_limits_s: tuple[float, ...] = Field(default=(10.0,), description="Limits for the exact solvers, s.",
                                             min_length=1)
    gbs: tuple[int, ...] = Field(default=(512,), description="Global batch sizes (sequences).", min_length=1)
    seq: tuple[int, ...] = Field(default=(4096,), description="Sequence lengths (tokens).", min_length=1)
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    threads: int = Field(default=1, description="Solver threads per run (one worker process per core).", ge=1, le=64)
    relative_gap: float = Field(default=0.01, description="Exact solvers stop at this proven gap.", ge=0, le=1)
    target: Target = "any"
    seed: int = Field(default=0, ge=0)
    search: Literal["solve", "plain"] = Field(
        default="solve", description="solve: the space `haap-solve solve` searches with no --vpp/--cp/--zero (eqs. "
        "D1-D3: interleaving, cp and ZeRO where they pay); plain: vpp 1, cp 1 and the runtime's ZeRO stage (what the "
        "bench searched before 2026-12-03, and SolveOptions()'s default).")
    exclude: tuple[Exclude, ...] = Field(default=(), description="(model, cluster) pairs to skip.")

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data):
        """Accept bare strings for models/clusters and scalars for gbs/seq/time_limits_s."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("models"), list):
            data["models"] = [{"name": m} if isinstance(m, str) else m for m in data["models"]]
        if isinstance(data.get("clusters"), list):
            data["clusters"] = [{"cluster": c} if isinstance(c, str) else c for c in data["clusters"]]
        for key in ("gbs", "seq", "time_limits_s", "methods"):
            if isinstance(data.get(key), (int, float, str)):
                data[key] = [data[key]]
        return data

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        """The name becomes the default output folder ``bench-<name>``: a plain file name only."""
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", v):
            raise ValueError(f"name {v!r} must be 1-100 letters, digits, '.', '_' or '-' starting with a letter or "
                             "digit (it names the output folder bench-<name>)")
        return v

    @model_validator(mode="after")
    def _check(self) -> BenchSpec:
        for key in ("gbs", "seq"):
            if any(not 1 <= x <= 100_000_000 for x in getattr(self, key)):
                raise ValueError(f"{key} must be positive integers (at most 100000000), got {list(getattr(self, key))}")
        if any(not 0 < t <= 86_400 for t in self.time_limits_s):  # also refuses NaN and infinity
            raise ValueError(f"time_limits_s must be positive seconds (at most 86400), got {list(self.time_limits_s)}")
        models, clusters = [m.name for m in self.models], [c.name for c in self.clusters]
        for what, names in (("method", self.methods), ("time limit", self.time_limits_s), ("cluster label", clusters),
                            ("model", models), ("gbs", self.gbs), ("seq", self.seq)):  # (a repeat ran tasks twice)
            dup = sorted({str(x) for x in names if list(names).count(x) > 1})
            if dup:
                raise ValueError(f"duplicate {what}(s) {dup}")
        for e in self.exclude:  # (a misspelt exclusion skipped nothing without a word)
            for side, name, known in (("model", e.model, models), ("cluster", e.cluster, clusters)):
                if name is not None and name not in known:
                    raise ValueError(f"exclude {side} {name!r} is not one of the spec's {side}s ({', '.join(known)})")
        return self

    def tasks(self) -> list[TaskInputs]:
        """Every (model, cluster, gbs, seq) of the grid, in a stable order, exclusions removed."""
        out = []
        for m in self.models:
            for c in self.clusters:
                if any(e.matches(m.name, c.name) for e in self.exclude):
                    continue
                for gbs in m.gbs or self.gbs:
                    for seq in m.seq or self.seq:
                        out.append(TaskInputs(m.name, c.name, c.cluster, gbs, seq, c.precision or self.precision,
                                              c.network, c.profile, tuple(sorted((c.profile_device or {}).items())),
                                              c.profile_fallback))
        return out

    def runs(self) -> list[tuple[str, float | None]]:
        """(method, time limit) pairs of one task: heuristics once, exact methods per limit."""
        out: list[tuple[str, float | None]] = []
        for m in METHOD_ORDER:
            if m in self.methods:
                out += [(m, t) for t in self.time_limits_s] if m in EXACT else [(m, None)]
        return out

    def solve_options(self) -> dict:
        """SolveOptions fields shared by every run (the time limit is set per run)."""
        space = SOLVE_SPACE if self.search == "solve" else {}
        return {"threads": self.threads, "relative_gap": self.relative_gap, "target": self.target,
                "seed": self.seed, "warm_start": True, **space}


class TaskInputs(BaseModel):
    """What identifies one task (the part of a result row's key before method and time limit)."""

    model_config = ConfigDict(frozen=True)
    model: str
    cluster: str  # label
    cluster_ref: str  # what load_cluster is given
    gbs: int
    seq: int
    precision: str
    network: str | None = None  # measured network file merged into the cluster
    profile: tuple[str, ...] | None = None  # measured profiles (estimator.load_profiles)
    profile_device: tuple[tuple[str, str], ...] = ()
    profile_fallback: str | None = None

    def __init__(self, model, cluster, cluster_ref, gbs, seq, precision, network=None, profile=None,
                 profile_device=(), profile_fallback=None):
        super().__init__(model=model, cluster=cluster, cluster_ref=cluster_ref, gbs=gbs, seq=seq,
                         precision=precision, network=network, profile=profile, profile_device=profile_device,
                         profile_fallback=profile_fallback)


def load_spec(path: str | Path) -> BenchSpec:
    """Read and validate a spec file; any mistake is one HaapInputError paragraph."""
    from haap_milp.catalog.files import is_file, parse_text, read_text, suffix_format

    p = Path(path)
    if not is_file(p):
        raise HaapInputError(f"benchmark spec {str(p)!r} is not a file; give a YAML file such as "
                             "benchmarks/specs/quick.yaml", field="spec", value=str(p))
    data = parse_text(read_text(p, "benchmark spec"), str(p), suffix_format(str(p)))  # UTF-8, size, aliases, NaN bounded
    spec = parse_spec(data, source=str(p))
    check_spec_inputs(spec, str(p))
    return spec


def check_spec_inputs(spec: BenchSpec, source: str) -> None:
    """Every model and cluster of the grid loads (catalog name, file or shorthand; with its network file and
    profiles): a spec error exits 2 before any run, naming the spec key, instead of ERROR rows."""
    from haap_milp.catalog import load_cluster, load_model
    from haap_milp.estimator import load_profiles
    from haap_milp.network.merge import apply_network_option

    def cluster(c: BenchCluster):
        return apply_network_option(load_cluster(c.cluster), c.network, "network")

    checks = [(f"models.{i}", m.name, load_model, m.name) for i, m in enumerate(spec.models)]
    checks += [(f"clusters.{i}", c.cluster, cluster, c) for i, c in enumerate(spec.clusters)]
    for key, shown, load, arg in checks:
        try:
            load(arg)
        except HaapInputError as exc:
            raise HaapInputError(f"benchmark spec {source!r}: {key} = {shown!r}: {exc}", field=key,
                                 value=shown) from None
    for i, c in enumerate(spec.clusters):  # profiles load (and merge) before any run, as models do
        if c.profile:
            try:
                load_profiles(c.profile, c.profile_device, c.precision or spec.precision, c.profile_fallback or "none")
            except HaapInputError as exc:
                raise HaapInputError(f"benchmark spec {source!r}: clusters.{i}.profile = {list(c.profile)}: {exc}",
                                     field=f"clusters.{i}.profile", value=list(c.profile)) from None


def parse_spec(data: object, source: str = "spec") -> BenchSpec:
    """Validate a spec given as plain data (the parsed YAML)."""
    if not isinstance(data, dict):
        raise HaapInputError(f"benchmark spec {source!r} must be a mapping with models and clusters, "
                             f"got {type(data).__name__}", field="spec", value=source)
    try:
        return BenchSpec.model_validate(data)
    except ValidationError as exc:
        parts = []
        from haap_milp.catalog.files import short

        parents = {e["loc"][:i] for e in exc.errors() for i in range(1, len(e["loc"]))}
        relevant = [e for e in exc.errors(include_url=False) if e["loc"] not in parents]  # deeper errors say it better
        for err in relevant[:5]:
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            value = err.get("input")
            msg = str(err["msg"]).removeprefix("Value error, ")
            parts.append(f"{loc}: {msg} (got {short(value)})" if not isinstance(value, dict) else f"{loc}: {msg}")
        if len(relevant) > 5:
            parts.append(f"and {len(relevant) - 5} more")
        first = exc.errors()[0]["loc"] if exc.errors() else ()
        raise HaapInputError(f"benchmark spec {source!r} is invalid: " + "; ".join(parts) +
                             ". Allowed top-level keys: " + ", ".join(BenchSpec.model_fields) + ".",
                             field=".".join(str(x) for x in first)) from None


# The built-in grid (`haap-solve bench` without a file); benchmarks/specs/default.yaml is the same grid
# written out (a test keeps them equal). Models 1.3B-405B, dense and MoE; clusters of 1-3 GPU types,
# 16-4096 GPUs, one with two islands on different NICs (InfiniBand and RoCE).
DEFAULT_SPEC: dict = {
    "name": "default",
    "description": "Full grid: 7 models (1.3B-405B, dense and MoE) x 7 clusters (1-3 GPU types, 16-4096 GPUs, "
                   "one mixed-NIC two-island cluster) x cpsat, milp, dp, uniform x time limits 10 s and 30 s.",
    "methods": ["cpsat", "milp", "dp", "uniform"],
    "time_limits_s": [10, 30],
    "gbs": [512],
    "seq": [4096],
    "models": [
        {"name": "gpt3-1.3b", "gbs": [512]},
        {"name": "llama3-8b", "gbs": [512]},
        {"name": "gpt3-13b", "gbs": [1024]},
        {"name": "mixtral-8x7b", "gbs": [1024]},
        {"name": "llama3-70b", "gbs": [1024]},
        {"name": "qwen3-235b-a22b", "gbs": [2048]},
        {"name": "llama3-405b", "gbs": [2048]},
    ],
    "clusters": [
        {"label": "h100-16", "cluster": "h100-80g:16"},
        {"label": "h100+a100-64", "cluster": "h100-80g:32,a100-80g:32"},
        {"label": "a100-80g+40g-64", "cluster": "a100-80g:32,a100-40g:32"},
        {"label": "mixed-nic-256", "cluster": "h100-80g:128@ib,a100-80g:128@roce"},
        {"label": "3types-256", "cluster": "h100-80g:64,a100-80g:128,a100-40g:64"},
        {"label": "3types-1024", "cluster": "hetero3-1024"},
        {"label": "3types-4096", "cluster": "hetero3-4096"},
    ],
}


def default_spec() -> BenchSpec:
    """The built-in default grid."""
    return parse_spec(DEFAULT_SPEC, source="built-in default")
