"""The cluster shorthand: ``"a100-80g:64,h100-80g:32"``, ``"v100-32g:64/8@roce"``.

Grammar: items separated by commas; each item is ``GPU:COUNT[/GPUS_PER_NODE][@ISLAND]``.
GPUS_PER_NODE defaults to the GPU's ``default_node`` in gpus.yaml (8, MI250X 4); COUNT must
be a multiple of it. ISLAND defaults to ``main``; an island named ``ib``, ``roce`` or
``ethernet`` also sets the NIC type of its nodes. Every pair of islands gets the default
island link of clusters.yaml (``shorthand.island_link``). NIC bandwidth comes from the GPU's
default node, scaled by GPUs per node.
"""

from __future__ import annotations

import re
from typing import Any

from haap_milp.catalog.cluster_file import MAX_TOTAL_GPUS, cluster_from_data
from haap_milp.catalog.data import catalog, gpu_entry
from haap_milp.catalog.files import short
from haap_milp.errors import HaapInputError
from haap_milp.specs import ClusterSpec
from haap_milp.specs.cluster import MAX_GPUS_PER_NODE, MAX_ISLANDS, MAX_NODE_GROUPS, MAX_NODES_PER_GROUP

ITEM = re.compile(r"^(?P<gpu>[^:/@]+):(?P<count>[^/@]*)(?:/(?P<per>[^@]*))?(?:@(?P<island>.*))?$")
ISLAND_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
EXAMPLE = "'a100-80g:64,h100-80g:32' or 'v100-32g:64/8@roce'"


def looks_like_shorthand(text: str) -> bool:
    """A colon before any path separator: 'a100-80g:64' yes, './dir/x.yaml' no."""
    head = text.split("/", 1)[0]
    return ":" in head and "\\" not in head


def _positive_int(text: str | None, what: str, item: str, source: str, most: int) -> int:
    """COUNT or /N of ``item``: a whole number from 1 to ``most``, said in the shorthand's terms when it is not."""
    value = (text or "").strip()
    digits = value.lstrip("0")
    if not re.fullmatch(r"[0-9]+", value) or not digits:
        raise HaapInputError(f"cluster shorthand {short(source)}: item {short(item)} has {what} {short(value)}; "
                             f"give a positive whole number, e.g. {EXAMPLE}.", field=what, value=value)
    if len(digits) > len(str(most)) or int(digits) > most:  # (not int() of a 5000-digit string: Python refuses it)
        raise HaapInputError(f"cluster shorthand {short(source)}: item {short(item)} has {what} {short(value)}; at "
                             f"most {most} {'are' if most > 1 else 'is'} accepted.", field=what, value=value)
    return int(digits)


def _parse_item(item: str, source: str) -> dict[str, Any]:
    """One ``GPU:COUNT[/N][@ISLAND]`` item -> a node-group mapping of the cluster file format."""
    match = ITEM.match(item.strip())
    if match is None:
        raise HaapInputError(f"cluster shorthand {short(source)}: item {short(item)} is not GPU:COUNT[/GPUS_PER_NODE]"
                             f"[@ISLAND]; e.g. {EXAMPLE}.", field="shorthand", value=item)
    try:
        entry = gpu_entry(match["gpu"].strip())
    except HaapInputError as exc:
        raise HaapInputError(f"cluster shorthand {short(source)}: {exc}", field="gpu", value=match["gpu"]) from None
    count = _positive_int(match["count"], "GPU count", item, source, MAX_TOTAL_GPUS)
    per = entry.default_node.gpus_per_node if match["per"] is None else \
        _positive_int(match["per"], "GPUs per node", item, source, MAX_GPUS_PER_NODE)
    if count % per:
        lower = count - count % per
        fix = " or ".join(str(n) for n in (lower, lower + per) if n)
        raise HaapInputError(f"cluster shorthand {short(source)}: item {short(item)} asks for {count} GPUs in nodes of "
                             f"{per}; the count must be a multiple of GPUs per node ({fix}), or set /N "
                             f"(e.g. '{entry.spec.name}:{count}/{count}' for one node of {count}).", field="count",
                             value=count)
    if count // per > MAX_NODES_PER_GROUP:  # (the node group's bound, said in the shorthand's terms)
        raise HaapInputError(f"cluster shorthand {short(source)}: item {short(item)} asks for {count // per} nodes of "
                             f"{per} GPUs; one item holds at most {MAX_NODES_PER_GROUP} nodes "
                             f"({MAX_NODES_PER_GROUP * per} GPUs of {per} per node): split the count over several "
                             "items.", field="count", value=count)
    group: dict[str, Any] = {"gpu": entry.spec.name, "num_nodes": count // per, "gpus_per_node": per}
    island = match["island"]
    if island is not None:
        island = island.strip()
        if not ISLAND_NAME.match(island):
            raise HaapInputError(f"cluster shorthand {short(source)}: island {short(island)} in item {short(item)} "
                                 "should be letters, digits, '-', '_' or '.' (up to 64), e.g. '@roce'.",
                                 field="island", value=island)
        group["island"] = island
        if island.lower() in catalog().shorthand["nic_islands"]:
            group["nic"] = island.lower()
    else:
        group["island"] = catalog().shorthand["default_island"]
    return group


def shorthand_data(text: str) -> dict[str, Any]:
    """The cluster-file mapping equivalent to a shorthand string."""
    items = text.split(",")
    if not text.strip() or any(not it.strip() for it in items):
        raise HaapInputError(f"cluster shorthand {short(text)} has an empty item; write items separated by single "
                             f"commas, e.g. {EXAMPLE}.", field="shorthand", value=text)
    if len(items) > MAX_NODE_GROUPS:  # before parsing each item and linking every pair of islands
        raise HaapInputError(f"cluster shorthand {short(text)} has {len(items)} items; at most {MAX_NODE_GROUPS} are "
                             "accepted (one per GPU type and island).", field="shorthand", value=len(items))
    groups = [_parse_item(it, text) for it in items]
    islands = list(dict.fromkeys(g["island"] for g in groups))
    if len(islands) > MAX_ISLANDS:  # n islands get n(n-1)/2 links: refuse before building them
        raise HaapInputError(f"cluster shorthand {short(text)} names {len(islands)} islands; at most {MAX_ISLANDS} are "
                             "accepted (every pair of islands gets a link); put nodes that share a fabric in one "
                             "island.", field="island", value=len(islands))
    link = catalog().shorthand["island_link"]
    links = [{"a": a, "b": b, "bandwidth_gbps": link["bandwidth_gbps"], "latency_us": link["latency_us"]}
             for i, a in enumerate(islands) for b in islands[i + 1:]]
    name = " ".join(text.split())
    return {"name": name if len(name) <= 200 else name[:197] + "...", "node_groups": groups, "island_links": links}


def parse_shorthand(text: str) -> ClusterSpec:
    """``"a100-80g:64,v100-32g:32@roce"`` -> ClusterSpec (errors: one HaapInputError paragraph)."""
    return cluster_from_data(shorthand_data(text), text, f"cluster shorthand {short(text)}")
