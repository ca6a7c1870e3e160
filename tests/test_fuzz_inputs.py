"""Fuzz the input boundary: random and malformed YAML, JSON, HF configs and shorthand strings.

The loaders may only succeed or raise HaapInputError with a one-line message; the CLI (run
in-process through the real entry point) may only exit 0 or 2, with one paragraph on stderr
and never a traceback. Derandomised so CI is deterministic; examples are bounded to keep the
whole file to a few seconds.

Most of a refused input's cost in-process was Typer turning the app into its click command on every call
(``typer.main.get_command``, about 90 ms of a 95 ms call); ``conftest._click_command_built_once`` builds it
once per test process, so each example costs what the input handling costs (1-8 ms).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from conftest import invoke_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_inputs_hf_config import GPT2, LLAMA3_8B, OPT_350M, QWEN3_235B, QWEN15_MOE_A27B

from haap_milp.catalog import gpu_names, load_cluster, load_model
from haap_milp.catalog.detect import load_file, resolve_any
from haap_milp.errors import HaapInputError

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

MODEL = {"num_layers": 4, "hidden": 256, "ffn_hidden": 1024, "num_heads": 8, "num_kv_heads": 4, "vocab_size": 1000,
         "num_experts": 4, "top_k": 2, "activation": "swiglu", "base": "llama3-8b"}
CLUSTER = {"name": "c", "node_groups": [{"gpu": "a100-80g", "num_nodes": 2, "island": "x"},
                                        {"gpu": "v100-32g", "num_gpus": 16, "nic": "roce", "island": "y"}],
           "island_links": [{"a": "x", "b": "y", "bandwidth_gbps": 3.125, "latency_us": 50}]}
BASES = [MODEL, CLUSTER, LLAMA3_8B, QWEN15_MOE_A27B, QWEN3_235B, GPT2, OPT_350M]

scalars = st.one_of(st.integers(-2, 70), st.integers(), st.floats(), st.text(max_size=12), st.booleans(), st.none(),
                    st.sampled_from(["a100-80g", "llama3-8b", "ib", "all", "first_k_dense", "1e400", "-0"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=8), inner, max_size=3), max_leaves=6)


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every position in nested mappings/lists (the root is ())."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    return [prefix] + [p for key, value in items for p in _paths(value, prefix + (key,))]


def mutate(base: Any, draw: Callable[[Any], Any]) -> Any:
    """Apply 0-3 random edits (replace a value, drop a key/item, add a key/item) to a valid input."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        path = draw(st.sampled_from(_paths(data)))
        action = draw(st.sampled_from(["replace", "drop", "add"]))
        if not path:
            data = draw(values) if action == "replace" else data
            continue
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        target = parent[path[-1]]
        if action == "drop":
            del parent[path[-1]]
        elif action == "add" and isinstance(target, dict):
            target[draw(st.text(max_size=10))] = draw(values)
        elif action == "add" and isinstance(target, list):
            target.append(draw(values))
        else:
            parent[path[-1]] = draw(values)
    return data


def serialise(data: Any, fmt: str) -> str:
    return json.dumps(data) if fmt == "json" else yaml.safe_dump(data, allow_unicode=True)


def assert_one_paragraph_or_success(call: Callable[[], Any]) -> None:
    try:
        call()
    except HaapInputError as exc:
        message = str(exc)
        assert message and "\n" not in message, message


def assert_cli_clean(args: list[str]) -> None:
    code, _, err = invoke_cli(args)
    assert code in (0, 2), (args, code, err)
    if code == 2:
        assert err.startswith("error: ") and "Traceback" not in err, err
        assert "\n" not in err.strip(), err


@FUZZ
@given(data=st.data(), fmt=st.sampled_from(["yaml", "json"]), base=st.sampled_from(BASES))
def test_mutated_files_reach_only_clean_outcomes(tmp_path: Path, data: st.DataObject, fmt: str, base: dict) -> None:
    content = serialise(mutate(base, data.draw), fmt)
    path = tmp_path / ("config.json" if fmt == "json" else "input.yaml")
    path.write_text(content, encoding="utf-8")
    for loader in (load_model, load_cluster, load_file):
        assert_one_paragraph_or_success(lambda loader=loader: loader(str(path)))
    assert_cli_clean(["validate", str(path)])
    assert_cli_clean(["show", "--json", "--", str(path)])


@FUZZ
@given(content=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                         st.text(alphabet="{}[]:,-\"'!&*#|>%@ \n\tabc019.", max_size=80).map(str.encode)))
def test_random_bytes_and_text(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "random.yaml"
    path.write_bytes(content)
    for loader in (load_model, load_cluster, load_file):
        assert_one_paragraph_or_success(lambda loader=loader: loader(str(path)))
    assert_cli_clean(["validate", str(path)])


part = st.one_of(st.sampled_from(gpu_names()), st.sampled_from(["a100", "A100-80G", "", "x", "v100"]),
                st.text(max_size=6))
number = st.one_of(st.integers(1, 64).map(lambda n: str(8 * n)), st.integers(-8, 4096).map(str),
                   st.sampled_from(["", "0", "08", "1e3", "99999999999", "x"]), st.text(max_size=4))
item = st.builds(lambda g, n, per, isl: f"{g}:{n}{per}{isl}", part, number,
                 st.one_of(st.just(""), st.sampled_from(["/1", "/2", "/4", "/8"]), number.map(lambda s: "/" + s)),
                 st.one_of(st.just(""), st.sampled_from(["ib", "roce", "ethernet", "", "a b", "é"]).map("@{}".format)))
shorthand = st.one_of(st.lists(item, min_size=1, max_size=4).map(",".join),
                      st.text(alphabet="a01468g:/@,-hv ", max_size=30), st.text(max_size=30))


@FUZZ
@given(text=shorthand)
def test_shorthand_strings(text: str) -> None:
    assert_one_paragraph_or_success(lambda: load_cluster(text))
    assert_one_paragraph_or_success(lambda: resolve_any(text))
    if not text.startswith("-"):
        assert_cli_clean(["show", "--json", "--", text])
