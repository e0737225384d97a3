"""tui/model/slurm.py and agent/slurmtext.py: Slurm's nodes and jobs read from its own output.

The files in tests/data/slurm/ are what Slurm printed (README.md there says which version and
command wrote each, and which were written by hand after an older version's format)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from agent import slurmtext
from agent.slurmtext import SlurmTextError
from tui.model.inventory import HostSpec, Inventory, SlurmSpec
from tui.model.slurm import (
    NODES_ARGS,
    SQUEUE_ARGS,
    SlurmJob,
    SlurmParseError,
    SlurmReadError,
    by_name,
    check_spec,
    drain_text,
    node_index,
    node_of,
    parse_jobs,
    parse_jobs_json,
    parse_nodes,
    parse_nodes_json,
    read_jobs,
    read_nodes,
)

DATA = Path(__file__).parent / "data" / "slurm"


def read(name: str) -> str:
    return (DATA / name).read_text()


# --------------------------------------------------------------------------------------------
# Slurm 22.05.8 on the bed: job 1 (root) holds 2 GPUs of every node, job 2 (nobody) 2 more of
# tb1-h2, job 3 (root, 3 nodes x 4 GPUs) pends for Resources, job 4 (nobody) for Priority;
# tb1-h3 is drained.


@pytest.mark.parametrize("name", ["nodes-22.05.8.txt", "nodes-22.05.8-d.txt", "nodes-22.05.8-do.txt"])
def test_nodes_of_slurm_22_05_text(name: str) -> None:
    nodes = parse_nodes(read(name))
    said = "-d" in name  # GresUsed comes with -d only
    assert [(n.name, n.short_state, n.gpus, n.gpus_used) for n in nodes] == [
        ("tb1-h1", "mix", 4, 2 if said else None), ("tb1-h2", "mix", 4, 4 if said else None),
        ("tb1-h3", "drng", 4, 2 if said else None)]
    h1, _, h3 = nodes
    assert (h1.hostname, h1.address, h1.partitions, h1.cpus, h1.cpus_alloc) == ("tb1-h1", "10.213.1.11", ("bed",), 8, 1)
    assert h1.usable and h1.reason is None and h1.gpus_used_idx is None  # 22.05 names no node's IDX
    assert (h3.state, h3.flags, h3.drained, h3.usable) == ("mixed", ("DRAIN",), True, False)
    assert (h3.reason, h3.reason_user, h3.reason_time) == (
        "rigdeck: h3 GPU 1 XID 79 (simulated)", "root", "2026-11-29T06:41:15")


def test_nodes_of_slurm_22_05_json() -> None:
    nodes = parse_nodes_json(read("sinfo-22.05.8.json"))
    assert [(n.name, n.short_state, n.gpus, n.gpus_used) for n in nodes] == [
        ("tb1-h1", "mix", 4, 2), ("tb1-h2", "mix", 4, 4), ("tb1-h3", "drng", 4, 2)]
    h3 = nodes[2]
    assert (h3.reason, h3.reason_user, h3.partitions) == ("rigdeck: h3 GPU 1 XID 79 (simulated)", "root", ("bed",))
    assert h3.reason_time is not None and h3.reason_time.startswith("2026-11-29T")
    text = by_name(parse_nodes(read("nodes-22.05.8-d.txt")))
    assert [dataclasses.replace(n, reason_time=None) for n in nodes] == [
        dataclasses.replace(text[n.name], reason_time=None) for n in nodes]


def test_jobs_of_slurm_22_05_text_and_json() -> None:
    jobs = parse_jobs(read("squeue-22.05.8.txt"))
    assert jobs == [
        SlurmJob("3", "root", "PENDING", "Resources", 3, (), 4),
        SlurmJob("4", "nobody", "PENDING", "Priority", 1, (), 2),
        SlurmJob("1", "root", "RUNNING", None, 3, ("tb1-h1", "tb1-h2", "tb1-h3"), 2),
        SlurmJob("2", "nobody", "RUNNING", None, 1, ("tb1-h2",), 2),
    ]
    assert sorted(parse_jobs_json(read("squeue-22.05.8.json")), key=lambda j: int(j.job_id)) == sorted(
        jobs, key=lambda j: int(j.job_id))


def test_a_jobs_gpus_on_each_node_of_slurm_22_05() -> None:
    assert slurmtext.job_node_gpus(read("job-22.05.8-d.txt")) == {"tb1-h2": [2, 3]}


# --------------------------------------------------------------------------------------------
# older text formats (written after those versions' output)


def test_nodes_of_slurm_20_11_with_typed_gres_and_a_drain() -> None:
    nodes = by_name(parse_nodes(read("nodes-20.11-d.txt")))
    busy, drained = nodes["gpu01"], nodes["gpu02"]
    assert (busy.state, busy.flags, busy.gpus, busy.gpus_used, busy.gpus_used_idx) == ("mixed", (), 4, 2, (0, 2))
    assert busy.reason is None and busy.usable and busy.short_state == "mix"
    assert busy.partitions == ("gpu", "debug") and (busy.cpus, busy.cpus_alloc) == (32, 8)
    assert (drained.state, drained.flags, drained.short_state, drained.usable) == ("idle", ("DRAIN",), "drain", False)
    assert drained.reason == "GPU 3 ECC errors, see ticket 4411"
    assert (drained.reason_user, drained.reason_time) == ("admin", "2021-07-12T16:40:03")
    assert (drained.gpus_used, drained.gpus_used_idx) == (0, ())


def test_nodes_of_slurm_17_11_down_and_draining() -> None:
    nodes = by_name(parse_nodes(read("nodes-17.11.txt")))
    down, draining = nodes["node001"], nodes["node002"]
    assert (down.state, down.down, down.short_state, down.reason, down.reason_user) == (
        "down", True, "down", "Not responding", "slurm")
    assert (draining.state, draining.flags, draining.short_state) == ("allocated", ("DRAIN",), "drng")
    assert draining.gpus == 4 and draining.gpus_used_idx is None  # no -d: which GPUs is not said


def test_jobs_of_slurm_20_11() -> None:
    jobs = parse_jobs(read("squeue-20.11.txt"))
    assert jobs[0] == SlurmJob("4410", "alice", "RUNNING", None, 2, ("gpu01", "gpu02"), 4)
    assert (jobs[1].pending, jobs[1].reason, jobs[1].nodes, jobs[1].gpus_per_node) == (True, "Resources", (), 2)
    assert (jobs[2].job_id, jobs[2].reason) == ("4412_3", "QOSMaxGRESPerUser")
    assert jobs[3].gpus_per_node == 0


# --------------------------------------------------------------------------------------------
# bad output: an error naming what was expected


@pytest.mark.parametrize(("text", "expected"), [
    ("slurm_load_node error: Unable to contact slurm controller", "expected a record starting with NodeName="),
    ("NodeName=a CPUTot=4", "node a: expected a State= field"),
    ("NodeName=a State=IDLE Gres=gpu:a:b:c", "node a: expected a GRES like gpu:2"),
    ("NodeName=a State=+ Gres=gpu:1", "node a: expected State= like IDLE or MIXED+DRAIN"),
])
def test_node_text_it_cannot_read_says_what_it_expected(text: str, expected: str) -> None:
    with pytest.raises(SlurmParseError, match="^scontrol show nodes: .*" + re.escape(expected)):
        parse_nodes(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)", "expected 7 columns"),
    ("12|bob|RUNNING|None|1|gpu:2", "expected 7 columns"),
    ("abc|bob|RUNNING|None|1|gpu:2|n1", "expected a job id"),
    ("12|bob|running now|None|1|gpu:2|n1", "expected a job state like RUNNING"),
    ("12|bob|RUNNING|None|1|gpu:2|n[1-", "expected a host list like node[1-3]"),
])
def test_squeue_text_it_cannot_read_says_what_it_expected(text: str, expected: str) -> None:
    with pytest.raises(SlurmParseError, match=f"^{SQUEUE_ARGS[0]} .*line 1: {re.escape(expected)}"):
        parse_jobs(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("not json", "expected JSON"),
    ('{"meta": {}}', "expected an object with a 'nodes' list"),
    ('{"nodes": [{"state": "idle"}]}', "expected every node to have a name"),
    ('{"nodes": [], "errors": [{"error": "Unable to contact slurm controller"}]}', "Slurm said"),
    ('{"nodes": [{"name": "a", "state": 3}]}', "node a: expected state to be a word"),
])
def test_node_json_it_cannot_read_says_what_it_expected(text: str, expected: str) -> None:
    with pytest.raises(SlurmParseError, match=f"^sinfo --json: .*{re.escape(expected)}"):
        parse_nodes_json(text)


def test_squeue_json_it_cannot_read_says_what_it_expected() -> None:
    with pytest.raises(SlurmParseError, match="^squeue --json: expected every job to have a numeric job_id"):
        parse_jobs_json('{"jobs": [{"job_id": "x"}]}')


# --------------------------------------------------------------------------------------------
# the pieces


@pytest.mark.parametrize(("text", "hosts"), [
    ("tb1-h[1-3]", ["tb1-h1", "tb1-h2", "tb1-h3"]),
    ("gpu[01-02,10],cpu7", ["gpu01", "gpu02", "gpu10", "cpu7"]),
    ("(null)", []),
    ("a[1]-ib", ["a1-ib"]),
])
def test_hostlists(text: str, hosts: list[str]) -> None:
    assert slurmtext.hostlist(text) == hosts


@pytest.mark.parametrize(("text", "count", "idx"), [
    ("gpu:4", 4, None),
    ("gpu:4(S:0)", 4, None),
    ("gpu:2(IDX:0-1)", 2, [0, 1]),
    ("gpu:a100:1(IDX:3),gpu:v100:1(IDX:0)", 2, [0, 3]),
    ("gpu:0(IDX:N/A)", 0, []),
    ("gres:gpu:2", 2, None),
    ("(null)", 0, None),
    ("shard:8,gpu:1(IDX:2)", 1, [2]),
])
def test_gres_strings(text: str, count: int, idx: list[int] | None) -> None:
    assert slurmtext.gres(text) == (count, idx)


@pytest.mark.parametrize("after", ["", " Comment=(null)"])
def test_a_reason_holds_spaces_and_equals_signs(after: str) -> None:
    (node,) = parse_nodes("NodeName=n1 State=IDLE+DRAIN "
                          f"Reason=rigdeck: h2 GPU 1 XID 79 (a=b) x=y [root@2026-01-02T03:04:05]{after}")
    assert (node.reason, node.reason_user, node.reason_time) == ("rigdeck: h2 GPU 1 XID 79 (a=b) x=y", "root",
                                                                 "2026-01-02T03:04:05")


def test_gres_it_cannot_read() -> None:
    with pytest.raises(SlurmTextError, match="expected GPU indices like 0-1,3"):
        slurmtext.gres("gpu:2(IDX:a-b)")


def test_a_host_finds_its_node_by_name_hostname_or_address() -> None:
    nodes = parse_nodes(read("nodes-22.05.8.txt"))
    assert node_of(nodes, "h1", "tb1-h1", "10.213.1.11") is nodes[0]  # by hostname
    assert node_of(nodes, "h2", None, "10.213.1.12") is nodes[1]  # by address
    assert node_of(nodes, "tb1-h3") is nodes[2]  # by name
    assert node_of(nodes, "h9", "elsewhere") is None
    assert drain_text(nodes[0]) is None
    assert drain_text(nodes[2]) == ("drained in Slurm: rigdeck: h3 GPU 1 XID 79 (simulated) "
                                    "(by root at 2026-11-29T06:41:15)")
    (down,) = [n for n in parse_nodes(read("nodes-17.11.txt")) if n.down]
    assert drain_text(down) == "down in Slurm: Not responding (by slurm at 2018-03-02T08:00:41)"


def test_node_index_finds_what_node_of_finds() -> None:
    nodes = parse_nodes(read("nodes-22.05.8.txt"))
    find = node_index(nodes)
    for names in (("h1", "tb1-h1", "10.213.1.11"), ("h2", None, "10.213.1.12"), ("tb1-h3",), ("h9", "elsewhere"),
                  ("h1", "elsewhere", "10.213.1.13")):
        assert find(*names) is node_of(nodes, *names), names


# --------------------------------------------------------------------------------------------
# Reading Slurm on the login host through a client's exec, and the [slurm] table checked


def slurm_inventory(**slurm: str) -> Inventory:
    hosts = tuple(HostSpec(name=f"h{i}", address=f"10.213.1.{10 + i}", user="root", python="python3")
                  for i in (1, 2))
    return Inventory(hosts=hosts, path=Path("/inv/hosts.toml"), known_hosts=Path("/inv/known_hosts"),
                     slurm=SlurmSpec(**slurm))


class Answers:
    """An agent pool's ``exec`` answering each argv as given (what the agent returns: exit code,
    stdout, stderr, error); every call kept."""

    def __init__(self, answers: dict[tuple[str, ...], dict[str, object]]) -> None:
        self.answers, self.calls = answers, []  # type: ignore[var-annotated]

    def __call__(self, hosts: list[str], argv: list[str], timeout_s: float) -> dict[str, object]:
        self.calls.append((list(hosts), list(argv)))
        missing = {"exit_code": 127, "stdout": "", "stderr": "", "error": f"{argv[0]}: No such file or directory"}
        return {h: self.answers.get(tuple(argv), missing) for h in hosts}


def ok(stdout: str) -> dict[str, object]:
    return {"exit_code": 0, "stdout": stdout, "stderr": ""}


def failed(stderr: str, code: int = 1) -> dict[str, object]:
    return {"exit_code": code, "stdout": "", "stderr": stderr + "\n"}


def test_nodes_and_queue_are_read_on_the_login_host() -> None:
    ex = Answers({NODES_ARGS: ok(read("nodes-22.05.8-do.txt")), SQUEUE_ARGS: ok(read("squeue-22.05.8.txt"))})
    inv = slurm_inventory(login="h2")
    assert [n.name for n in read_nodes(ex, inv)] == ["tb1-h1", "tb1-h2", "tb1-h3"]
    jobs = read_jobs(ex, inv)
    assert [(j.job_id, j.state, j.reason) for j in jobs if j.pending] == [("3", "PENDING", "Resources"),
                                                                         ("4", "PENDING", "Priority")]
    assert ex.calls == [(["h2"], list(NODES_ARGS)), (["h2"], list(SQUEUE_ARGS))]
    # no login: the first host
    read_nodes(ex, slurm_inventory())
    assert ex.calls[-1][0] == ["h1"]


@pytest.mark.parametrize("answer, said", [
    ({"exit_code": 127, "stdout": "", "stderr": "", "error": "scontrol: No such file or directory"},
     "Slurm's nodes not read on h1: scontrol -o show nodes: scontrol: No such file or directory"),
    (failed("slurm_load_node error: Unable to contact slurm controller (connect failure)"),
     "Slurm's nodes not read on h1: scontrol -o show nodes: slurm_load_node error: Unable to contact slurm "
     "controller (connect failure)"),
    (ok("no records here"), "Slurm's nodes not read on h1: scontrol -o show nodes: expected a record starting with "
                             "NodeName=, got 'no records here'"),
])
def test_a_failed_read_says_where_which_command_and_what_it_said(answer: dict[str, object], said: str) -> None:
    with pytest.raises(SlurmReadError) as e:
        read_nodes(Answers({NODES_ARGS: answer}), slurm_inventory())
    assert str(e.value).startswith(said), str(e.value)


def test_a_login_that_is_no_inventory_host_is_said() -> None:
    with pytest.raises(SlurmReadError, match=r"\[slurm\] login 'hpc-login': .* 'hpc-login' is none \(h1, h2\)"):
        read_nodes(Answers({}), slurm_inventory(login="hpc-login"))


def test_a_client_that_runs_nothing_on_hosts_is_said() -> None:
    def exec_(hosts: list[str], argv: list[str], timeout_s: float) -> dict[str, object]:
        raise NotImplementedError

    with pytest.raises(SlurmReadError, match="this client runs no command on a host"):
        read_nodes(exec_, slurm_inventory())


PARTITIONS = ("PartitionName=bed AllowGroups=ALL AllowAccounts=ALL Default=YES State=UP TotalNodes=3\n"
              "PartitionName=debug AllowGroups=ALL State=UP TotalNodes=1\n")
SLURM_UP = {("scontrol", "-o", "show", "partition"): ok(PARTITIONS),
            ("scontrol", "--version"): ok("slurm-wlm 22.05.8\n")}
NO_DBD = failed("sacctmgr: error: Problem talking to the database: Connection refused")


def test_a_known_partition_passes_and_account_and_qos_are_not_checked_without_slurmdbd() -> None:
    answers = dict(SLURM_UP)
    answers[("sacctmgr", "--noheader", "--parsable2", "show", "account", "proj-17", "format=Account")] = NO_DBD
    checked = check_spec(Answers(answers), slurm_inventory(partition="debug", account="proj-17"))
    assert checked.errors == ()
    assert checked.notes == ("/inv/hosts.toml: [slurm] account 'proj-17' not checked: Slurm has no accounting "
                             "database here (sacctmgr: sacctmgr: error: Problem talking to the database: "
                             "Connection refused); sbatch checks it when a job is submitted",)


def test_an_unknown_partition_names_the_field_and_what_slurm_said() -> None:
    answers = dict(SLURM_UP)
    answers[("scontrol", "-o", "show", "partition", "gpu")] = failed("Partition gpu not found")
    checked = check_spec(Answers(answers), slurm_inventory(partition="gpu"))
    assert checked.errors == ("/inv/hosts.toml: [slurm] partition 'gpu': Slurm has no such partition: "
                              "Partition gpu not found (its partitions: bed, debug)",)


def test_an_unknown_account_or_qos_in_slurms_database_is_named() -> None:
    answers = dict(SLURM_UP)
    answers[("sacctmgr", "--noheader", "--parsable2", "show", "account", "proj-17", "format=Account")] = ok("")
    answers[("sacctmgr", "--noheader", "--parsable2", "show", "qos", "High", "format=Name")] = ok("high\n")
    checked = check_spec(Answers(answers), slurm_inventory(account="proj-17", qos="High"))
    assert checked.errors == ("/inv/hosts.toml: [slurm] account 'proj-17': Slurm's accounting database has no "
                              "such account (sacctmgr show account proj-17 lists none)",)  # QoS names: any case
    assert checked.notes == ()


@pytest.mark.parametrize("answers, error", [
    ({}, "/inv/hosts.toml: [slurm] login 'h1': no Slurm commands there: scontrol: No such file or directory"),
    ({("scontrol", "-o", "show", "partition"): failed("scontrol: error: resolve_ctls_from_dns_srv: res_nsearch "
                                                      "error: Unknown host\nscontrol: error: fetch_config: "
                                                      "DNS SRV lookup failed")},
     "/inv/hosts.toml: [slurm] login 'h1': Slurm's commands there reach no Slurm cluster: scontrol -o show "
     "partition: scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host scontrol: error: "
     "fetch_config: DNS SRV lookup failed"),
])
def test_a_login_without_slurm_is_named_before_anything_else(answers: dict[tuple[str, ...], dict[str, object]],
                                                             error: str) -> None:
    ex = Answers(answers)
    checked = check_spec(ex, slurm_inventory(partition="gpu"))
    assert checked.errors == (error,)
    assert all(argv[0] == "scontrol" and "gpu" not in argv for _, argv in ex.calls)  # nothing more asked


@pytest.mark.parametrize(("said", "version"), [("slurm 20.11.9\n", (20, 11, 9)), ("slurm-wlm 22.05.8\n", (22, 5, 8)),
                                               ("slurm 23.11.0-0rc1\n", (23, 11, 0)), ("slurm 24.05\n", (24, 5))])
def test_a_slurm_new_enough_passes_with_its_version(said: str, version: tuple[int, ...]) -> None:
    checked = check_spec(Answers({**SLURM_UP, ("scontrol", "--version"): ok(said)}), slurm_inventory())
    assert (checked.errors, checked.notes, checked.version) == ((), (), version)


@pytest.mark.parametrize("said", ["slurm 20.02.7\n", "slurm 17.11.2\n"])
def test_a_slurm_too_old_is_refused_naming_its_version_and_what_rigdeck_needs(said: str) -> None:
    ex = Answers({**SLURM_UP, ("scontrol", "--version"): ok(said)})
    checked = check_spec(ex, slurm_inventory(partition="gpu"))
    old = said.split()[1]
    assert checked.errors == (f"/inv/hosts.toml: [slurm] login 'h1': Slurm {old} "
                              "there is older than rigdeck drives: expected Slurm 20.11 or newer (srun's --overlap "
                              "for an mpirun job's daemons, and squeue's and scontrol's output as rigdeck reads it)",)
    assert not any("gpu" in argv for _, argv in ex.calls)  # nothing more asked


@pytest.mark.parametrize("answer", [failed("scontrol: unrecognized option '--version'"), ok("no digits\n")])
def test_a_version_slurm_does_not_say_is_a_note_not_an_error(answer: dict[str, object]) -> None:
    checked = check_spec(Answers({**SLURM_UP, ("scontrol", "--version"): answer}), slurm_inventory())
    assert checked.errors == () and checked.version is None
    assert len(checked.notes) == 1 and "Slurm's version not read (scontrol --version: " in checked.notes[0]
    assert checked.notes[0].endswith("rigdeck needs 20.11 or newer")


# -- a job rigdeck submits: sbatch's options, the allocation read back -----------------------------


def test_job_detail_reads_state_nodes_and_gpus_of_a_recorded_job() -> None:
    from tui.model.slurm import parse_job_detail

    d = parse_job_detail(read("job-22.05.8-d.txt"))
    assert (d.job_id, d.state, d.reason, d.nodes, dict(d.gpus), d.ended) == (
        "2", "RUNNING", None, ("tb1-h2",), {"tb1-h2": (2, 3)}, False)


def test_job_detail_of_a_pending_and_an_ended_job() -> None:
    from tui.model.slurm import parse_job_detail

    text = read("job-22.05.8-d.txt")
    pending = text.replace("JobState=RUNNING Reason=None", "JobState=PENDING Reason=Resources").replace(
        "NodeList=tb1-h2", "NodeList=(null)").replace("     Nodes=tb1-h2 CPU_IDs=1 Mem=0 GRES=gpu:2(IDX:2-3)\n", "")
    d = parse_job_detail(pending)
    assert (d.state, d.reason, d.nodes, dict(d.gpus)) == ("PENDING", "Resources", (), {})
    assert parse_job_detail(text.replace("JobState=RUNNING", "JobState=CANCELLED")).ended
    with pytest.raises(SlurmParseError, match="scontrol -d show job: expected a record starting with JobId="):
        parse_job_detail("slurm_load_jobs error: Invalid job id specified\n")


def test_sbatch_options_name_each_value_once_and_round_the_time_up() -> None:
    from tui.model.slurm import sbatch_options, slurm_time

    assert slurm_time(1) == "0-00:01:00" and slurm_time(3600) == "0-01:00:00" and slurm_time(90061) == "1-01:02:00"
    assert sbatch_options("j-1", nodes=3, gpus_per_node=2, runtime_s=900, partition="bed", qos="hi") == [
        "--nodes=3", "--ntasks-per-node=1", "--job-name=rigdeck:j-1", "--time=0-00:15:00", "--gres=gpu:2",
        "--partition=bed", "--qos=hi"]
    assert sbatch_options("j", nodes=1, gpus_per_node=None, runtime_s=61) == [
        "--nodes=1", "--ntasks-per-node=1", "--job-name=rigdeck:j", "--time=0-00:02:00"]
    assert sbatch_options("j", nodes=1, gpus_per_node=None, runtime_s=61, exclude=["n3", "n2", "n3"])[-1] == (
        "--exclude=n2,n3")


# --------------------------------------------------------------------------------------------
# accounting: sacct as rigdeck asks for it (tui.model.slurm.sacct_args), where slurmdbd keeps it


SACCT = (
    "7|root|root|COMPLETED|1796000000|1796000600|billing=2,cpu=2,gres/gpu=4,mem=8000M,node=2|rigdeck:ddp-1\n"
    "8|nobody||CANCELLED by 0|1796000100|1796000160|billing=1,cpu=1,gres/gpu:a100=1,gres/gpu:h100=2,node=1|big|run\n"
    "9|nobody||RUNNING|1796000300|Unknown|cpu=1,gres/gpu=2,node=1|live\n"
    "10|root||PENDING|Unknown|Unknown||waits\n"
)


def test_sacct_of_every_users_jobs_with_their_gpus_and_times() -> None:
    from tui.model.slurm import SacctJob, parse_sacct, sacct_args, sacct_usage_records
    from tui.model.usage import usage_report

    jobs = parse_sacct(SACCT)
    assert jobs == [
        SacctJob("7", "root", "root", "COMPLETED", 1796000000.0, 1796000600.0, 4, "rigdeck:ddp-1"),
        SacctJob("8", "nobody", "", "CANCELLED by 0", 1796000100.0, 1796000160.0, 3, "big|run"),
        SacctJob("9", "nobody", "", "RUNNING", 1796000300.0, None, 2, "live"),
        SacctJob("10", "root", "", "PENDING", None, None, 0, "waits")]
    assert jobs[0].rigdeck_job == "ddp-1" and jobs[1].rigdeck_job is None
    # as usage figures: the rigdeck job under its own id, the pending one holds nothing
    now = 1796000900.0
    report = usage_report(sacct_usage_records(jobs), by="job", now=now)
    assert {r.key: round(r.gpu_hours * 3600) for r in report.rows} == {
        "ddp-1": 4 * 600, "slurm:8": 3 * 60, "slurm:9": 2 * 600}
    by_user = usage_report(sacct_usage_records(jobs), by="user", now=now, since=1796000500.0)
    assert {r.key: round(r.gpu_hours * 3600) for r in by_user.rows} == {"root": 4 * 100, "nobody": 2 * 400}
    # the times as epoch seconds through env (no shell); the window as Slurm's own "now-N"
    args = sacct_args(3600.0)
    assert args[:3] == ("env", "SLURM_TIME_FORMAT=%s", "sacct") and "--starttime=now-3600seconds" in args
    assert "--allusers" in args and "--allocations" in args and "--parsable2" in args
    assert "--starttime=1970-01-02T00:00:00" in sacct_args(None)


@pytest.mark.parametrize("text, expected", [
    ("7|root|root|COMPLETED|1796000000\n", "line 1: expected 8 fields"),
    ("x7|root||COMPLETED|1|2|gres/gpu=1|n\n", "expected a job id"),
    ("7|root||COMPLETED|2026-11-30T04:00:00|2|gres/gpu=1|n\n", "expected epoch seconds"),
    ("7|root||COMPLETED|1|2|gres/gpu=two|n\n", "expected a GPU count"),
])
def test_sacct_text_it_cannot_read_says_what_it_expected(text: str, expected: str) -> None:
    from tui.model.slurm import parse_sacct

    with pytest.raises(SlurmParseError, match=expected):
        parse_sacct(text)


def test_usage_says_whose_figures_they_are() -> None:
    from tui.model.usage import UsageReport, UsageRow, report_lines

    rows = (UsageRow("nobody", 2.0, 3, 0),)
    slurm = report_lines(UsageReport(by="user", since=None, now=0.0, rows=rows, source="sacct on h1"))
    assert slurm[0] == "from Slurm's accounting (sacct on h1): every user's Slurm jobs"
    assert slurm[1] == "GPU hours by user, all time"
    own = report_lines(UsageReport(by="user", since=None, now=0.0, rows=rows, note="sacct said no"))
    assert own[:2] == ["(sacct said no)", "GPU hours by user, all time"]
    assert report_lines(UsageReport(by="user", since=None, now=0.0, rows=rows))[0] == "GPU hours by user, all time"
