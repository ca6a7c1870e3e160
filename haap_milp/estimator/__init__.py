"""The heterogeneity-aware cost model (docs/DESIGN.md, step 2): time and memory of any plan on any cluster.

Modules by concern: ``flops`` (FLOP counts and published closed forms), ``compute`` (GEMM / attention /
memory-bound time), ``comm`` (collectives on real links), ``hardware`` (node groups, links, stage
checks), ``memory`` (bytes per parameter, activations), ``impl`` (engine kernel choices), ``layers`` +
``costs`` (per-layer-kind costs), ``schedule`` (pipeline closed forms), ``whole`` (plan estimate),
``calibration`` (fitted parameters, ``calibration.json``), ``measured`` (published runs as specs, used
by benchmarks/calibrate.py), ``profiles`` + ``override`` (measured profiles), ``results`` (return
types), ``plan`` (the public ``Estimator``).
"""

from haap_milp.estimator.calibration import Calibration, GlobalParams, GpuParams, load_calibration
from haap_milp.estimator.cost_model import Estimator
from haap_milp.estimator.profile_format import load_profile, load_profiles
from haap_milp.estimator.profiles import DEFAULT_DEVICE_MAP, Profile, ProfileEntry, load_metis_dir
from haap_milp.estimator.results import ComputeBound, PlanEstimate, StageCost, StageEstimate

__all__ = [
    "DEFAULT_DEVICE_MAP",
    "Calibration",
    "ComputeBound",
    "Estimator",
    "GlobalParams",
    "GpuParams",
    "PlanEstimate",
    "Profile",
    "ProfileEntry",
    "StageCost",
    "StageEstimate",
    "load_calibration",
    "load_metis_dir",
    "load_profile",
    "load_profiles",
]
