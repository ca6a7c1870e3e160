"""Measured networks: the description (curves, links), the Sailor and nccl-tests importers, `network import`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import invoke_cli
from pydantic import ValidationError

from haap_milp.errors import HaapInputError
from haap_milp.network import nccl_tests, sailor
from haap_milp.network.merge import load_network
from haap_milp.network.spec import Log2QuadraticCurve, MeasuredLink, MeasuredNetwork, TableCurve

DATA = Path(__file__).parent / "data"
SAILOR = DATA / "sailor_network" / "multizone_bandwidths_het.json"
SAILOR_INTRA = DATA / "sailor_network" / "intra_node_bandwidths.json"
NCCL = DATA / "nccl_tests"
ZONE = "us-central1-a"
MB8 = 8e6


def _one(links: list[MeasuredLink], cls: str, types: tuple[str, ...], senders: int) -> MeasuredLink:
    found = [lk for lk in links if lk.link == cls and lk.gpu_types == types and lk.senders == senders]
    assert len(found) == 1, found
    return found[0]


# ----------------------------------------------------------------------------- curves


def test_table_curve_is_log_linear_between_points_and_flat_beyond():
    c = TableCurve(points=({"message_bytes": 1e6, "bandwidth_gbps": 10.0}, {"message_bytes": 1e8, "bandwidth_gbps": 30.0}))
    assert c.bandwidth_gbps(1e7) == pytest.approx(20.0)  # halfway in log(size), not in size (that would be ~10.2)
    assert c.bandwidth_gbps(1e3) == 10.0 and c.bandwidth_gbps(1e12) == 30.0


def test_table_curve_rejects_unsorted_sizes():
    with pytest.raises(ValidationError, match="strictly increasing"):
        TableCurve(points=({"message_bytes": 2e6, "bandwidth_gbps": 1.0}, {"message_bytes": 1e6, "bandwidth_gbps": 2.0}))


def test_log2_quadratic_curve_cap_floor_and_validation():
    c = Log2QuadraticCurve(coefficients=(-0.0367, 0.4773, 4.5593), max_gbps=6.036)
    x = 3.0  # 8 MB
    assert c.bandwidth_gbps(MB8) == pytest.approx(-0.0367 * x * x + 0.4773 * x + 4.5593)
    assert c.bandwidth_gbps(1e12) == 6.036  # capped
    assert c.bandwidth_gbps(1e3) == c.bandwidth_gbps(1e6)  # held below 1 MB
    with pytest.raises(ValidationError, match="not positive"):
        Log2QuadraticCurve(coefficients=(0.0, 0.1, -1.0), max_gbps=5.0)


def test_link_shape_is_checked():
    curve = {"kind": "table", "points": [{"message_bytes": 1e6, "bandwidth_gbps": 1.0}]}
    with pytest.raises(ValidationError, match="2 GPU type"):
        MeasuredLink(link="cross_type", gpu_types=("a100-40g",), per="gpu_stream", curve=curve)
    with pytest.raises(ValidationError, match="two different islands"):
        MeasuredLink(link="inter_island", islands=("a",), per="node_nic", curve=curve)


# ----------------------------------------------------------------------------- Sailor


def test_sailor_import_reproduces_the_published_figures():
    """README of the data: one A100 stream about 1.5 GB/s at 8 MB (V100 VMs about 1.1), four GPUs of a VM
    together about 6 GB/s - the NIC is shared, so not 4 x 1.5."""
    links = sailor.import_links(SAILOR, ZONE, {})
    a1 = _one(links, "inter_node", ("a100-40g",), 1)
    a4 = _one(links, "inter_node", ("a100-40g",), 4)
    v1 = _one(links, "inter_node", ("v100-16g",), 1)
    assert (a1.per, a4.per) == ("gpu_stream", "node_nic")
    assert a1.bandwidth_gbps(MB8) == pytest.approx(1.517, abs=0.005)
    assert a4.bandwidth_gbps(MB8) == pytest.approx(5.661, abs=0.005)
    assert a4.bandwidth_gbps(1e9) == pytest.approx(6.036, abs=0.005)  # the cap: "about 6 GB/s"
    assert a4.bandwidth_gbps(MB8) < 4 * a1.bandwidth_gbps(MB8)
    assert v1.bandwidth_gbps(MB8) == pytest.approx(1.059, abs=0.005)
    av = _one(links, "cross_type", ("a100-40g", "v100-16g"), 1)
    assert av.bandwidth_gbps(MB8) == pytest.approx(1.059, abs=0.005)
    assert _one(links, "cross_type", ("a100-40g", "v100-16g"), 4).bandwidth_gbps(MB8) == pytest.approx(4.341, abs=0.005)
    assert all(lk.latency_us == 0 and lk.op == "p2p" for lk in links)
    assert len(links) == 12  # 2 types x 2 destinations x n in (1, 2, 4), n = n' only


def test_sailor_intra_node_file_and_name_mapping():
    with pytest.raises(HaapInputError, match=r"'GH-96'.*--gpu-name"):
        sailor.import_links(SAILOR_INTRA, None, {})
    skip = {n: "none" for n in ("GH-96", "RTX-2080", "Titan-RTX", "RTX-3090", "A100-80")}
    links = sailor.import_links(SAILOR_INTRA, None, skip)
    assert {lk.gpu_types for lk in links} == {("a100-40g",), ("v100-16g",)}
    a4 = _one(links, "intra_node", ("a100-40g",), 4)
    x = 3.0
    assert a4.bandwidth_gbps(MB8) == pytest.approx(0.8303558 * x * x + 15.58397854 * x + 31.19114521)


def test_sailor_zone_is_required_and_checked():
    with pytest.raises(HaapInputError, match="--zone"):
        sailor.import_links(SAILOR, None, {})
    with pytest.raises(HaapInputError, match=r"--zone 'europe-west4-a' is not in .* us-central1-a"):
        sailor.import_links(SAILOR, "europe-west4-a", {})


# ----------------------------------------------------------------------------- nccl-tests


def _last_row(path: Path) -> dict[str, float]:
    """The printed out-of-place figures of the largest size (size, time, algbw, busbw)."""
    rows = [ln.split() for ln in path.read_text().splitlines() if re.match(r"^\s+\d+\s", ln)]
    last = rows[-1]
    return {"size": float(last[0]), "time": float(last[5]), "algbw": float(last[6]), "busbw": float(last[7])}


def test_nccl_all_reduce_one_host_is_intra_node_busbw():
    path = NCCL / "all_reduce_perf_1node_a100.txt"
    (lk,) = nccl_tests.import_links(path, {})
    assert (lk.link, lk.gpu_types, lk.per, lk.senders, lk.op) == ("intra_node", ("a100-80g",), "gpu_stream", 8,
                                                                  "all_reduce")
    row = _last_row(path)
    assert lk.bandwidth_gbps(row["size"]) == pytest.approx(row["busbw"], abs=0.01)
    assert len(lk.curve.points) == 28  # 8 B .. 1 GiB; the NCCL INFO line in between is skipped
    assert lk.bandwidth_gbps(8) > 0  # printed as 0.00; recomputed from size / time


@pytest.mark.parametrize("tool", ["all_gather", "reduce_scatter"])
def test_nccl_gather_scatter_two_hosts_are_node_nic(tool):
    path = NCCL / f"{tool}_perf_2node_h100.txt"
    (lk,) = nccl_tests.import_links(path, {})
    assert (lk.link, lk.gpu_types, lk.per, lk.senders, lk.op) == ("inter_node", ("h100-80g",), "node_nic", 8, tool)
    row = _last_row(path)
    # comm.group_collective moves f·(N-1)/N·S through each node's NICs; f = 1, N = 2 hosts
    assert lk.bandwidth_gbps(row["size"]) == pytest.approx(0.5 * row["algbw"], abs=0.01)


def test_nccl_alltoall_two_hosts_is_the_remote_share_per_gpu():
    path = NCCL / "alltoall_perf_2node_h100.txt"
    (lk,) = nccl_tests.import_links(path, {})
    assert (lk.link, lk.per, lk.senders, lk.op) == ("inter_node", "gpu_stream", 8, "alltoall")
    row = _last_row(path)
    assert lk.bandwidth_gbps(row["size"]) == pytest.approx(row["algbw"] * (16 - 8) / 16, abs=0.01)


def test_nccl_sendrecv_same_and_cross_type():
    path = NCCL / "sendrecv_perf_2node_a100.txt"
    (lk,) = nccl_tests.import_links(path, {})
    assert (lk.link, lk.gpu_types, lk.per, lk.senders) == ("inter_node", ("a100-40g",), "gpu_stream", 1)
    row = _last_row(path)
    assert lk.bandwidth_gbps(row["size"]) == pytest.approx(row["algbw"], abs=0.01)
    both = nccl_tests.import_links(NCCL / "sendrecv_perf_a100_v100.txt", {})
    assert sorted(lk.gpu_types for lk in both) == [("a100-40g", "v100-16g"), ("v100-16g", "a100-40g")]
    assert {lk.link for lk in both} == {"cross_type"}


def test_nccl_older_format_without_root_column(tmp_path):
    text = (NCCL / "all_reduce_perf_1node_a100.txt").read_text()
    old = re.sub(r"    root(?=     time)", "", text)
    old = re.sub(r"(?m)^(\s+\d+\s+\d+\s+\w+\s+\w+)\s+-1", r"\1", old)
    assert old != text
    p = tmp_path / "all_reduce_perf.log"
    p.write_text(old)
    new_link, = nccl_tests.import_links(NCCL / "all_reduce_perf_1node_a100.txt", {})
    old_link, = nccl_tests.import_links(p, {})
    assert old_link.curve == new_link.curve


def test_nccl_errors_name_the_problem(tmp_path):
    text = (NCCL / "sendrecv_perf_2node_a100.txt").read_text()
    p = tmp_path / "unknown.txt"
    p.write_text(text.replace("# Collective test starting: sendrecv_perf\n", ""))
    with pytest.raises(HaapInputError, match="name the file after the tool"):
        nccl_tests.import_links(p, {})
    p = tmp_path / "sendrecv_perf.txt"
    p.write_text("\n".join(ln for ln in text.splitlines() if "Rank" not in ln))
    with pytest.raises(HaapInputError, match="Rank"):
        nccl_tests.import_links(p, {})
    p.write_text(text.replace("NVIDIA A100-SXM4-40GB", "Mystery GPU 9000"))
    with pytest.raises(HaapInputError, match=r"'Mystery GPU 9000'.*--gpu-name"):
        nccl_tests.import_links(p, {})
    (lk,) = nccl_tests.import_links(p, {"Mystery GPU 9000": "h100-80g"})
    assert lk.gpu_types == ("h100-80g",)


def test_nccl_bad_rows_are_refused_not_dropped(tmp_path):
    """A row whose time is not a positive number, whose size is not a byte count, or whose bandwidth no link has
    names the file and line; it was dropped without a word, or the spec's field was named with pydantic's text."""
    text = (NCCL / "sendrecv_perf_2node_a100.txt").read_text()
    row = next(ln for ln in text.splitlines() if re.match(r"^\s+[1-9]\d*\s", ln))
    tok = row.split()
    p = tmp_path / "sendrecv_perf.txt"
    for bad, needle in ((row.replace(f" {tok[5]} ", " nan ", 1), "time 'nan' us"),
                        (row.replace(f" {tok[5]} ", " 0.00 ", 1), "is not a positive number"),
                        (row.replace(tok[0], "-" + tok[0], 1), "is not a whole number of bytes"),
                        (row.replace(f" {tok[5]} ", " 1e-300 ", 1), "no link measures")):
        p.write_text(text.replace(row, bad))
        with pytest.raises(HaapInputError, match=needle) as got:
            nccl_tests.import_links(p, {})
        assert "pydantic" not in str(got.value) and "sendrecv_perf.txt" in str(got.value)


def test_sailor_bad_entries_name_the_entry(tmp_path):
    """A Sailor entry that is null, of the wrong shape, or a curve out of range names its path in the file, in
    haap's words (pydantic's text and Python's unpacking error leaked before; a null was skipped)."""
    data = json.loads(SAILOR.read_text())
    z = "us-central1-a"
    g = next(iter(data[z]))
    n = next(iter(data[z][g]))
    g2 = next(iter(data[z][g][n][z]))
    p = tmp_path / "bw.json"
    for value, needle in ((None, "got None"), ([[1, 2], 3], "three numbers, then one"),
                          ([[0.0, 0.1, 1.0], 1e300], "max_gbps"), ([[0.0, 0.1, 1.0], -5], "max_gbps")):
        data[z][g][n][z][g2][n] = value
        p.write_text(json.dumps(data))
        with pytest.raises(HaapInputError, match=needle) as got:
            sailor.import_links(p, z, {})
        assert "pydantic" not in str(got.value) and f"[{z}][{g}]" in str(got.value)


# ----------------------------------------------------------------------------- the command


def test_network_import_sailor_end_to_end(tmp_path):
    out = tmp_path / "net.yaml"
    code, stdout, err = invoke_cli(["network", "import", "--format", "sailor", str(SAILOR), "--zone", ZONE,
                                    "-o", str(out)])
    assert code == 0, err
    assert "12 measured links" in stdout
    assert [p.name for p in tmp_path.iterdir()] == ["net.yaml"]  # written through a temp file, nothing left over
    net = load_network(out)
    assert net == MeasuredNetwork(name="measured", links=tuple(sailor.import_links(SAILOR, ZONE, {})),
                                  source=f"{SAILOR} (zone {ZONE})")
    code, stdout, _ = invoke_cli(["network", "show", str(out)])
    assert code == 0 and "5.66" in stdout and "1.52" in stdout


def test_network_import_nccl_tests_all_five_tools(tmp_path):
    files = [str(NCCL / f"{t}_perf_{s}.txt") for t, s in (("all_reduce", "1node_a100"), ("all_gather", "2node_h100"),
             ("reduce_scatter", "2node_h100"), ("sendrecv", "2node_a100"), ("alltoall", "2node_h100"))]
    code, stdout, err = invoke_cli(["network", "import", "--format", "nccl-tests", *files, "--name", "lab"])
    assert code == 0, err
    import yaml

    net = MeasuredNetwork.model_validate(yaml.safe_load(stdout))
    assert net.name == "lab" and sorted(lk.op for lk in net.links) == sorted(
        ["all_reduce", "all_gather", "reduce_scatter", "sendrecv", "alltoall"])


@pytest.mark.parametrize(("args", "needle"), [
    (["--format", "iperf", str(SAILOR)], "--format must be one of nccl-tests, sailor, got 'iperf'"),
    (["--format", "sailor", str(SAILOR)], "--zone"),
    (["--format", "sailor", str(SAILOR), "--zone", ZONE, "--gpu-name", "A100-40"], "--gpu-name 'A100-40' must look"),
    (["--format", "sailor", str(SAILOR), "--zone", ZONE, "--gpu-name", "A100-40=b200"], "'b200' is not a GPU"),
    (["--format", "nccl-tests", "missing_perf.txt"], "does not exist"),
    (["--format", "sailor", str(SAILOR), "--zone", ZONE, "-o", "/nonexistent-dir/net.yaml"],
     "--out '/nonexistent-dir/net.yaml': folder '/nonexistent-dir' does not exist"),
])
def test_network_import_user_errors_exit_2(args, needle):
    code, _, err = invoke_cli(["network", "import", *args])
    assert code == 2
    assert needle in " ".join(err.split()) and "Traceback" not in err


def test_network_package_sits_below_the_planner():
    """network.spec is imported by specs/cluster.py (no haap import of its own); the rest may use estimator.comm,
    catalog and specs but nothing above the estimator."""
    import ast

    pkg = Path(__file__).parent.parent / "haap_milp" / "network"
    upper = ("haap_milp.planner", "haap_milp.cli", "haap_milp.solvers", "haap_milp.presolve")
    for f in sorted(pkg.glob("*.py")):
        mods = {n.module for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ImportFrom) and n.module}
        mods = {m for m in mods if m.startswith("haap_milp")}
        assert not any(m.startswith(upper) for m in mods), (f.name, mods)
        if f.name in ("spec.py", "__init__.py"):
            assert not mods, (f.name, mods)
