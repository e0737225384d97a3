"""Worker pools (``[[pools]]``), ``kind`` and ``[processing]`` in a job spec: what parses, what
it means, and every bad spec's error naming the file, ``pools[I].FIELD`` and the pool's role."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kit.specs import load_error, spec_file
from tui.model.jobspec import JobSpec, load_jobspec
from tui.model.poolspec import PoolSpec, ProcessingInput, check_pins, in_role_order

FOUR = """
name = "ps-train"
command = ["{python}", "train.py"]
[env]
A = "job"
[[pools]]
role = "evaluator"
hosts = ["h3"]
[[pools]]
role = "primary"
gpus_per_replica = 1
[[pools]]
role = "worker"
replicas = 2
gpus_per_replica = 1
[[pools]]
role = "parameter_server"
labels = ["cpu"]
command = ["{python}", "ps.py"]
env = { PS = "1" }
"""


def test_a_four_pool_spec_parses_with_its_defaults_and_round_trips(tmp_path: Path) -> None:
    spec = load_jobspec(spec_file(tmp_path, FOUR))
    assert [p.role for p in spec.pools] == ["evaluator", "primary", "worker", "parameter_server"]
    assert [p.role for p in in_role_order(spec.pools)] == ["primary", "worker", "parameter_server", "evaluator"]
    ev, primary, worker, ps = spec.pools
    assert ev == PoolSpec(role="evaluator", processes_per_replica=1, hosts=("h3",), on_failure="continue")
    assert primary == PoolSpec(role="primary", gpus_per_replica=1)
    assert worker.replicas == 2 and worker.on_failure == "stop" and worker.command is None
    assert ps.command == ("{python}", "ps.py") and ps.env == (("PS", "1"),) and ps.labels == ("cpu",)
    # Top-level sizes are the pools': 5 replicas, 5 ranks, torch's world the primary + workers.
    assert (spec.nodes, spec.hosts, spec.gpus_per_node, spec.processes_per_node) == (None, (), None, None)
    assert spec.node_count == 5 and spec.world_size == 5 and spec.torch_world_size == 3
    assert spec.kind == "training" and spec.processing is None and spec.uses_gpus
    assert JobSpec.from_dict(spec.to_dict()) == spec


def test_a_spec_without_pools_is_what_it_was(tmp_path: Path) -> None:
    spec = load_jobspec(spec_file(tmp_path, 'name = "a"\ncommand = ["x"]\nnodes = 2\n'))
    assert spec.pools == () and spec.kind == "training" and spec.processes_per_node == 1
    assert spec.world_size == spec.torch_world_size == 2
    assert spec.to_dict()["pools"] == [] and JobSpec.from_dict(spec.to_dict()) == spec


def _pools(*tables: str) -> str:
    return 'name = "p"\ncommand = ["x"]\n' + "".join(f"[[pools]]\n{t}\n" for t in tables)


@pytest.mark.parametrize(
    "text, field, needle",
    [
        # Two primaries: the second is named, and the first.
        (_pools('role = "primary"', 'role = "primary"'), "pools[1].role",
         "expected at most one primary pool (pools[0] is the primary already), got \"primary\""),
        (_pools('role = "worker"\nreplicas = 2'), "pools",
         'exactly one pool with role = "primary" (there is none; roles given: worker)'),
        (_pools('role = "primary"', 'role = "evaluator"\nreplicas = 0'), "pools[1].replicas",
         "expected an integer >= 1 (pool 'evaluator'), got 0 (integer)"),
        (_pools('role = "primary"\nreplicas = 2'), "pools[0].replicas",
         "expected 1 (the primary pool has exactly one replica) (pool 'primary'), got 2"),
        (_pools('role = "primary"', 'role = "chief"'), "pools[1].role",
         'expected "primary" or "worker" or "parameter_server" or "reduction_server" or "evaluator", got "chief"'),
        (_pools('role = "primary"', 'role = "worker"\nreplica = 2'), "pools[1].replica",
         "(did you mean 'replicas'?)"),
        (_pools('role = "primary"', 'replicas = 2'), "pools[1].role", "(required)"),
        (_pools('role = "primary"', 'role = "worker"', 'role = "worker"'), "pools[2].role",
         "one pool per role (pools[1] is the worker pool already)"),
        (_pools('role = "primary"', 'role = "parameter_server"', 'role = "reduction_server"'), "pools[2].role",
         "not both parameter_server and reduction_server pools"),
        (_pools('role = "primary"\ngpus_per_replica = 1\nprocesses_per_replica = 2'),
         "pools[0].processes_per_replica", "only one of gpus_per_replica"),
        (_pools('role = "primary"', 'role = "worker"\nhosts = ["h1"]\nlabels = ["gpu"]'), "pools[1].labels",
         "only one of hosts and labels"),
        (_pools('role = "primary"', 'role = "worker"\non_failure = "continue"'), "pools[1].on_failure",
         "no on_failure outside the evaluator pool (a worker failing always stops the gang) (pool 'worker')"),
        (_pools('role = "primary"', 'role = "evaluator"\non_failure = "maybe"'), "pools[1].on_failure",
         "expected \"continue\" or \"stop\" (pool 'evaluator')"),
        (_pools('role = "primary"', 'role = "worker"\ngpus_per_replica = "2"'), "pools[1].gpus_per_replica",
         "an integer >= 1 (pool 'worker')"),
        (_pools('role = "primary"\ncommand = []'), "pools[0].command", "a non-empty list"),
        (_pools('role = "primary"\nenv = { RIGDECK_X = "1" }'), "pools[0].env", "no RIGDECK_*"),
        (_pools('role = "primary"\nlabels = []'), "pools[0].labels", "a non-empty list of inventory labels"),
        ('name = "p"\ncommand = ["x"]\npools = 3\n', "pools", "an array of tables ([[pools]])"),
        (_pools('role = "primary"').replace('command = ["x"]\n', 'command = ["x"]\nnodes = 2\n'), "nodes",
         "no nodes with [[pools]] (each pool sets its own)"),
        (_pools('role = "primary"').replace('command = ["x"]\n', 'command = ["x"]\ngpus_per_node = 2\n'),
         "gpus_per_node", "each pool sets its own"),
        (_pools('role = "primary"').replace('command = ["x"]\n', 'command = ["x"]\nlauncher = "torchrun"\n'),
         "launcher", '"direct" with [[pools]]'),
        (_pools('role = "primary"') + "[model_parallel]\npartitions = 2\nmicrobatches = 2\n", "model_parallel",
         "each pool sets its own"),
    ],
)
def test_bad_pools_name_the_pool_and_field(tmp_path: Path, text: str, field: str, needle: str) -> None:
    err = load_error(tmp_path, text)
    assert err.field == field, str(err)
    assert needle in str(err), str(err)


def test_the_contracts_example_error_reads_as_written(tmp_path: Path) -> None:
    err = load_error(tmp_path, _pools('role = "primary"', 'role = "worker"', 'role = "parameter_server"',
                                      'role = "evaluator"\nreplicas = 0'))
    path = tmp_path / "job.toml"
    assert str(err) == (f"{path}: field 'pools[3].replicas': expected an integer >= 1 (pool 'evaluator'), "
                        "got 0 (integer)")


def test_pins_are_checked_against_the_inventory(tmp_path: Path) -> None:
    spec = load_jobspec(spec_file(tmp_path, FOUR))
    inv = {"h1": ("gpu",), "h2": ("gpu", "fast"), "h3": ("cpu",)}
    assert check_pins(spec.pools, inv, "spec.toml") is None
    text = check_pins(spec.pools, {"h1": ("gpu",), "h3": ("fast",)}, "spec.toml")
    assert text == ("spec.toml: field 'pools[3].labels': expected labels some inventory host carries "
                    "(known: fast, gpu) (pool 'parameter_server'), got 'cpu'")
    text = check_pins(spec.pools, {"h1": ("cpu",), "h2": ()}, "spec.toml")
    assert text == ("spec.toml: field 'pools[0].hosts': expected hosts from the inventory (h1, h2) "
                    "(pool 'evaluator'), got unknown 'h3'")
    both = (PoolSpec(role="primary", labels=("a", "b")),)
    text = check_pins(both, {"h1": ("a",), "h2": ("b",)}, "s")
    assert text is not None and "labels that one inventory host carries together" in text


PROCESSING = """
name = "count"
kind = "processing"
nodes = 3
command = ["{python}", "count.py"]
[[processing.inputs]]
name = "raw"
source = "data/raw"
distribution = "ShardedByKey"
[[processing.inputs]]
name = "ref"
source = "/shared/ref"
[[processing.outputs]]
name = "counts"
"""


def test_a_processing_spec_parses_and_round_trips(tmp_path: Path) -> None:
    spec = load_jobspec(spec_file(tmp_path, PROCESSING))
    assert spec.kind == "processing" and spec.pools == () and spec.node_count == 3
    assert spec.processing is not None
    assert spec.processing.inputs == (ProcessingInput("raw", "data/raw", "ShardedByKey"),
                                      ProcessingInput("ref", "/shared/ref", "FullyReplicated"))
    assert spec.processing.outputs == ("counts",)
    assert JobSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    "text, field, needle",
    [
        (PROCESSING.replace('"ShardedByKey"', '"Sharded"'), "processing.inputs[0].distribution",
         'expected "FullyReplicated" or "ShardedByKey", got "Sharded"'),
        (PROCESSING.replace('name = "ref"', 'name = "raw"'), "processing.inputs[1].name",
         "a name no other of processing.inputs has (processing.inputs[0] has it)"),
        (PROCESSING.replace('name = "raw"', 'name = "a/b"'), "processing.inputs[0].name", "1-64 letters"),
        (PROCESSING.replace('source = "data/raw"\n', ""), "processing.inputs[0].source", "(required)"),
        (PROCESSING.replace('"/shared/ref"', '"~/ref"'), "processing.inputs[1].source", "no '~'"),
        (PROCESSING.replace('name = "counts"', 'nmae = "counts"'), "processing.outputs[0].nmae",
         "did you mean 'name'"),
        (PROCESSING.replace('kind = "processing"\n', ""), "processing", 'kind = "processing"'),
        (PROCESSING.replace('kind = "processing"', 'kind = "batch"'), "kind",
         'expected "training" or "processing", got "batch"'),
        (PROCESSING + '[[pools]]\nrole = "primary"\n', "pools", "no [[pools]] in a processing job"),
        (PROCESSING.replace("nodes = 3", 'nodes = 3\nlauncher = "torchrun"'), "launcher", '"direct"'),
    ],
)
def test_bad_processing_specs_name_the_field(tmp_path: Path, text: str, field: str, needle: str) -> None:
    err = load_error(tmp_path, text)
    assert err.field == field, str(err)
    assert needle in str(err), str(err)


ROOT = Path(__file__).resolve().parent.parent


def test_the_examples_specs_parse() -> None:
    pools = load_jobspec(ROOT / "examples" / "pools" / "job.toml")
    assert [p.role for p in pools.pools] == ["primary", "worker", "parameter_server", "evaluator"]
    assert pools.node_count == 5 and pools.torch_world_size == 3
    proc = load_jobspec(ROOT / "examples" / "processing" / "job.toml")
    assert proc.kind == "processing" and proc.processing is not None
    assert proc.processing.inputs == (ProcessingInput("data", "data", "ShardedByKey"),)


def test_the_processing_examples_script_counts_its_shard(tmp_path: Path) -> None:
    """count.py over a processing tree as a host has it (a shard: symlinks to some files)."""
    import json
    import os
    import subprocess
    import sys

    data = ROOT / "examples" / "processing" / "data"
    tree = tmp_path / "processing"
    shard = tree / "input" / "data"
    shard.mkdir(parents=True)
    mine = sorted(p.name for p in data.iterdir())[1::3]
    for name in mine:
        (shard / name).symlink_to(data / name)
    (tree / "config").mkdir()
    (tree / "config" / "resourceconfig.json").write_text(
        json.dumps({"current_host": "h2", "hosts": ["h1", "h2", "h3"]}))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "processing" / "count.py")], capture_output=True,
                         text=True, env={**os.environ, "RIGDECK_PROCESSING_DIR": str(tree)}, timeout=60, check=True)
    assert out.stdout == "h2: counted the lines of 3 files\n"
    rows = (tree / "output" / "counts" / "h2.tsv").read_text().splitlines()
    assert rows == [f"data/{n}\t{len((data / n).read_text().splitlines())}" for n in mine]
    assert [r.split("\t")[1] for r in rows] == ["2", "5", "8"]
