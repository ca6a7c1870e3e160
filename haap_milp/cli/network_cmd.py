"""`haap-solve network import` (and `network show`): measured networks (parsing and printing only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from haap_milp.cli.common import console, flag_error
from haap_milp.cli.typer_app import app
from haap_milp.errors import HaapInputError

network_app = typer.Typer(name="network", no_args_is_help=True,
                          help="Measured networks: import nccl-tests or Sailor measurements for --network.")
app.add_typer(network_app, name="network")

FORMATS = ("nccl-tests", "sailor")
NetworkOpt = Annotated[str | None, typer.Option(
    "--network", help="Measured network YAML (haap-solve network import): used instead of datasheet links.")]
SHOW_SIZES = (1e6, 8e6, 64e6, 5e8)
SOURCE_CHARS = 2000  # MeasuredNetwork.source's bound


@network_app.command("import")
def import_cmd(
    files: Annotated[list[Path], typer.Argument(help="nccl-tests output files, or Sailor bandwidth JSON files.")],
    fmt: Annotated[str, typer.Option("--format", help="nccl-tests | sailor.")],
    zone: Annotated[str | None, typer.Option("--zone", help="Sailor: the zone to read (its VM-to-VM table).")] = None,
    gpu_name: Annotated[list[str], typer.Option(
        "--gpu-name", help="Map a GPU name of the files, e.g. A100-40=a100-40g (NAME=none leaves it out).")] = [],  # noqa: B006
    name: Annotated[str, typer.Option("--name", help="Name of the network.")] = "measured",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the YAML here (default: stdout).")] = None,
) -> None:
    """Write a measured-network description (YAML) from nccl-tests output or Sailor's bandwidth JSON."""
    from haap_milp.network import names, nccl_tests, sailor
    from haap_milp.network.merge import network_yaml
    from haap_milp.network.spec import MeasuredNetwork
    from haap_milp.outputs import check_output_file, write_atomic

    if fmt not in FORMATS:
        raise HaapInputError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}.", field="format", value=fmt)
    if out is not None:
        check_output_file(out, "--out")  # before any work; a device (/dev/full) is written, never replaced
    mapping = names.parse_mapping(gpu_name)
    links = []
    for f in files:
        links += sailor.import_links(f, zone, mapping) if fmt == "sailor" else nccl_tests.import_links(f, mapping)
    if not links:
        raise HaapInputError("no measured link was imported (every GPU was left out with --gpu-name NAME=none).",
                             field="gpu_name")
    source = ", ".join(str(f) for f in files) + (f" (zone {zone})" if zone else "")
    if len(source) > SOURCE_CHARS:  # many files: the list is a note, not data
        source = source[: SOURCE_CHARS - 20] + f" ... ({len(files)} files)"
    try:
        net = MeasuredNetwork(name=name, links=tuple(links), source=source)
    except ValidationError as exc:  # --name '' or 300 characters: name the flag, not the field
        raise flag_error(exc, {"--name": name}) from None
    text = network_yaml(net)
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        write_atomic(out, text, flag="--out")
    except OSError as exc:
        raise HaapInputError(f"--out {str(out)!r} cannot be written: {exc.strerror or exc}.", field="out",
                             value=str(out)) from None
    console.print(f"wrote {out}: {len(links)} measured links for {', '.join(net.gpu_types)}", markup=False, soft_wrap=True,
                  highlight=False)


@network_app.command("show")
def show_cmd(file: Annotated[Path, typer.Argument(help="Measured network YAML.")]) -> None:
    """Print each measured link's bandwidth at a few message sizes."""
    from rich.console import Console
    from rich.table import Table

    from haap_milp.network.merge import load_network

    net = load_network(file, "FILE")
    tab = Table(title=f"{net.name}: GB/s at message size ({net.source})" if net.source else net.name)
    for col in ("link", "GPU types", "islands", "per", "senders", "op", *(f"{s / 1e6:g} MB" for s in SHOW_SIZES)):
        tab.add_column(col, justify="right" if col.endswith("MB") or col == "senders" else "left")
    for lk in net.links:
        tab.add_row(lk.link, " -> ".join(lk.gpu_types), " -> ".join(lk.islands) or "all", lk.per, str(lk.senders),
                    lk.op, *(f"{lk.bandwidth_gbps(s):.3g}" for s in SHOW_SIZES))
    Console(width=max(console.width, 130)).print(tab)  # wide even when piped
