"""Read a measured-network file and attach it to a cluster (``--network FILE``, bench specs' ``network:``).

The network replaces what the cluster carried before (a cluster file may hold a ``network`` of its own).
Every GPU type and island the file names must be in the cluster: a figure for a type the cluster lacks is
almost always a mismatched file (say, a network measured on A100-80GB nodes given to an A100-40GB
cluster), so it is an error rather than silently unused.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from haap_milp.catalog.files import is_file, load_data
from haap_milp.catalog.validation import format_validation_error
from haap_milp.errors import HaapInputError
from haap_milp.network.spec import MeasuredNetwork
from haap_milp.specs import ClusterSpec

FLAG = "--network"


def load_network(path: str | Path, flag: str = FLAG) -> MeasuredNetwork:
    """A MeasuredNetwork from YAML or JSON; every mistake is one paragraph naming ``flag`` and the path."""
    p = Path(path)
    if not is_file(p):
        raise HaapInputError(f"{flag} {str(path)!r} is not a file; write one with 'haap-solve network import'.",
                             field=flag.lstrip("-"), value=str(path))
    try:  # (the package's bounded loader: size, encoding, alias expansion, nesting, NaN; libyaml where installed)
        data = load_data(p, "file")
    except HaapInputError as exc:  # (its paragraph starts with the path, or with what the path is)
        msg = str(exc)
        msg = f"{flag} {msg}" if msg.startswith(repr(str(path))) else f"{flag} {str(path)!r}: {msg}"
        raise HaapInputError(msg, field=flag.lstrip("-"), value=str(path)) from None
    if not isinstance(data, dict):
        raise HaapInputError(f"{flag} {str(path)!r} must be a mapping with 'links' (haap-solve schema network).",
                             field=flag.lstrip("-"), value=str(path))
    try:
        return MeasuredNetwork.model_validate(data)
    except ValidationError as exc:  # (the shared wording: the innermost problems, as the file spells their keys)
        err = format_validation_error(MeasuredNetwork, exc, f"{flag} {str(path)!r} is not a valid network description",
                                      "(see haap-solve schema network)")
        raise HaapInputError(str(err), field=flag.lstrip("-"), value=str(path)) from None


def with_network(cluster: ClusterSpec, network: MeasuredNetwork, flag: str = FLAG, where: str = "") -> ClusterSpec:
    """``cluster`` with ``network`` attached, after checking the types and islands it names."""
    label = f"{flag} {where!r}" if where else flag
    missing = [t for t in network.gpu_types if t not in cluster.gpu_types]
    if missing:
        raise HaapInputError(
            f"{label} has measurements for GPU type(s) {', '.join(missing)}, which cluster {cluster.name!r} does not "
            f"have (it has {', '.join(cluster.gpu_types)}); use the network measured on this cluster, or re-import "
            "leaving those types out (--gpu-name NAME=none).", field=flag.lstrip("-"), value=where or None)
    islands = [i for i in network.islands if i not in cluster.islands]
    if islands:
        raise HaapInputError(
            f"{label} names island(s) {', '.join(islands)}, which cluster {cluster.name!r} does not have (it has "
            f"{', '.join(cluster.islands)}).", field=flag.lstrip("-"), value=where or None)
    return cluster.model_copy(update={"network": network})


def apply_network_option(cluster: ClusterSpec, path: str | Path | None, flag: str = FLAG) -> ClusterSpec:
    """The CLI's ``--network FILE``: the cluster unchanged without it."""
    if path is None or str(path) == "":
        return cluster
    return with_network(cluster, load_network(path, flag), flag, str(path))


def network_yaml(network: MeasuredNetwork) -> str:
    return yaml.safe_dump(network.model_dump(mode="json"), sort_keys=False, width=120)
