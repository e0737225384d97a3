"""tui.model.jobspec: the job spec TOML, its checks, durations and loss lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.kit.specs import load_error, spec_file
from tui.model.jobspec import (
    DEFAULT_LOSS_PATTERN,
    MAX_RUNTIME_LIMIT_S,
    CheckpointSpec,
    JobSpec,
    JobSpecError,
    RestartSpec,
    jobspec_from_toml,
    load_jobspec,
    parse_duration,
    parse_loss,
)

MINIMAL = 'name = "tiny"\ncommand = ["{python}", "train.py"]\n'

FULL = r"""
name = "ddp"
command = ["{python}", "train.py", "--steps", "300"]
workdir = "src"
launcher = "torchrun"
hosts = ["h1", "h2", "h3"]
nodes = 3
gpus_per_node = 2
max_runtime = "1h30m"
grace = "45s"
total_steps = 300

[env]
OMP_NUM_THREADS = "1"
NCCL_DEBUG = "INFO"

[hyperparameters]
lr = 0.01
layers = [64, 64]
optimizer = { name = "adam", betas = [0.9, 0.999] }
amp = true

[checkpoint]
dir = "/shared/ckpt/ddp"
owner = "host:h3/gpu:1"

[restart]
max_restarts = 2
on_exit_codes = [1, 137]

[mpi]
custom_options = ["-mca", "btl_tcp_if_include", "eth0"]

[log]
loss_pattern = 'step \d+ loss[=:]\s*(?P<loss>[0-9.eE+-]+)'

[channels]
train = "/data/train"
test = "/data/test"
"""


# ---------------------------------------------------------------------------------------------
# Valid specs


def test_full_spec(tmp_path: Path) -> None:
    path = spec_file(tmp_path, FULL)
    spec = load_jobspec(path)
    assert spec == JobSpec(
        name="ddp",
        command=("{python}", "train.py", "--steps", "300"),
        workdir=str(tmp_path / "src"),
        launcher="torchrun",
        nodes=3,
        hosts=("h1", "h2", "h3"),
        gpus_per_node=2,
        processes_per_node=None,
        env=(("OMP_NUM_THREADS", "1"), ("NCCL_DEBUG", "INFO")),
        max_runtime_s=5400,
        grace_s=45.0,
        hyperparameters=(
            ("lr", 0.01),
            ("layers", [64, 64]),
            ("optimizer", {"name": "adam", "betas": [0.9, 0.999]}),
            ("amp", True),
        ),
        checkpoint=CheckpointSpec(dir="/shared/ckpt/ddp", owner="host:h3/gpu:1"),
        restart=RestartSpec(max_restarts=2, on_exit_codes=(1, 137)),
        mpi_custom_options=("-mca", "btl_tcp_if_include", "eth0"),
        loss_pattern=r"step \d+ loss[=:]\s*(?P<loss>[0-9.eE+-]+)",
        total_steps=300,
        channels=(("train", "/data/train"), ("test", "/data/test")),
        path=path,
    )
    assert spec.node_count == 3
    assert spec.slots_per_node == 2
    assert spec.world_size == 6
    assert spec.uses_gpus
    assert parse_loss("step 12 loss=0.25", spec.loss_pattern) == 0.25


def test_contract_example_loads(tmp_path: Path) -> None:
    """The example in docs/contracts.md, verbatim."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "contracts.md").read_text()
    block = re.search(r"## Job spec \(TOML\)\n\n```toml\n(.*?)```", text, re.S)
    assert block is not None
    spec = load_jobspec(spec_file(tmp_path, block.group(1)))
    assert spec.name == "ddp"
    assert spec.nodes == 3
    assert spec.processes_per_node == 2
    assert spec.max_runtime_s == 600
    assert parse_loss("loss: 0.5", spec.loss_pattern) == 0.5


def test_defaults(tmp_path: Path) -> None:
    path = spec_file(tmp_path, MINIMAL)
    spec = load_jobspec(path)
    assert spec == JobSpec(
        name="tiny",
        command=("{python}", "train.py"),
        workdir=str(tmp_path),
        path=path,
        processes_per_node=1,
    )
    assert spec.launcher == "direct"
    assert spec.nodes is None and spec.node_count == 1
    assert spec.hosts == ()
    assert spec.gpus_per_node is None and not spec.uses_gpus
    assert spec.max_runtime_s == 24 * 3600
    assert spec.grace_s == 30.0
    assert spec.checkpoint == CheckpointSpec(dir=None, owner="rank0")
    assert spec.restart == RestartSpec(max_restarts=0, on_exit_codes=())
    assert spec.loss_pattern is None
    assert spec.total_steps is None
    assert spec.env == spec.hyperparameters == spec.channels == ()


def test_workdir_is_resolved_against_the_spec_file(tmp_path: Path) -> None:
    sub = tmp_path / "jobs"
    sub.mkdir()
    spec = load_jobspec(spec_file(sub, MINIMAL + 'workdir = "../code/./x"\n'))
    assert spec.workdir == str(tmp_path / "code" / "x")
    spec = load_jobspec(spec_file(tmp_path, MINIMAL + 'workdir = "/srv/job"\n'))
    assert spec.workdir == "/srv/job"


def test_hosts_alone_set_the_node_count(tmp_path: Path) -> None:
    spec = load_jobspec(spec_file(tmp_path, MINIMAL + 'hosts = ["b", "a"]\n'))
    assert spec.nodes is None
    assert spec.hosts == ("b", "a")
    assert spec.node_count == 2


def test_from_text_without_a_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    spec = jobspec_from_toml(MINIMAL)
    assert spec.workdir == str(tmp_path)
    assert spec.path is None
    with pytest.raises(JobSpecError, match="^<job spec>: field 'nodes'"):
        jobspec_from_toml(MINIMAL + "nodes = 0\n")


@pytest.mark.parametrize(
    "owner",
    ["rank0", "per-node", "all", "host:h1/gpu:0", "host:gpu-node.rack_2/gpu:17"],
)
def test_checkpoint_owners(tmp_path: Path, owner: str) -> None:
    spec = load_jobspec(spec_file(tmp_path, MINIMAL + f'[checkpoint]\nowner = "{owner}"\n'))
    assert spec.checkpoint.owner == owner


def test_round_trip_through_json(tmp_path: Path) -> None:
    for text in (FULL, MINIMAL):
        spec = load_jobspec(spec_file(tmp_path, text))
        data = json.loads(json.dumps(spec.to_dict()))
        again = JobSpec.from_dict(data)
        assert again == spec
        assert hash(again) == hash(spec)
        assert again.to_dict() == spec.to_dict()


def test_to_dict_is_a_copy(tmp_path: Path) -> None:
    spec = load_jobspec(spec_file(tmp_path, FULL))
    spec.to_dict()["hyperparameters"]["layers"].append(1)
    assert dict(spec.hyperparameters)["layers"] == [64, 64]


# ---------------------------------------------------------------------------------------------
# Bad input: every error names the file, the dotted field and what was expected.

BAD = [
    pytest.param(
        'launcher = "srun"', "launcher", '"direct" or "torchrun" or "mpirun"', id="launcher"
    ),
    pytest.param('nodes = "3"', "nodes", "an integer >= 1", id="nodes-string"),
    pytest.param("nodes = 0", "nodes", "an integer >= 1", id="nodes-zero"),
    pytest.param("nodes = true", "nodes", "an integer >= 1", id="nodes-bool"),
    pytest.param("gpus_per_node = -1", "gpus_per_node", "an integer >= 1", id="gpus-negative"),
    pytest.param("gpus_per_node = 1.5", "gpus_per_node", "an integer >= 1", id="gpus-float"),
    pytest.param("processes_per_node = 0", "processes_per_node", "an integer >= 1", id="procs"),
    pytest.param(
        "gpus_per_node = 2\nprocesses_per_node = 2",
        "processes_per_node",
        "only one of gpus_per_node",
        id="gpus-and-processes",
    ),
    pytest.param(
        'max_runtime = "forever"', "max_runtime", "a duration of whole seconds", id="runtime-word"
    ),
    pytest.param('max_runtime = "30d"', "max_runtime", "at most 28 days", id="runtime-30d"),
    pytest.param(
        "max_runtime = 0", "max_runtime", "a duration of whole seconds", id="runtime-zero"
    ),
    pytest.param(
        "max_runtime = -5", "max_runtime", "a duration of whole seconds", id="runtime-negative"
    ),
    pytest.param(
        'max_runtime = "0.5s"', "max_runtime", "a duration of whole seconds", id="runtime-fraction"
    ),
    pytest.param(
        'max_runtime = "2x"', "max_runtime", "a duration of whole seconds", id="runtime-unit"
    ),
    pytest.param(
        'max_runtime = "30m1h"', "max_runtime", "a duration of whole seconds", id="runtime-order"
    ),
    pytest.param('grace = "soon"', "grace", "a duration >= 0", id="grace"),
    pytest.param("total_steps = 0", "total_steps", "an integer >= 1", id="total-steps"),
    pytest.param('workdir = "~/code"', "workdir", "no '~'", id="workdir-tilde"),
    pytest.param("workdir = 3", "workdir", "a directory", id="workdir-int"),
    pytest.param('hosts = ["h1", "h1"]', "hosts", "host names without repeats", id="hosts-dup"),
    pytest.param('hosts = ["h 1"]', "hosts", "inventory host names", id="hosts-name"),
    pytest.param("hosts = []", "hosts", "a non-empty list", id="hosts-empty"),
    pytest.param('hosts = ["a", "b"]\nnodes = 3', "nodes", "the number of hosts", id="hosts-nodes"),
    pytest.param("[env]\nX = 5", "env.X", "a string", id="env-int"),
    pytest.param("[env]\nX = true", "env.X", "a string", id="env-bool"),
    pytest.param('[env]\n"1X" = "a"', "env", "environment variable names", id="env-name"),
    pytest.param('[env]\nRIGDECK_RANK = "3"', "env", "no RIGDECK_", id="env-reserved"),
    pytest.param('env = "A=1"', "env", "a table of strings", id="env-not-table"),
    pytest.param(
        "[hyperparameters]\nstart = 2024-01-01", "hyperparameters.start", "no dates", id="hp-date"
    ),
    pytest.param(
        "[hyperparameters]\nsched = [{ at = 10:00:00 }]",
        "hyperparameters.sched[0].at",
        "no dates",
        id="hp-nested-time",
    ),
    pytest.param('[checkpoint]\nowner = "rank1"', "checkpoint.owner", '"rank0"', id="owner"),
    pytest.param(
        '[checkpoint]\nowner = "host:h1/gpu:-1"',
        "checkpoint.owner",
        "a GPU index (an integer >= 0)",
        id="owner-gpu-negative",
    ),
    pytest.param(
        '[checkpoint]\nowner = "host:h1/gpu:x"', "checkpoint.owner", "a GPU index", id="owner-gpu"
    ),
    pytest.param(
        '[checkpoint]\nowner = "host:h 1/gpu:0"', "checkpoint.owner", "a host name", id="owner-host"
    ),
    pytest.param(
        '[checkpoint]\nowner = "host:/gpu:0"', "checkpoint.owner", "a host name", id="owner-empty"
    ),
    pytest.param("[checkpoint]\nowner = 0", "checkpoint.owner", '"rank0"', id="owner-int"),
    pytest.param('[checkpoint]\ndir = ""', "checkpoint.dir", "a directory path", id="ckpt-dir"),
    pytest.param("[restart]\nmax_restarts = -1", "restart.max_restarts", ">= 0", id="restarts"),
    pytest.param(
        "[restart]\non_exit_codes = [0]", "restart.on_exit_codes", "exit codes 1..255", id="exit-0"
    ),
    pytest.param(
        '[restart]\non_exit_codes = ["1"]', "restart.on_exit_codes", "exit codes", id="exit-str"
    ),
    pytest.param(
        '[mpi]\ncustom_options = "-x A"', "mpi.custom_options", "a list of strings", id="mpi"
    ),
    pytest.param(
        "[log]\nloss_pattern = 'loss=('",
        "log.loss_pattern",
        "it does not compile",
        id="regex-invalid",
    ),
    pytest.param(
        "[log]\nloss_pattern = 'loss=[0-9.]+'",
        "log.loss_pattern",
        "exactly one capture group",
        id="regex-no-group",
    ),
    pytest.param(
        "[log]\nloss_pattern = '(loss)=([0-9.]+)'",
        "log.loss_pattern",
        "(it has 2 groups)",
        id="regex-two-groups",
    ),
    pytest.param('[channels]\ntrain = ""', "channels.train", "a path on the hosts", id="channel"),
    pytest.param('[channels]\n"a-b" = "/d"', "channels", "channel names", id="channel-name"),
    pytest.param('checkpoint = "x"', "checkpoint", "a table ([checkpoint])", id="table-type"),
    # Unknown keys, at the top level and in tables, with the nearest known key suggested.
    pytest.param("gpu_per_node = 2", "gpu_per_node", "did you mean 'gpus_per_node'", id="unknown"),
    pytest.param(
        "[restart]\nmax_restart = 1",
        "restart.max_restart",
        "did you mean 'max_restarts'",
        id="unknown-in-table",
    ),
    pytest.param(
        "[ckeckpoint]\ndir = 'x'", "ckeckpoint", "did you mean 'checkpoint'", id="unknown-table"
    ),
    pytest.param(
        "[log]\npattern = 'x'",
        "log.pattern",
        "one of the known fields loss_pattern",
        id="unknown-log-key",
    ),
]


@pytest.mark.parametrize(("extra", "field", "expected"), BAD)
def test_bad_values(tmp_path: Path, extra: str, field: str, expected: str) -> None:
    # Top-level keys go before the first table; table snippets come after the minimal spec.
    err = load_error(tmp_path, MINIMAL + extra + "\n")
    assert err.field == field
    assert f"field {field!r}" in str(err)
    assert expected in err.expected
    assert f"expected {err.expected}" in str(err)


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("[]", "[]"),
        ('"python train.py"', '"python train.py"'),
        ('["python", 3]', "['python', 3]"),
        ('["python", ""]', "['python', '']"),
    ],
)
def test_bad_command(tmp_path: Path, command: str, shown: str) -> None:
    err = load_error(tmp_path, f'name = "x"\ncommand = {command}\n')
    assert err.field == "command"
    assert "a non-empty list of non-empty strings" in str(err)
    assert f"got {shown}" in str(err)


def test_error_message_shape(tmp_path: Path) -> None:
    err = load_error(tmp_path, MINIMAL + "[restart]\nmax_restarts = -1\n")
    assert str(err) == (
        f"{tmp_path / 'job.toml'}: field 'restart.max_restarts': "
        "expected an integer >= 0, got -1 (integer)"
    )
    err = load_error(tmp_path, MINIMAL + 'nodes = "3"\n')
    assert str(err).endswith("field 'nodes': expected an integer >= 1, got \"3\" (string)")
    err = load_error(tmp_path, MINIMAL + "[env]\nX = 5\n")
    assert str(err).endswith(
        "field 'env.X': expected a string (quote numbers and booleans: \"1\"), got 5 (integer)"
    )


@pytest.mark.parametrize(
    ("text", "field"),
    [('command = ["a"]', "name"), ('name = "x"', "command")],
)
def test_required_fields(tmp_path: Path, text: str, field: str) -> None:
    err = load_error(tmp_path, text + "\n")
    assert err.field == field
    assert "(required)" in str(err)


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "ünï", "a/b"])
def test_bad_job_names(tmp_path: Path, name: str) -> None:
    err = load_error(tmp_path, f'name = "{name}"\ncommand = ["a"]\n')
    assert err.field == "name"
    assert "1-64 letters" in str(err)


def test_file_problems(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match="nope.toml: expected an existing job spec file"):
        load_jobspec(tmp_path / "nope.toml")
    err = load_error(tmp_path, "name = \n")
    assert err.field is None
    assert "valid TOML" in str(err)
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(JobSpecError, match="UTF-8"):
        load_jobspec(tmp_path / "bin.toml")


# ---------------------------------------------------------------------------------------------
# Durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45s", 45),
        ("90m", 5400),
        ("2h", 7200),
        ("1d", 86400),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("1d2h3m4s", 93784),
        ("1.5h", 5400),
        ("0.5s", 0.5),
        ("2H", 7200),
        (3600, 3600),
        (2.5, 2.5),
        (0, 0),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "s", "forever", "10", "1h1d", "5 min", "-5s", "1e3s", True, -1, None]
)
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [('"2h"', 7200), ('"28d"', MAX_RUNTIME_LIMIT_S), ("600", 600), ("60.0", 60), ('"1d"', 86400)],
)
def test_max_runtime(tmp_path: Path, value: str, seconds: int) -> None:
    spec = load_jobspec(spec_file(tmp_path, MINIMAL + f"max_runtime = {value}\n"))
    assert spec.max_runtime_s == seconds
    assert isinstance(spec.max_runtime_s, int)


def test_max_runtime_limit_is_28_days(tmp_path: Path) -> None:
    err = load_error(tmp_path, MINIMAL + f"max_runtime = {MAX_RUNTIME_LIMIT_S + 1}\n")
    assert err.field == "max_runtime"
    assert err.got == MAX_RUNTIME_LIMIT_S + 1


@pytest.mark.parametrize(
    ("value", "seconds"), [('"30s"', 30.0), ('"2m"', 120.0), ("0", 0.0), ("1.5", 1.5)]
)
def test_grace(tmp_path: Path, value: str, seconds: float) -> None:
    assert load_jobspec(spec_file(tmp_path, MINIMAL + f"grace = {value}\n")).grace_s == seconds


# ---------------------------------------------------------------------------------------------
# Loss lines


@pytest.mark.parametrize(
    ("line", "loss"),
    [
        ("loss=0.123", 0.123),
        ("loss: 0.123", 0.123),
        ("'loss': 0.123", 0.123),
        ('"loss": 0.123', 0.123),
        ('{"loss": 1.5e-3}', 1.5e-3),
        ("{'loss': 0.5, 'learning_rate': 5e-05, 'epoch': 0.1}", 0.5),
        ("loss 1.2e-3", 1.2e-3),
        ("Epoch 3/10 - Loss: 2.5 - acc: 0.9", 2.5),
        ("step 7 | LOSS=.75", 0.75),
        ("loss=-0.25", -0.25),
        ("loss=3", 3.0),
        ("100%|####| 9/9 [00:01, loss=0.042]", 0.042),
        ('{"val_loss": 9, "loss": 0.7}', 0.7),
    ],
)
def test_default_loss_pattern_matches(line: str, loss: float) -> None:
    assert parse_loss(line) == loss


def test_default_loss_pattern_nan_and_inf() -> None:
    nan = parse_loss("step 9 loss=nan")
    assert nan is not None and nan != nan
    assert parse_loss("loss: inf") == float("inf")
    assert parse_loss("loss: -Infinity") == float("-inf")


@pytest.mark.parametrize(
    "line",
    [
        "val_loss=2",
        "val_loss: 2",
        '{"val_loss": 2}',
        "train_loss=2",
        "eval.loss=2",
        "val/loss=2",
        "val-loss=2",
        "loss_scale=1024",
        "lossy=2",
        "loss of 3 samples",
        "loss: nanny",
        "no loss here",
    ],
)
def test_default_loss_pattern_ignores(line: str) -> None:
    """Only the word "loss" itself is the training loss; val_loss and friends are not."""
    assert parse_loss(line) is None


def test_default_pattern_is_a_valid_spec_pattern(tmp_path: Path) -> None:
    text = MINIMAL + f"[log]\nloss_pattern = '''{DEFAULT_LOSS_PATTERN}'''\n"
    assert load_jobspec(spec_file(tmp_path, text)).loss_pattern == DEFAULT_LOSS_PATTERN


def test_custom_patterns() -> None:
    assert parse_loss("L=4.5", r"L=([0-9.]+)") == 4.5
    assert parse_loss("it 3 L 4.5", r"(it) \d+ L (?P<loss>[0-9.]+)") == 4.5
    assert parse_loss("L=x", r"L=(\w+)") is None
    assert parse_loss("nothing", r"L=([0-9.]+)") is None
    assert parse_loss("L=", r"L=([0-9.]+)?") is None


# ---------------------------------------------------------------------------------------------
# Limits: checked before anything starts, with the field named


def _toml_list(words: list[str]) -> str:
    return "[" + ", ".join(json.dumps(w) for w in words) + "]"


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        pytest.param(
            f'command = ["echo", "{"x" * (1 << 20)}"]\n', "command[1]",
            "at most 65536 bytes (64 KiB) each; this one has 1048576", id="one-1MB-argument",
        ),
        pytest.param(
            f'command = ["echo", "{"x" * 200_000}"]\n', "command[1]",
            "this one has 200000", id="one-200KB-argument",
        ),
        pytest.param(
            f'command = ["echo", "{"é" * 40_000}"]\n', "command[1]",
            "this one has 80000", id="bytes-not-characters",
        ),
        pytest.param(
            f"command = {_toml_list(['echo'] + ['y' * 60_000] * 3)}\n", "command",
            "at most 131072 bytes (128 KiB) together", id="arguments-together",
        ),
        pytest.param(
            f'command = ["echo"]\n[env]\nBIG = "{"v" * 70_000}"\n', "env.BIG",
            "a value of at most 65536 bytes", id="env-value",
        ),
        pytest.param(
            'command = ["echo"]\n[env]\n'
            + "".join(f'V{i} = "{"v" * 60_000}"\n' for i in range(3)),
            "env", "variables of at most 131072 bytes", id="env-together",
        ),
        pytest.param(
            f'command = ["echo"]\n[mpi]\ncustom_options = ["--x", "{"o" * 70_000}"]\n',
            "mpi.custom_options[1]", "options of at most 65536 bytes", id="mpi-option",
        ),
        pytest.param(
            f'command = ["echo"]\n[hyperparameters]\nblob = "{"h" * 40_000}"\n',
            "hyperparameters", "at most 32768 bytes (32 KiB) as JSON", id="hyperparameters",
        ),
        pytest.param(
            'command = ["echo"]\n[hyperparameters]\n"a=b" = 1\n',
            "hyperparameters", "no '='", id="hyperparameter-name",
        ),
        pytest.param(
            f'command = ["echo"]\nworkdir = "/{"d" * 5000}"\n', "workdir",
            "a path of at most 4096 bytes", id="workdir",
        ),
        pytest.param(
            f'command = ["echo"]\n[checkpoint]\ndir = "/{"d" * 5000}"\n', "checkpoint.dir",
            "a path of at most 4096 bytes", id="checkpoint-dir",
        ),
        pytest.param(
            f'command = ["echo"]\n[channels]\ntrain = "/{"d" * 5000}"\n', "channels.train",
            "a path of at most 4096 bytes", id="channel-path",
        ),
        pytest.param(
            'command = ["echo", "a\\u0000b"]\n', "command[1]",
            "text without NUL characters", id="nul-in-argument",
        ),
        pytest.param(
            'command = ["echo"]\n[env]\nX = "a\\u0000"\n', "env.X",
            "text without NUL characters", id="nul-in-env-value",
        ),
        pytest.param(
            'command = ["echo"]\n[hyperparameters]\nlr = ["1", "\\u0000"]\n',
            "hyperparameters.lr[1]", "text without NUL characters", id="nul-in-hyperparameter",
        ),
        pytest.param(
            'command = ["echo"]\n[hyperparameters]\n"a\\u0000" = 1\n',
            "hyperparameters.a\0", "names without NUL characters", id="nul-in-a-name",
        ),
        pytest.param(
            'command = ["echo"]\n[env]\n"1X" = "1"\n', "env",
            "environment variable names", id="env-name-digit",
        ),
        pytest.param(
            'command = ["echo"]\n[env]\n"A=B" = "1"\n', "env",
            "environment variable names", id="env-name-equals",
        ),
    ],
)
def test_limits_name_the_field(tmp_path: Path, body: str, field: str, needle: str) -> None:
    err = load_error(tmp_path, 'name = "big"\n' + body)
    assert err.field == field, str(err)
    assert needle in str(err), str(err)
    assert len(str(err)) < 400  # the value is shown cut short, never whole


def test_the_whole_spec_has_a_size_limit(tmp_path: Path) -> None:
    # Each field within its own limit, but JSON writes a control character as six bytes.
    body = 'name = "big"\ncommand = ' + _toml_list(["echo"] + ["\u0001" * 60_000] * 2) + "\n"
    body += "[env]\n" + "".join(f"V{i} = {json.dumps(chr(1) * 60_000)}\n" for i in range(2))
    err = load_error(tmp_path, body)
    assert err.field is None
    assert "a spec of at most 524288 bytes (512 KiB)" in str(err)


def test_sizes_at_the_limits_are_accepted(tmp_path: Path) -> None:
    arg = "x" * 65536
    spec = jobspec_from_toml(f'name = "ok"\ncommand = ["echo", "{arg}"]\n[env]\nA = "{arg}"\n')
    assert spec.command[1] == arg and dict(spec.env)["A"] == arg


def test_a_double_dash_argument_is_kept(tmp_path: Path) -> None:
    from tui.model.specform import form_values, merge_form, spec_from_form

    words = ["{python}", "train.py", "--", "--lr", "1", "--"]
    text = f'name = "dd"\ncommand = {_toml_list(words)}\n'
    assert load_jobspec(spec_file(tmp_path, text)).command == tuple(words)
    # Through the launch form: shown, edited as text, and read back.
    data = {"name": "dd", "command": words}
    shown = form_values(data)
    assert shown["command"] == "{python} train.py -- --lr 1 --"
    assert merge_form(data, shown)["command"] == words
    assert spec_from_form({}, {"name": "dd", "command": "a -- b --"}, None).command == (
        "a", "--", "b", "--"
    )
    # And in the job history's form of the spec.
    spec = load_jobspec(spec_file(tmp_path, text))
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))).command == tuple(words)


def test_cli_launch_of_a_too_big_spec_exits_2_and_records_no_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tui.cli.main import main
    from tui.control.history import History

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RIGDECK_HOME", str(tmp_path / "rigdeck"))
    monkeypatch.delenv("RIGDECK_INVENTORY", raising=False)
    path = spec_file(tmp_path, f'name = "big"\ncommand = ["echo", "{"x" * (1 << 20)}"]\n')
    assert main(["launch", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rigdeck: {path}: field 'command[1]': expected ") and len(err) < 400
    assert History().list() == []


# -- a spec as a client sends it to a server ------------------------------------------------------


EXAMPLE_SPECS = sorted(str(p) for p in (Path(__file__).resolve().parent.parent / "examples").glob("*/*.toml")
                       if p.name != "pipeline.toml")


@pytest.mark.parametrize("path", EXAMPLE_SPECS)
def test_every_example_spec_crosses_the_wire_checked_and_unchanged(path: str) -> None:
    import dataclasses

    from tui.model.jobspec import jobspec_from_wire

    spec = load_jobspec(path)
    assert jobspec_from_wire(spec.to_dict()) == dataclasses.replace(spec, path=None)


def test_a_wire_spec_goes_through_the_spec_files_checks_and_takes_no_server_field() -> None:
    from tui.model.jobspec import jobspec_from_wire

    good = JobSpec(name="ok", command=("python", "x.py"), workdir="/tmp", processes_per_node=1).to_dict()
    assert jobspec_from_wire(good).name == "ok"
    code = {"sync": "/src", "max_files": 10, "max_mb": 5, "follow_links": True, "tree": "a" * 64, "files": 3,
            "size": 9}
    synced = jobspec_from_wire({**good, "workdir": "/src", "code": code})
    assert synced.code is not None and synced.code.to_dict() == code and synced.workdir == "/src"
    bad = {
        "priority": ({**good, "priority": 10**12}, "field 'priority'"),
        "name": ({**good, "name": "a\x1b[31mb"}, "field 'name'"),
        "env": ({**good, "env": {"RIGDECK_JOB_ID": "x"}}, "field 'env'"),
        "unknown": ({**good, "owner": "alice"}, "field 'owner'"),
        "trial": ({**good, "trial": "3", "sweep_id": "s"}, "the server sets it"),
        "inputs": ({**good, "inputs": {"train": {"tree": "0" * 64}}}, "the server sets it"),
        "hosts": ({**good, "hosts": ["h1", "h1"]}, "field 'hosts'"),
        "code tree": ({**good, "code": {"sync": "/src", "tree": "../../x"}}, "field 'code.tree'"),
        "code sync": ({**good, "code": {"sync": "relative/dir"}}, "field 'code.sync'"),
        "not a dict": ([good], "a job spec"),
        "types": ({**good, "command": "rm -rf /"}, "field 'command'"),
    }
    for what, (d, said) in bad.items():
        with pytest.raises(JobSpecError, match=re.escape(said)):
            jobspec_from_wire(d)
            pytest.fail(what)


def test_env_from_file_is_checked_at_load_and_keeps_only_its_names(tmp_path: Path) -> None:
    """``env_from_file``: a file of NAME=value lines here, checked when the spec is (the spec
    file, the field, the env file and its line, what was expected; never a value); the spec keeps
    the file and the names, not the values; a server takes the path and the names."""
    from tui.model.jobspec import jobspec_from_wire, read_env_file

    (tmp_path / "s.env").write_text("# secrets\nWANDB_API_KEY=abc=def\n\nHF_TOKEN=hf-secret\n")
    spec = load_jobspec(spec_file(tmp_path, MINIMAL + 'env_from_file = "s.env"\n[env]\nA = "1"\n'))
    assert (spec.env_from_file, spec.env_file_names) == (str(tmp_path / "s.env"), ("WANDB_API_KEY", "HF_TOKEN"))
    assert read_env_file(str(tmp_path / "s.env")) == (("WANDB_API_KEY", "abc=def"), ("HF_TOKEN", "hf-secret"))
    stored = json.dumps(spec.to_dict())
    assert "hf-secret" not in stored and "abc=def" not in stored and JobSpec.from_dict(spec.to_dict()) == spec
    cases = {
        "no file": ("nope.env", None, "expected an existing file of NAME=value lines"),
        "no '='": ("b.env", "WANDB\n", "expected NAME=value lines"),
        "a bad name": ("b.env", "A B=secret-1\n", 'in {d}/b.env line 1, got "A B"'),
        "rigdeck's own": ("b.env", "OK=1\nRIGDECK_RANK=secret-2\n", "no RIGDECK_* name (rigdeck sets those for "
                          'every rank) in {d}/b.env line 2, got "RIGDECK_RANK"'),
        "twice": ("b.env", "X=secret-3\nX=secret-4\n", 'a name used once in {d}/b.env line 2, got "X"'),
        "also in [env]": ("b.env", "A=secret-5\n", "names not also in [env] ({d}/b.env and [env] both set A)"),
    }
    for what, (name, text, said) in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        e = load_error(tmp_path, MINIMAL + f'env_from_file = "{name}"\n[env]\nA = "1"\n')
        print(f"{what}: {e}")
        assert e.field == "env_from_file" and said.format(d=tmp_path) in str(e), (what, str(e))
        assert "secret" not in str(e)
    # A server takes the file's path and names (the values go apart: tests/test_server_accounts.py).
    carried = jobspec_from_wire(spec.to_dict())
    assert (carried.env_from_file, carried.env_file_names) == (spec.env_from_file, spec.env_file_names)
    # A server's spec error reaches a client's caller as a JobSpecError in the server's words.
    from tui.client import RemoteClient

    said = "<job spec>: field 'env_from_file': expected nothing in a sweep or a pipeline through a server (yet)"
    with pytest.raises(JobSpecError) as e:
        RemoteClient._result(None, {"error": {"type": "JobSpecError", "message": said}})  # type: ignore[arg-type]
    assert str(e.value) == said
