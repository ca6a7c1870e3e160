"""What the user runs and must still supply: ``LAUNCH.txt`` of every target (the CLI prints it after writing).

Each emitter names its engine version, the one command to run on every node, and the environment variables
(data, tokenizer, checkpoints, engine checkout) its launch script refuses to start without.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Supply:
    """An environment variable the user must set before launching (the script checks it with ``${VAR:?}``)."""

    var: str
    what: str


def _in_double_quotes(text: str) -> str:
    """``text`` as the body of a double-quoted shell word (\\, ", $ and ` escaped)."""
    for c in ("\\", '"', "$", "`"):
        text = text.replace(c, "\\" + c)
    return text


def require_lines(supplies: tuple[Supply, ...]) -> list[str]:
    """Shell lines that stop the launch with a message when a supplied variable is missing. The message is a
    quoted word of its own: bare inside "${VAR:?...}", an apostrophe (the model's) opens a quote bash 5 never
    closes, and the script does not parse."""
    return [f': "${{{s.var}:?"set {s.var} to {_in_double_quotes(s.what)}"}}"' for s in supplies]


def command(supplies: tuple[Supply, ...], script: str = "launch.sh") -> str:
    """The exact command for one node, run in the output folder (placeholders in <...>)."""
    env = " ".join(f"{s.var}=<{s.var.lower()}>" for s in supplies)
    return f"HAAP_NODE=<node name from hostfile> MASTER_ADDR=<host of node rank 0> {env} bash ./{script}"


EVERY_NODE = "On every node, in this folder (after replacing the placeholder host names in hostfile, order kept):"


def launch_text(engine: str, version: str, placement, supplies: tuple[Supply, ...], notes: list[str],
                cmd: str | None = None, where: str = EVERY_NODE) -> str:
    """LAUNCH.txt: engine version, the command, what to supply, the nodes in rank order."""
    lines = [f"Target: {engine}", f"Engine version these files follow: {version}", "", where,
             f"  {cmd or command(supplies)}", "", "You must supply:"]
    lines += [f"  {s.var}: {s.what}" for s in supplies]
    lines += [f"  {n}" for n in notes]
    lines += ["", f"Nodes ({len(placement.nodes)}, world size {placement.world_size}), node-rank order:"]
    lines += [f"  {n.name}: {n.nproc} x {n.gpu_type}, GPUs {','.join(map(str, n.devices))}" for n in placement.nodes]
    return "\n".join(lines) + "\n"


__all__ = ["Supply", "command", "launch_text", "require_lines"]
