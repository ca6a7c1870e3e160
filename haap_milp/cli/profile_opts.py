"""The profile flags shared by solve, compare, estimate and simulate: --profile, --profile-device,
--profile-fallback (parsing only; loading and merging are ``estimator.load_profiles``, the coverage rule
``estimator.override``)."""

from __future__ import annotations

from typing import Annotated

import typer

from haap_milp.cli.common import err_console
from haap_milp.errors import HaapInputError

ProfileOpt = Annotated[list[str], typer.Option(
    "--profile", metavar="PATH", help="Measured profile: a Metis profile directory or a native profile file (haap-solve profile). "
                      "Repeat it for several (e.g. one per GPU type); they are merged. GPU types it does not "
                      "mention stay analytic (the report says so).")]
ProfileDeviceOpt = Annotated[list[str], typer.Option(
    "--profile-device", metavar="NAME=GPU", help="Map a Metis device type to a catalog GPU, e.g. A100=a100-80g (repeatable).")]
ProfileFallbackOpt = Annotated[str | None, typer.Option(
    "--profile-fallback", metavar="POLICY", help="Points (GPU type, tp, micro-batch) of a profiled GPU type that the profile lacks: "
                               "none (default; they leave the search and the report lists them) | interpolate "
                               "(also price those between two measured micro-batches, linearly) | analytic (price "
                               "them with the analytic model, with a warning naming them). Out-of-memory points "
                               "are never priced.")]


def profile_from_flags(paths: list[str] | None, devices: list[str] | None, fallback: str | None,
                       precision: str | None):
    """The merged ``Profile`` of the flags (None without --profile); a mistake is one paragraph naming the flag."""
    from haap_milp.estimator import load_profiles
    from haap_milp.estimator.override import check_fallback

    paths, devices = list(paths or []), list(devices or [])
    if fallback is not None:
        check_fallback(fallback)
    if not paths:
        for flag, given in (("--profile-device", devices[0] if devices else None), ("--profile-fallback", fallback)):
            if given is not None:
                raise HaapInputError(f"{flag} {given!r} applies to a measured profile; give --profile (a Metis "
                                     "profile directory or a native profile file) too.",
                                     field=flag.lstrip("-").replace("-", "_"), value=given)
        return None
    mapping = {}
    for item in devices:
        name, sep, gpu = item.partition("=")
        if not sep or not name.strip() or not gpu.strip():
            raise HaapInputError(f"--profile-device {item!r} must look like A100=a100-80g.", field="profile_device",
                                 value=item)
        mapping[name.strip()] = gpu.strip()
    return load_profiles(paths, mapping, precision, fallback or "none")


def warn_priced_by_fallback(lines: list[str]) -> None:
    """One stderr warning naming the points a profile lacks that were priced anyway (--profile-fallback)."""
    if lines:
        err_console.print("warning: priced without a measurement (--profile-fallback): " + "; ".join(lines) + ".",
                          markup=False, highlight=False, soft_wrap=True)


def unmeasured_stages(profile, plan) -> list[str]:
    """Stages of ``plan`` on a profiled GPU type priced without a measurement (--profile-fallback)."""
    from haap_milp.estimator.override import coverage

    if profile is None:
        return []
    out = []
    for j, s in enumerate(plan.stages):
        # a mixed stage (formulations/ eq. H1): each replica type at its own micro-batch
        points = [(r.gpu_type, r.tp, r.micro_batch) for r in s.replicas] or \
            [(s.gpu_type, s.tp, plan.stage_micro_batch(j))]
        for gpu, tp, mbs in points:
            status = coverage(profile, gpu, tp, mbs)
            if status in ("interpolated", "missing"):
                how = "interpolated" if status == "interpolated" else "analytic model"
                out.append(f"stage {j} ({gpu} tp {tp} mbs {mbs:g}): {how}")
    return out
