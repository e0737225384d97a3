"""The typed agent client (one method per agent RPC) and the one job reader (logs and metrics)."""

from __future__ import annotations

import ast
import inspect
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tui.control.reader import JobReader, LineJoiner
from tui.model.metrics import newest_attempts
from tui.remote.agentclient import AgentClient, AgentFleet, LogChunk, MetricsPart, TypedAgents

ROOT = Path(__file__).resolve().parent.parent


def daemon_rpcs() -> set[str]:
    """The method names of agent/daemon.py's dispatch table (``self.methods = {...}``)."""
    tree = ast.parse((ROOT / "agent" / "daemon.py").read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Attribute) and t.attr == "methods" for t in node.targets)):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise AssertionError("no dispatch table in agent/daemon.py")


def test_the_client_has_one_documented_method_per_agent_rpc() -> None:
    rpcs = daemon_rpcs()
    assert {"job_status", "job_metrics", "sample", "route_source"} <= rpcs
    public = {n for n, f in inspect.getmembers(AgentClient, inspect.isfunction) if not n.startswith("_")}
    assert rpcs == public, f"missing {sorted(rpcs - public)}, not an RPC {sorted(public - rpcs)}"
    for name in rpcs:
        fn = getattr(AgentClient, name)
        assert fn.__doc__, name
        params = inspect.signature(fn).parameters
        assert all(p.kind is p.KEYWORD_ONLY for n, p in params.items() if n != "self"), name
        assert "timeout" in params, name
    # The fleet's methods are RPCs too, with the same parameters.
    for name, fn in inspect.getmembers(AgentFleet, inspect.isfunction):
        if not name.startswith("_"):
            assert name in rpcs and fn.__doc__, name
            assert list(inspect.signature(fn).parameters) == list(
                inspect.signature(getattr(AgentClient, name)).parameters)


def test_rpc_names_are_written_only_in_the_client() -> None:
    """No module of tui/ but agentclient.py calls an agent RPC by its name."""
    rpcs = daemon_rpcs()
    found = []
    for path in (ROOT / "tui").rglob("*.py"):
        if path == ROOT / "tui" / "remote" / "agentclient.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name not in ("request", "request_many"):
                continue
            for arg in node.args:
                if isinstance(arg, ast.Constant) and arg.value in rpcs:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}({arg.value!r})")
    assert not found, found


class _Recorder(TypedAgents):
    """The controller's untyped path, recorded: what the typed methods send."""

    def __init__(self, answers: dict[str, Any]):
        self.answers = answers
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    def request(self, host: str, method: str, timeout: float = 30.0, **params: Any) -> Any:
        self.sent.append((host, method, {"timeout": timeout, **params}))
        return self.answers[method]

    def request_many(self, hosts: list[str], method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        from tui.remote.transport import TransportError

        self.sent.append((",".join(hosts), method, {"timeout": timeout, **params}))
        return {h: TransportError(h, "down") if h == "dead" else self.answers[method] for h in hosts}


def test_typed_methods_send_the_daemons_parameter_names_and_read_typed_answers() -> None:
    import base64

    ctl = _Recorder({
        "job_logs": {"rank": 1, "offset": 5, "next_offset": 9, "more": True, "partial": True,
                     "b64": base64.b64encode(b"ab\xff").decode()},
        "job_metrics": {"0": {"source": "metrics", "records": [{"step": 1}], "next_offset": 12, "more": False,
                              "offset_key": "0"}},
        "job_check": {"problems": ["GPU 0 on h1 is held by x"], "free_mb": 10.5},
        "job_stop": {"state": "stopping"},
        "probe_port": {"port": 29500},
        "route_source": {"address": None},
        "upgrade": {"scheduled": "when-idle"},
    })
    a = ctl.agent("h1")
    chunk = a.job_logs(job_id="j", rank=1, offset=5, binary=True, timeout=20)
    assert chunk == LogChunk(rank=1, offset=5, next_offset=9, more=True, partial=True, text="", data=b"ab\xff")
    assert ctl.sent[-1] == ("h1", "job_logs", {"timeout": 20, "job_id": "j", "rank": 1, "offset": 5, "binary": True})
    parts = a.job_metrics(job_id="j", offsets={"0": 3})
    assert parts == {"0": MetricsPart([{"step": 1}], 12, False, "metrics", "0")}
    assert ctl.sent[-1] == ("h1", "job_metrics", {"timeout": 30.0, "job_id": "j", "offsets": {"0": 3}})
    assert a.job_check(job_id="j", gpus=(0,), min_free_mb=5).problems == ("GPU 0 on h1 is held by x",)
    assert ctl.sent[-1][2] == {"timeout": 30.0, "job_id": "j", "gpus": [0], "min_free_mb": 5}
    assert a.probe_port(addr="10.0.0.1") == 29500 and a.route_source(peer="10.0.0.2") is None
    assert a.upgrade(path="/x/agent.pyz") == "when-idle"
    got = ctl.agents(["h1", "dead"]).job_stop(job_id="j", grace_s=5.0, timeout=20)
    assert got["h1"].state == "stopping" and type(got["dead"]).__name__ == "TransportError"  # type: ignore[union-attr]
    assert ctl.sent[-1] == ("h1,dead", "job_stop", {"timeout": 20, "job_id": "j", "grace_s": 5.0})
    assert ctl.agents([]).job_status(job_id="j") == {}


# -- the reader -------------------------------------------------------------------------------


def test_the_joiner_keeps_complete_lines_of_a_final_piece_whole() -> None:
    """A rank that ended without a newline: its last chunk is partial yet holds complete lines;
    they are lines now (never cut to the kept width as if one), its unterminated end waits."""
    j = LineJoiner(keep=10)
    long_lines = "".join(f"line {i:04d} of many\n" for i in range(50))
    assert j.feed("k", long_lines + "progress 99%", True) == [f"line {i:04d} of many" for i in range(50)]
    assert j.feed("k", "", False) == ["progress 9 [... 2 more characters]"]
    whole = LineJoiner()  # rigdeck logs: whole lines
    assert whole.feed("k", "x" * 20, True) == [] and whole.feed("k", "y\r\nz\n", False) == ["x" * 20 + "y", "z"]
    assert whole.feed("k", "tail", True) == [] and whole.flush() == [("k", "tail")]


def test_newest_attempts_keep_a_steps_record_from_its_last_attempt() -> None:
    recs = [{"rank": 0, "step": 1, "restart": 0}, {"rank": 1, "step": 1, "restart": 0},
            {"rank": 0, "event": "checkpoint", "step": 1}, {"rank": 0, "step": 1, "restart": 1}]
    assert newest_attempts(recs) == recs[1:]


class _OldAgent(TypedAgents):
    """An agent from before offset keys: one offset per rank, into the rank's parsed output
    until its metrics file appears, then into the metrics file."""

    def __init__(self) -> None:
        self.stdout = [{"step": 0, "loss": 3.0}, {"step": 1, "loss": 2.0}]
        self.metrics: list[dict[str, Any]] | None = None  # the metrics file, once it exists

    def request(self, host: str, method: str, timeout: float = 30.0, **params: Any) -> Any:
        assert method == "job_metrics"
        off = params["offsets"].get("0", 0)
        recs, source = (self.stdout, "stdout") if self.metrics is None else (self.metrics, "metrics")
        return {"0": {"source": source, "records": [dict(r) for r in recs[off:]], "next_offset": len(recs),
                      "more": False}}

    def request_many(self, hosts: list[str], method: str, timeout: float = 30.0, **params: Any) -> Any:
        raise AssertionError(method)


def test_an_old_agents_metrics_file_is_read_from_its_start_once_it_appears() -> None:
    agent = _OldAgent()
    reader = JobReader(agent, "j")
    assert [r["loss"] for r in reader.metrics(["h1"])] == [3.0, 2.0]
    # The rank's own metrics file appears, with three records: the old agent would read it from
    # the output's offset (2) and skip two of them.
    agent.metrics = [{"step": 0, "loss": 3.1}, {"step": 1, "loss": 2.1}, {"step": 2, "loss": 1.1}]
    assert [r["loss"] for r in reader.metrics(["h1"])] == [3.1, 2.1, 1.1]
    assert reader.metrics(["h1"]) == []


class _SweepAgent(TypedAgents):
    """An agent answering ``job_metrics`` with a sweep's parts: a rank's own, the metric
    definitions' (``"0/defs"``) and hypertune's (``"2/hypertune"``, offset a time in µs)."""

    def __init__(self) -> None:
        self.asked: list[dict[str, int]] = []

    def request(self, host: str, method: str, timeout: float = 30.0, **params: Any) -> Any:
        assert method == "job_metrics"
        self.asked.append(dict(params["offsets"]))
        if len(self.asked) > 1:
            return {}
        return {
            "1": {"source": "metrics", "records": [{"step": 3, "loss": 0.5}], "next_offset": 40, "more": False,
                  "offset_key": "1"},
            "0/defs": {"source": "metric_definitions", "records": [{"rank": 0, "step": 3, "acc": 0.9}],
                       "next_offset": 52, "more": False, "offset_key": "0/defs"},
            "2/hypertune": {"source": "hypertune", "records": [{"step": 3, "acc": 0.8}],
                            "next_offset": 1_700_000_000_123_456, "more": False, "offset_key": "2/hypertune"},
        }

    def request_many(self, hosts: list[str], method: str, timeout: float = 30.0, **params: Any) -> Any:
        raise AssertionError(method)


def test_a_sweeps_metrics_parts_keep_their_rank_and_their_own_offsets() -> None:
    agent = _SweepAgent()
    reader = JobReader(agent, "j")
    got = [(r["rank"], r["host"], r.get("loss"), r.get("acc")) for r in reader.metrics(["h1"])]
    assert got == [(1, "h1", 0.5, None), (0, "h1", None, 0.9), (2, "h1", None, 0.8)]
    assert reader.metrics(["h1"]) == []
    assert agent.asked[-1] == {"1": 40, "0/defs": 52, "2/hypertune": 1_700_000_000_123_456}


# -- against a real agent on this machine -----------------------------------------------------


def test_every_rpc_reaches_a_real_agent(tmp_path: Path) -> None:
    """Each typed method against the daemon (local transport): the names and parameters are the
    ones its handlers read, and the answers parse."""
    from tui.control.hostlinks import HostLinks
    from tui.model.inventory import HostSpec, Inventory
    from tui.remote.agentlink import AgentError
    from tui.remote.bundle import build_agent

    spec = HostSpec(name="here", address="localhost", transport="local", python=sys.executable,
                    state_dir=str(tmp_path / "state"), sim_gpus=2)
    bundle = build_agent(tmp_path / "cache")
    with HostLinks(Inventory(hosts=(spec,), path=None, known_hosts=tmp_path / "kh"),
                    bundle_factory=lambda: bundle) as ctl:
        a = ctl.agent("here")
        assert abs(a.ping() - time.time()) < 60
        assert a.version().agent_version == bundle.version
        facts = a.facts()
        assert facts.cpus and facts.raw["deployed_version"] == bundle.version
        assert len(a.sample(timeout=30).get("gpus") or []) == 2
        assert a.subscribe(rate_hz=2) == pytest.approx(2.0)
        assert a.set_rate(rate_hz=1) == pytest.approx(1.0)
        a.unsubscribe()
        with pytest.raises(AgentError) as e:
            a.upgrade(path=str(tmp_path / "no-such.pyz"))
        assert e.value.code == "bad_params"
        port = a.probe_port(addr="127.0.0.1")
        assert 0 < port < 65536
        assert a.route_source(peer="127.0.0.1") in (None, "127.0.0.1")

        job_id = f"client-{int(time.time())}"
        assert a.job_check(job_id=job_id, gpus=[0], min_free_mb=1).problems == ()
        assert a.job_claim(job_id=job_id, gpus=[0, 1]) == [0, 1]
        assert a.job_release(job_id=job_id) is True
        script = ("import json, os, sys, time; print('x' * 300000); print('loss=0.5 acc=0.75')\n"
                  "with open(os.environ['CLOUD_ML_HP_METRIC_FILE'], 'w') as f:\n"  # as cloudml-hypertune
                  "    f.write(json.dumps({'timestamp': time.time(), 'trial': '2', 'acc': '0.8',"
                  " 'global_step': '1'}) + '\\n')\n"
                  "sys.stdout.write('done')")
        node = {"host": "here", "address": "127.0.0.1", "slots": 1, "gpus": []}
        started = a.job_start(plan={"job_id": job_id, "launcher": "direct", "nodes": [node], "node_index": 0,
                                    "master_addr": "127.0.0.1", "master_port": port, "workdir": str(tmp_path),
                                    "command": [sys.executable, "-c", script], "trial": "2",
                                    "metric_definitions": [{"name": "acc", "regex": r"acc=([0-9.]+)"}]})
        assert started.job_dir and started.jobhost_pid
        deadline = time.monotonic() + 60
        while a.job_status(job_id=job_id).get("state") != "succeeded":
            assert time.monotonic() < deadline, a.job_status(job_id=job_id)
            time.sleep(0.2)
        assert [j["job_id"] for j in a.job_list()] == [job_id]
        assert a.job_stop(job_id=job_id, grace_s=1.0).state == "succeeded"

        # The reader over it: a 300,000-character line comes in pieces and is one line.
        reader = JobReader(ctl, job_id)
        st = reader.status("here")
        chunks = list(reader.log_chunks("here", 0))
        assert len(chunks) >= 2 and chunks[0].partial and not chunks[-1].more
        lines = [ln for c in chunks for ln in reader.lines("here", 0, c)] + [ln for _, ln in reader.joiner.flush()]
        assert lines == ["x" * 300000, "loss=0.5 acc=0.75", "done"], [len(ln) for ln in lines]
        assert list(reader.log_chunks("here", 0))[0].text == ""  # read to the end: nothing twice
        metrics = reader.all_metrics(["here"])
        got = sorted((r["source"] if "source" in r else "stdout", r["rank"], r["host"], r.get("loss"), r.get("acc"))
                     for r in metrics)
        assert got == [("hypertune", 0, "here", None, 0.8), ("metric_definitions", 0, "here", None, 0.75),
                       ("stdout", 0, "here", 0.5, None)]
        assert set(reader.metrics_offsets["here"]) == {"0/stdout", "0/defs", "0/hypertune"}
        assert reader.metrics(["here"]) == []  # hypertune's file too: its offset is its time
        assert st["log_ranks"] == [0]

        gc = ctl.agents(["here"]).job_gc(max_age_s=0, max_jobs=0)["here"]
        assert isinstance(gc, dict) and gc["removed"] == [job_id]
        assert a.shutdown(force=True) is True
