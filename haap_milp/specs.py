"""The vocabulary of haap: what goes in (model, cluster, training) and what comes out (plans).

Every model here is a frozen pydantic v2 model with ``extra="forbid"``; units are in
field names. Bandwidths named ``*_gbps`` are **gigabytes** per second (GB/s, 1e9 bytes/s),
never gigabits: a 200 Gb/s HDR InfiniBand port is ``25`` here. Memory sizes named
``*_gib`` are binary (2**30 bytes); HBM capacities sold as "80 GB" are 80 GiB parts.

All validation of user input happens here (docs/DESIGN.md, step 1); nothing downstream
re-validates. Validators raise ``ValueError`` with the value quoted; the loaders turn
``pydantic.ValidationError`` into ``HaapInputError`` naming the field.
"""

from __future__ import annotations

import enum
import math
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_serializer, model_validator

from haap_milp.methods import SOLVER_NAMES
from haap_milp.network.spec import MeasuredNetwork
from haap_milp.pipeline import GIB  # noqa: F401  (re-exported for catalog/; its home is pipeline.py)
from haap_milp.targets import TARGET_NAMES

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
#: precisions whose activations, gradients and messages are 4-byte floats (fp32 storage; tf32 only changes the
#: GEMM units: NVIDIA A100 whitepaper, "TF32 ... with FP32 inputs and outputs")
FP32_PRECISIONS = ("fp32", "tf32")
Engine = Literal["megatron", "deepspeed", "fsdp"]
UniformDim = Literal["tp", "dp", "mbs", "recompute", "ep"]
Recompute = Literal["none", "selective", "full"]
Activation = Literal["gelu", "swiglu", "relu"]
Normalization = Literal["rmsnorm", "layernorm"]
PositionEmbedding = Literal["rope", "learned", "none"]
NicType = Literal["ib", "roce", "ethernet"]
MoeLayerPattern = Literal["all", "every_k", "first_k_dense"]
Schedule = Literal["1f1b", "interleaved", "gpipe"]
Target = Literal[TARGET_NAMES]  # the target registry (targets.py)
SolverName = Literal[SOLVER_NAMES]  # the method registry (methods.py)


class Frozen(BaseModel):
    """Base: immutable, hashable, rejects unknown keys."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_computed(cls, data: object) -> object:
        """Accept our own JSON back: derived (computed) fields are recomputed, not read."""
        if isinstance(data, dict) and cls.model_computed_fields:
            data = {k: v for k, v in data.items() if k not in cls.model_computed_fields}
        return data


# --------------------------------------------------------------------------- model


class ModelSpec(Frozen):
    """A decoder-only transformer, dense or Mixture-of-Experts."""

    name: str = Field(description="Display name, e.g. 'llama3-70b'.", min_length=1, max_length=200)
    num_layers: int = Field(description="Number of decoder layers.", ge=1, le=10_000)
    hidden: int = Field(description="Hidden size h (model dimension).", ge=1, le=1_000_000)
    ffn_hidden: int = Field(
        description="Dense MLP inner size (per layer, for dense layers).", ge=1, le=10_000_000
    )
    num_heads: int = Field(description="Attention (query) heads.", ge=1, le=100_000)
    num_kv_heads: int | None = Field(
        default=None,
        description="Key/value heads (GQA/MQA); None means equal to num_heads (MHA).",
        ge=1,
        le=100_000,
    )
    head_dim: int | None = Field(
        default=None, description="Per-head dimension; None means hidden // num_heads.", ge=1, le=100_000
    )
    vocab_size: int = Field(description="Vocabulary size V.", ge=1, le=100_000_000)
    seq_len: int = Field(default=2048, description="Default training sequence length (tokens).", ge=1, le=100_000_000)
    activation: Activation = Field(
        default="swiglu", description="MLP activation: swiglu (3 matrices) or gelu/relu (2 matrices)."
    )
    tied_embeddings: bool = Field(default=False, description="Input embedding and LM head share weights.")
    qkv_bias: bool = Field(default=False, description="Q/K/V projections carry a bias (Qwen2, GPT-2, OPT).")
    # --- architecture details the launch files need (not the cost model); None: the swiglu/llama-style default
    normalization: Normalization | None = Field(
        default=None, description="Norm layer; None means rmsnorm for swiglu models, layernorm otherwise."
    )
    norm_epsilon: float = Field(default=1e-5, description="Epsilon of the norm layers.", gt=0, le=1)
    position_embedding: PositionEmbedding | None = Field(
        default=None, description="Position embedding; None means rope for swiglu models, learned otherwise."
    )
    rope_base: float = Field(default=10000.0, description="RoPE base (theta), when position_embedding is rope.",
                             gt=0, le=1e12)
    linear_bias: bool | None = Field(
        default=None, description="Biases on the attention output and MLP linears; None means not swiglu."
    )
    qk_norm: bool = Field(default=False, description="RMS/LayerNorm on per-head queries and keys (Qwen3).")
    moe_aux_loss_coeff: float = Field(default=0.0, description="Router load-balancing loss coefficient.", ge=0)
    # --- Mixture of Experts (num_experts == 0 means dense)
    num_experts: int = Field(default=0, description="Routed experts per MoE layer; 0 for a dense model.", ge=0, le=100_000)
    top_k: int = Field(default=0, description="Routed experts activated per token.", ge=0, le=1024)
    moe_ffn_hidden: int | None = Field(
        default=None, description="Inner size of one routed expert; None means ffn_hidden.", ge=1, le=10_000_000
    )
    num_shared_experts: int = Field(default=0, description="Always-active shared experts per MoE layer.", ge=0, le=1024)
    shared_expert_ffn_hidden: int | None = Field(
        default=None, description="Inner size of one shared expert; None means moe_ffn_hidden.", ge=1, le=10_000_000
    )
    moe_layer_pattern: MoeLayerPattern = Field(
        default="all", description="Which decoder layers are MoE: all, every k-th, or all but the first k."
    )
    moe_layer_freq: int = Field(default=1, description="k for pattern every_k (layer i is MoE iff i % k == k-1).", ge=1)
    first_k_dense: int = Field(default=0, description="k for pattern first_k_dense.", ge=0)
    capacity_factor: float | None = Field(
        default=None, description="Expert capacity factor; None means dropless routing.", gt=0, le=64
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelSpec:
        if self.hidden % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} does not divide hidden={self.hidden}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_kv_heads={self.kv_heads} does not divide num_heads={self.num_heads}")
        if self.num_experts:
            if not 1 <= self.top_k <= self.num_experts:
                raise ValueError(f"top_k={self.top_k} must be between 1 and num_experts={self.num_experts}")
            if self.moe_layer_pattern == "first_k_dense" and self.first_k_dense >= self.num_layers:
                raise ValueError(f"first_k_dense={self.first_k_dense} leaves no MoE layer of {self.num_layers}")
        elif self.top_k or self.num_shared_experts:
            raise ValueError("top_k / num_shared_experts given for a dense model (num_experts=0)")
        return self

    # ---- derived shapes
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def norm(self) -> str:
        """rmsnorm | layernorm (``normalization``, defaulted from the activation)."""
        return self.normalization or ("rmsnorm" if self.activation == "swiglu" else "layernorm")

    @property
    def positions(self) -> str:
        """rope | learned | none (``position_embedding``, defaulted from the activation)."""
        return self.position_embedding or ("rope" if self.activation == "swiglu" else "learned")

    @property
    def bias_linear(self) -> bool:
        """Biases on the attention output and MLP linears (``linear_bias``, defaulted from the activation)."""
        return self.activation != "swiglu" if self.linear_bias is None else self.linear_bias

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden or self.ffn_hidden

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn_hidden or self.expert_ffn

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices in one MLP: 3 for SwiGLU (gate, up, down), 2 otherwise."""
        return 3 if self.activation == "swiglu" else 2

    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer ``i`` (0-based) is an MoE layer."""
        if not self.is_moe:
            return False
        if self.moe_layer_pattern == "every_k":
            return i % self.moe_layer_freq == self.moe_layer_freq - 1
        if self.moe_layer_pattern == "first_k_dense":
            return i >= self.first_k_dense
        return True

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    # ---- parameter counts (weights only; biases of norms counted, as HF does)
    @property
    def attention_params(self) -> int:
        h, q, kv = self.hidden, self.num_heads * self.dim_head, self.kv_heads * self.dim_head
        bias = (q + 2 * kv) if self.qkv_bias else 0
        return h * q + 2 * h * kv + q * h + bias

    @property
    def dense_mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden * self.ffn_hidden

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        return self.mlp_matrices * self.hidden * self.expert_ffn

    @property
    def shared_expert_params(self) -> int:
        return self.num_shared_experts * self.mlp_matrices * self.hidden * self.shared_ffn

    @property
    def router_params(self) -> int:
        return self.hidden * self.num_experts

    def layer_params(self, i: int, active: bool = False) -> int:
        """Parameters of decoder layer ``i``; ``active`` counts only top_k routed experts."""
        norms = 2 * self.hidden
        if not self.is_moe_layer(i):
            return self.attention_params + self.dense_mlp_params + norms
        experts = self.top_k if active else self.num_experts
        return (
            self.attention_params
            + experts * self.expert_params
            + self.shared_expert_params
            + self.router_params
            + norms
        )

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden

    @property
    def head_params(self) -> int:
        """Final norm + LM head (0 extra matrix when tied)."""
        return self.hidden + (0 if self.tied_embeddings else self.vocab_size * self.hidden)

    @computed_field(description="Total parameters (all experts).")  # type: ignore[prop-decorator]
    @cached_property
    def num_params_total(self) -> int:
        layers = sum(self.layer_params(i) for i in range(self.num_layers))
        return self.embedding_params + layers + self.head_params

    @computed_field(description="Parameters active per token (top_k experts).")  # type: ignore[prop-decorator]
    @cached_property
    def num_params_active(self) -> int:
        layers = sum(self.layer_params(i, active=True) for i in range(self.num_layers))
        return self.embedding_params + layers + self.head_params


# --------------------------------------------------------------------------- hardware


class GPUSpec(Frozen):
    """One accelerator type. Values from vendor datasheets (see catalog/gpus.yaml sources)."""

    name: str = Field(description="Canonical catalog name, e.g. 'a100-80g'.", min_length=1, max_length=100)
    vendor: str = Field(default="NVIDIA", description="Vendor name.")
    memory_gib: float = Field(description="Device memory in GiB.", gt=0, le=4096)
    bf16_tflops: float | None = Field(default=None, description="Dense BF16 peak, TFLOP/s (None: unsupported).", gt=0)
    fp16_tflops: float | None = Field(default=None, description="Dense FP16 peak, TFLOP/s (None: unsupported).", gt=0)
    fp8_tflops: float | None = Field(default=None, description="Dense FP8 peak, TFLOP/s (None: unsupported).", gt=0)
    fp32_tflops: float | None = Field(
        default=None, description="FP32 peak without tensor cores (CUDA cores), TFLOP/s (None: not stated).", gt=0)
    tf32_tflops: float | None = Field(
        default=None, description="Dense TF32 tensor-core peak, TFLOP/s (None: unsupported).", gt=0)
    hbm_bandwidth_gbps: float = Field(description="HBM bandwidth, GB/s.", gt=0)
    intra_node_bandwidth_gbps: float = Field(
        description="Intra-node link bandwidth per GPU per direction, GB/s (NVLink/PCIe).", gt=0
    )
    source: str = Field(default="", description="Where the numbers were read.")

    def peak_tflops(self, precision: Precision) -> float | None:
        """Dense peak for ``precision``; None where the GPU lacks it."""
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp8": self.fp8_tflops,
                "fp32": self.fp32_tflops, "tf32": self.tf32_tflops}[precision]

    @model_serializer(mode="wrap")
    def _omit_unknown_fp32(self, handler):  # GPUs without fp32/tf32 figures serialise as before
        data = handler(self)
        if isinstance(data, dict):
            for k in ("fp32_tflops", "tf32_tflops"):
                if data.get(k, 0) is None:
                    data.pop(k)
        return data


class NodeGroup(Frozen):
    """A set of identical nodes sharing a GPU type, NIC and island."""

    gpu: GPUSpec = Field(description="GPU type of every GPU in these nodes.")
    num_nodes: int = Field(description="Number of nodes.", ge=1, le=100_000)
    gpus_per_node: int = Field(default=8, description="GPUs per node.", ge=1, le=64)
    nic: NicType = Field(default="ib", description="Inter-node network: ib, roce or ethernet.")
    nic_bandwidth_gbps: float = Field(
        description="Inter-node bandwidth per node (all NICs together, one direction), GB/s.", gt=0, le=100_000
    )
    nic_latency_us: float = Field(default=5.0, description="Inter-node one-way latency, microseconds.", ge=0, le=1e6)
    island: str = Field(
        default="main", description="Network island: nodes of one island share a fabric.", min_length=1, max_length=100
    )

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


class IslandLink(Frozen):
    """The link joining two islands (both directions)."""

    a: str = Field(description="One island.")
    b: str = Field(description="The other island.")
    bandwidth_gbps: float = Field(description="Aggregate bandwidth between the islands, GB/s.", gt=0, le=100_000)
    latency_us: float = Field(default=50.0, description="One-way latency, microseconds.", ge=0, le=1e7)


class ClusterSpec(Frozen):
    """Node groups, possibly of several GPU types and islands, and the links between islands."""

    name: str = Field(description="Display name.", min_length=1, max_length=200)
    node_groups: tuple[NodeGroup, ...] = Field(description="Node groups (at least one).", min_length=1)
    island_links: tuple[IslandLink, ...] = Field(default=(), description="Links between islands.")
    network: MeasuredNetwork | None = Field(
        default=None, description="Measured links (haap_milp/network); None: datasheet bandwidths x efficiencies.")

    @model_serializer(mode="wrap")
    def _omit_no_network(self, handler):  # output without a measured network stays as it was
        data = handler(self)
        if self.network is None and isinstance(data, dict):
            data.pop("network", None)
        return data

    @model_validator(mode="after")
    def _check_islands(self) -> ClusterSpec:
        islands = self.islands
        for link in self.island_links:
            for end in (link.a, link.b):
                if end not in islands:
                    raise ValueError(f"island link names island {end!r}, which has no nodes (islands: {islands})")
            if link.a == link.b:
                raise ValueError(f"island link joins island {link.a!r} to itself")
        for i, a in enumerate(islands):
            for b in islands[i + 1 :]:
                if self.island_link(a, b) is None:
                    raise ValueError(f"islands {a!r} and {b!r} have no link between them; add one to island_links")
        return self

    @property
    def islands(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.island for g in self.node_groups))

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.gpu.name for g in self.node_groups))

    def gpu(self, name: str) -> GPUSpec:
        return next(g.gpu for g in self.node_groups if g.gpu.name == name)

    def island_link(self, a: str, b: str) -> IslandLink | None:
        return next((lk for lk in self.island_links if {lk.a, lk.b} == {a, b}), None)

    @computed_field(description="Total GPUs.")  # type: ignore[prop-decorator]
    @property
    def total_gpus(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)

    @computed_field(description="GPUs per GPU type.")  # type: ignore[prop-decorator]
    @property
    def gpus_per_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.node_groups:
            out[g.gpu.name] = out.get(g.gpu.name, 0) + g.num_gpus
        return out

    @computed_field(description="GPUs per island.")  # type: ignore[prop-decorator]
    @property
    def gpus_per_island(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.node_groups:
            out[g.island] = out.get(g.island, 0) + g.num_gpus
        return out


# --------------------------------------------------------------------------- training


class TrainingSpec(Frozen):
    """What is trained and how: batch, sequence, precision, optimizer memory."""

    global_batch_size: int = Field(default=512, description="Global batch, in sequences.", ge=1, le=100_000_000)
    seq_len: int = Field(default=4096, description="Sequence length, tokens.", ge=1, le=100_000_000)
    precision: Precision = Field(default="bf16", description="Compute precision of the GEMMs.")
    optimizer_state_bytes_per_param: float = Field(
        default=12.0,
        description="Optimizer bytes per parameter: Adam keeps fp32 master weights, m and v = 12 "
        "(Megatron docs/user-guide/features/dist_optimizer.md).",
        ge=0,
        le=64,
    )
    distributed_optimizer: bool = Field(
        default=True, description="Shard optimizer state (and fp32 grads) over data-parallel ranks (ZeRO-1)."
    )
    sequence_parallel: bool = Field(default=True, description="Megatron sequence parallelism when tp > 1.")
    memory_headroom_fraction: float = Field(
        default=0.05, description="Fraction of each GPU's memory kept free (fragmentation, spikes).", ge=0, lt=1
    )
    # --- the training runtime (README "Training runtime"; estimator/runtime.py resolves presets and overrides)
    engine: Engine = Field(
        default="megatron", description="Training runtime whose overlap and memory accounting to model: megatron | "
        "deepspeed | fsdp (presets in estimator/runtime.py).")
    zero_stage: Literal[0, 1, 2, 3] | None = Field(
        default=None, description="ZeRO stage: 0 plain data parallel, 1 sharded optimizer state, 2 + sharded "
        "gradients, 3 + sharded weights; None: 1 with distributed_optimizer, else 0 (fsdp: 3).")
    grad_reduce_overlap: bool | None = Field(
        default=None, description="Gradient reduction overlapped with the backward pass; None: the engine's preset.")
    param_gather_overlap: bool | None = Field(
        default=None, description="Parameter all-gather overlapped with compute; None: the engine's preset.")
    grad_bucket_bytes: float | None = Field(
        default=None, description="Gradient bucket size, bytes; None: the engine's preset.", gt=0, le=1e12)
    recompute_modes: tuple[Recompute, ...] = Field(
        default=("none", "selective", "full"), description="Recomputation modes the runtime allows.", min_length=1)
    micro_batch_size: int | None = Field(
        default=None, description="Fixed per-replica micro-batch, sequences; None: the planner chooses.", ge=1,
        le=1_000_000)
    uniform: tuple[UniformDim, ...] = Field(
        default=(), description="Dimensions that must be equal in every stage: tp, dp, mbs, recompute.")

    @model_serializer(mode="wrap")
    def _omit_runtime_defaults(self, handler):  # a spec without runtime settings serialises as before
        data = handler(self)
        if isinstance(data, dict):
            for k in _RUNTIME_FIELDS:
                if k in data and getattr(self, k) == TrainingSpec.model_fields[k].default:
                    data.pop(k)
        return data


_RUNTIME_FIELDS = ("engine", "zero_stage", "grad_reduce_overlap", "param_gather_overlap", "grad_bucket_bytes",
                   "recompute_modes", "micro_batch_size", "uniform")


# --------------------------------------------------------------------------- output vocabulary


class Status(str, enum.Enum):
    """Outcome of a solve."""

    OPTIMAL = "OPTIMAL"  # proven optimal within the requested relative gap
    FEASIBLE = "FEASIBLE"  # a plan, optimality not proven (gap stated)
    INFEASIBLE = "INFEASIBLE"  # proven: no plan fits (reason stated)
    NO_SOLUTION = "NO_SOLUTION"  # time ran out before any plan was found
    ERROR = "ERROR"  # the solver failed


class StagePlan(Frozen):
    """One pipeline stage: a contiguous layer range on one device group."""

    first_layer: int = Field(description="First decoder layer (0-based) of this stage.", ge=0)
    num_layers: int = Field(description="Decoder layers in this stage (the first stage also holds the "
                            "embedding, the last the final norm + LM head).", ge=0)
    gpu_type: str = Field(description="Catalog name of the GPU type.")
    island: str = Field(default="main", description="Island its GPUs sit on.")
    tp: int = Field(default=1, description="Tensor-parallel degree (inside one node).", ge=1)
    dp: int = Field(default=1, description="Data-parallel replicas of this stage.", ge=1)
    ep: int = Field(default=1, description="Expert-parallel degree for MoE layers.", ge=1)
    etp: int = Field(default=1, description="Expert tensor-parallel degree.", ge=1)
    recompute: Recompute = Field(default="none", description="Activation recomputation.")
    time_s: float | None = Field(default=None, description="Predicted fwd+bwd time of one micro-batch, s.")
    memory_gib: float | None = Field(default=None, description="Predicted peak memory per GPU, GiB.")

    @computed_field(description="GPUs used: tp * dp (* cp of the plan).")  # type: ignore[prop-decorator]
    @property
    def num_gpus(self) -> int:
        return self.tp * self.dp

    @property
    def last_layer(self) -> int:
        """One past the last layer (exclusive end)."""
        return self.first_layer + self.num_layers


class Plan(Frozen):
    """A full training plan: stages in pipeline order, batch split and schedule.

    Micro-batch convention (FlagScale heterogeneous meshes): every stage sees the same
    ``samples_per_microbatch`` per micro-batch; stage j splits them over its ``dp`` replicas,
    so its per-replica micro-batch is ``samples_per_microbatch / dp_j``.
    ``micro_batch_size`` is the per-replica size of the first stage (Megatron's meaning
    when dp is uniform).
    """

    model: str = Field(description="Model name (display).")
    cluster: str = Field(default="", description="Cluster name (display).")
    stages: tuple[StagePlan, ...] = Field(description="Stages in pipeline order.", min_length=1)
    micro_batch_size: int = Field(description="Per-replica micro-batch of the first stage, sequences.", ge=1)
    num_microbatches: int = Field(description="Micro-batches per iteration (gradient accumulation).", ge=1)
    global_batch_size: int = Field(description="Sequences per iteration.", ge=1)
    seq_len: int = Field(description="Tokens per sequence.", ge=1)
    precision: Precision = Field(default="bf16", description="Compute precision.")
    schedule: Schedule = Field(default="1f1b", description="Pipeline schedule.")
    vpp: int = Field(default=1, description="Virtual pipeline stages per stage (interleaved 1F1B).", ge=1)
    cp: int = Field(default=1, description="Context-parallel degree (same for all stages).", ge=1)
    sequence_parallel: bool = Field(default=True, description="Sequence parallelism where tp > 1.")
    distributed_optimizer: bool = Field(default=True, description="Optimizer state sharded over dp.")

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def samples_per_microbatch(self) -> int:
        return self.micro_batch_size * self.stages[0].dp

    @property
    def num_gpus(self) -> int:
        return sum(s.num_gpus for s in self.stages) * self.cp

    def stage_micro_batch(self, j: int) -> float:
        """Per-replica micro-batch of stage j (sequences)."""
        return self.samples_per_microbatch / self.stages[j].dp

    @property
    def is_uniform(self) -> bool:
        """Same tp, dp, recompute, ep and etp on every stage (what Megatron-LM/torchtitan can run)."""
        first = self.stages[0]
        key = (first.tp, first.dp, first.recompute, first.ep, first.etp)
        return all((s.tp, s.dp, s.recompute, s.ep, s.etp) == key for s in self.stages)


class SolveOptions(Frozen):
    """How to search."""

    solver: SolverName = Field(default="auto", description="auto picks cpsat.")
    time_limit_s: float = Field(default=60.0, description="Wall-clock limit, s: the exact solver's budget; the CLI bounds the whole command with it (deadline.py).", gt=0, le=86_400)
    threads: int = Field(default=2, description="Solver worker threads.", ge=1, le=256)
    seed: int = Field(default=0, description="Random seed (determinism).", ge=0)
    relative_gap: float = Field(default=0.01, description="Stop when (objective - bound)/objective <= this.", ge=0, le=1)
    target: Target = Field(default="any", description="Restrict to plans this engine can run.")
    warm_start: bool = Field(default=True, description="Seed exact solvers with the DP plan.")
    max_stages: int | None = Field(default=None, description="Upper limit on pipeline stages (None: presolve bound).", ge=1)
    micro_batch_sizes: tuple[int, ...] | None = Field(
        default=None, description="Samples per micro-batch to consider (None: presolve picks).")
    recompute: tuple[Recompute, ...] = Field(
        default=("none", "selective", "full"), description="Recompute modes the search may use.")


class SolveResult(Frozen):
    """What a solver returns; the plan is decoded and scored by the planner."""

    status: Status
    solver: str
    objective_s: float | None = Field(default=None, description="Predicted iteration time of the plan, s.")
    bound_s: float | None = Field(default=None, description="Proven lower bound on the iteration time, s.")
    gap: float | None = Field(default=None, description="(objective - bound) / objective.")
    wall_time_s: float = Field(default=0.0, description="Solver wall time, s.")
    plan: Plan | None = None
    message: str = Field(default="", description="Why (infeasible reason, time limit, error).")
    stats: dict[str, float | int | str] = Field(default_factory=dict, description="Solver/presolve statistics.")

    @property
    def iteration_time_s(self) -> float | None:
        """The predicted iteration time of the plan, s: the name ``solve --json`` uses (= ``objective_s``)."""
        return self.objective_s


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """(objective - bound) / objective, clipped at 0; None when either is unknown."""
    if objective is None or bound is None or objective <= 0 or not math.isfinite(objective):
        return None
    return max(0.0, (objective - bound) / objective)
