"""The agent's textfile for node_exporter (agent/textfile.py, agent/promtext.py): the same per-GPU
series as the controller's ``/metrics``, written atomically by the daemon at each tick; read by
``promtool check metrics`` and served by Debian's ``prometheus-node-exporter`` from a test bed
host whose job holds its GPUs, with no controller connected."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import protocol, textfile
from agent.daemon import Daemon
from agent.promtext import GPU_FAMILIES, textfile_path_problem
from tests._require import (
    NODE_EXPORTER,
    NODE_EXPORTER_MISSING,
    PROMTOOL_MISSING,
    PY39_MISSING,
    python39,
    require,
)
from tests.kit import ROOT, TICKER, wait_until
from tests.kit.bedcli import Cli
from tests.kit.local import SocketClient
from tests.kit.prom import Read, read
from tests.testbed import TestBed
from tests.ui_fixtures import NOW, gpu_sample, host_sample
from tests.webpage import free_port, process_for_the_test
from tui.model.inventory import InventoryError
from tui.model.promexport import cluster_exposition
from tui.model.state import ClusterState
from tui.remote.agentclient import AgentClient
from tui.remote.inventoryfile import load_inventory

GPU_NAMES = {f.name for f in GPU_FAMILIES}
JOB = "ddp-1009-091320-ab12"
XID = "XID 79: GPU has fallen off the bus"


def a_sample(tick: int = 7) -> dict[str, Any]:
    """One host's sample with a GPU of each kind: a job's rank, a claim between attempts, someone
    else's process, an unhealthy one without ECC, an idle one."""
    gpus = [gpu_sample(1, 0, tick, JOB, 0), gpu_sample(1, 1, tick), gpu_sample(1, 2, tick, foreign="bob"),
            gpu_sample(1, 3, tick), gpu_sample(1, 4, tick)]
    gpus[1]["claim"] = {"job_id": "j9", "user": "ann", "since": 1.0}
    gpus[3].update(health="unhealthy", health_reason=XID, ecc_volatile_errors=None)
    return host_sample(1, tick, gpus)


def promtool(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(shutil.which("promtool")), "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)


# -- what the file says --------------------------------------------------------------------------


def test_the_textfile_has_the_controllers_gpu_series_for_the_same_sample() -> None:
    sample = a_sample()
    mine = read(textfile.render(sample, "h1"))
    state = ClusterState([("h1", "10.0.0.1")])
    state.apply_sample("h1", sample, received_at=30.0)
    theirs = read(cluster_exposition(state.snapshot(), [], now=NOW, monotonic=31.0).text())
    assert set(mine.types) == GPU_NAMES
    gpu_part = {k: v for k, v in theirs.samples.items() if k[0] in GPU_NAMES}
    assert mine.samples == gpu_part, "the same series, labels and values as the controller's"
    assert mine.helps == {n: theirs.helps[n] for n in mine.helps} and mine.types == {
        n: theirs.types[n] for n in mine.types}


def test_each_gpu_is_labelled_with_the_host_and_whoever_holds_it() -> None:
    r = read(textfile.render(a_sample(), "gpu7"))
    owners = {s["gpu"]: (s["host"], s["job_id"], s["rank"], s["user"], s["simulated"])
              for s in r.series("rigdeck_gpu_info")}
    assert owners == {"0": ("gpu7", JOB, "0", "root", "true"), "1": ("gpu7", "j9", "", "ann", "true"),
                      "2": ("gpu7", "", "", "bob", "true"), "3": ("gpu7", "", "", "", "true"),
                      "4": ("gpu7", "", "", "", "true")}
    assert r.value("rigdeck_gpu_health", gpu="3", health="unhealthy") == 1
    assert r.value("rigdeck_gpu_health", gpu="3", health="ok") == 0
    assert r.value("rigdeck_gpu_health_reason", gpu="3", reason=XID) == 1
    assert "3" in [s["gpu"] for s in r.series("rigdeck_gpu_utilization_ratio")]  # measured all the same
    assert [s["gpu"] for s in r.series("rigdeck_gpu_ecc_uncorrected_errors_total")] == ["0", "1", "2", "4"]
    assert r.value("rigdeck_gpu_sm_clock_hertz", gpu="0") == 1980e6
    assert not [n for n in r.types if n.startswith(("rigdeck_host", "rigdeck_job", "rigdeck_queue"))]


def test_a_host_without_gpus_writes_an_empty_file() -> None:
    assert textfile.render({"gpus": []}, "cpu1") == ""


def test_the_agent_writes_the_same_file_under_python_3_9(tmp_path: Path) -> None:
    py39 = python39()
    require(py39, PY39_MISSING)
    sample = tmp_path / "sample.json"
    sample.write_text(json.dumps(a_sample()))
    target = tmp_path / "rigdeck.prom"
    code = ("import json, sys\nfrom agent import textfile\n"
            "textfile.write(sys.argv[2], textfile.render(json.load(open(sys.argv[1])), 'h1'))\n")
    subprocess.run([str(py39), "-c", code, str(sample), str(target)], check=True, cwd=ROOT)
    assert target.read_text() == textfile.render(a_sample(), "h1")


def test_promtool_accepts_the_textfile() -> None:
    require(shutil.which("promtool"), PROMTOOL_MISSING)
    done = promtool(textfile.render(a_sample(), "h1"))
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


# -- the path ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path,expected", [
    ("/var/lib/prometheus/node-exporter/rigdeck.prom", None),
    ("~/textfile/rigdeck.prom", None),
    ("~ml/rigdeck.prom", None),
    ("rigdeck.prom", "an absolute path or one that starts with ~"),
    ("/var/lib/node/rigdeck.txt", "a file name ending in .prom"),
    ("/var/lib/node/", "a file name ending in .prom"),
    ("/var/lib/node/.prom", "a file name ending in .prom"),
    ("/var/lib/node/a\nb.prom", "without control characters"),
    (7, "a string"),
])
def test_a_textfile_path_is_absolute_or_home_and_ends_in_prom(path: Any, expected: str | None) -> None:
    problem = textfile_path_problem(path)
    assert (problem is None) if expected is None else (problem is not None and expected in problem), problem


def test_the_agent_expands_home_on_its_host() -> None:
    assert textfile.resolve("~/x/rigdeck.prom") == os.path.expanduser("~/x/rigdeck.prom")
    assert textfile.resolve("/a/./b/../rigdeck.prom") == "/a/rigdeck.prom"
    with pytest.raises(textfile.TextfileError, match="no such user's home"):
        textfile.resolve("~no-such-user-here/rigdeck.prom")
    with pytest.raises(textfile.TextfileError, match=r"'/x\.txt': expected a file name ending in \.prom"):
        textfile.resolve("/x.txt")


def _inventory(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(f'[defaults]\nssh_config = ""\nknown_hosts = "{tmp_path / "kh"}"\n' + body)
    return path


def test_the_inventory_sets_it_in_defaults_and_a_host_overrides_or_turns_it_off(tmp_path: Path) -> None:
    inv = load_inventory(_inventory(tmp_path, """prometheus_textfile = "/var/lib/node-exporter/rigdeck.prom"
[[hosts]]
name = "a"
address = "10.0.0.1"
[[hosts]]
name = "b"
address = "10.0.0.2"
prometheus_textfile = "~/prom/rigdeck.prom"
[[hosts]]
name = "c"
address = "10.0.0.3"
prometheus_textfile = ""
"""))
    assert [h.prometheus_textfile for h in inv.hosts] == [
        "/var/lib/node-exporter/rigdeck.prom", "~/prom/rigdeck.prom", None]


@pytest.mark.parametrize("where,value,expected", [
    ("defaults", '"rigdeck.prom"', "an absolute path or one that starts with ~"),
    ("host", '"/var/lib/node/rigdeck.txt"',
     "a file name ending in .prom (node_exporter's textfile collector reads only *.prom files), "
     'or "" for none, got "/var/lib/node/rigdeck.txt"'),
    ("host", "true",
     'a file path on the host ending in .prom (absolute, or starting with ~), or "" for none, got true'),
])
def test_a_bad_textfile_is_an_inventory_error_naming_file_field_and_expectation(
        tmp_path: Path, where: str, value: str, expected: str) -> None:
    line = f"prometheus_textfile = {value}\n"
    body = (line if where == "defaults" else "") + '[[hosts]]\nname = "a"\naddress = "10.0.0.1"\n' + (
        line if where == "host" else "")
    path = _inventory(tmp_path, body)
    with pytest.raises(InventoryError) as e:
        load_inventory(path)
    who = "[defaults]" if where == "defaults" else "host 'a'"
    assert str(e.value).startswith(f"{path}: {who}: field 'prometheus_textfile': expected "), str(e.value)
    assert expected in str(e.value)


# -- writing it ----------------------------------------------------------------------------------


def test_a_write_replaces_the_file_whole_at_mode_0644_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "rigdeck.prom"
    target.write_text("old\n")
    old_umask = os.umask(0o077)
    try:
        textfile.write(str(target), "new\n")
    finally:
        os.umask(old_umask)
    assert target.read_text() == "new\n" and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["rigdeck.prom"], "no temporary file left"


def test_a_reader_sees_one_whole_file_or_the_other_never_a_part(tmp_path: Path) -> None:
    target = tmp_path / "rigdeck.prom"
    texts = [f"{c * 200_000}\n" for c in "ab"]
    textfile.write(str(target), texts[0])
    stop = threading.Event()
    seen: set[str] = set()

    def reader() -> None:
        while not stop.is_set():
            seen.add(target.read_text())

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(200):
            textfile.write(str(target), texts[i % 2])
    finally:
        stop.set()
        t.join()
    assert seen <= set(texts) and seen


def test_a_link_planted_at_the_temporary_name_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    target = tmp_path / "rigdeck.prom"
    os.symlink(victim, tmp_path / f".rigdeck.prom.{os.getpid()}.tmp")
    textfile.write(str(target), "series\n")
    assert victim.read_text() == "keep\n" and target.read_text() == "series\n"
    assert not target.is_symlink()


def test_a_missing_directory_is_an_error_that_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        textfile.write(str(tmp_path / "nope" / "rigdeck.prom"), "x\n")
    assert os.listdir(tmp_path) == []


def test_the_setting_is_kept_for_the_next_daemon(tmp_path: Path) -> None:
    assert textfile.load(str(tmp_path)) is None
    textfile.save(str(tmp_path), {"path": "/x/rigdeck.prom", "host": "h1"})
    assert textfile.load(str(tmp_path)) == {"path": "/x/rigdeck.prom", "host": "h1"}
    (tmp_path / textfile.SETTING_FILE).write_text('{"path": "x.txt", "host": "h1"}')
    assert textfile.load(str(tmp_path)) is None  # a bad one is no setting
    textfile.save(str(tmp_path), None)
    assert not (tmp_path / textfile.SETTING_FILE).exists()


# -- the daemon writes it ------------------------------------------------------------------------


class _Samples:
    """A collector whose GPU 0 utilization counts its samples (simulated GPUs)."""

    def __init__(self) -> None:
        self.n = 0

    def sample(self) -> dict[str, Any]:
        self.n += 1
        s = a_sample(self.n)
        s["gpus"][0]["utilization_pct"] = float(self.n)
        return s

    def set_interval(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        pass


class _Served:
    """A daemon serving ``state`` on a thread of this process, and a greeted client of it."""

    def __init__(self, state: Path) -> None:
        self.d = Daemon(str(state), interval=0.2, collector_factory=_Samples)
        assert self.d.acquire_lock()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(self.d.serve()), daemon=True)
        self.thread.start()
        wait_until(lambda: os.path.exists(self.d.paths.socket), 10, "the daemon's socket")
        self.client = SocketClient(self.d.paths.socket)
        self.client.send(protocol.encode(protocol.hello()))
        self.ids = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.ids += 1
        self.client.send(protocol.encode(protocol.request(self.ids, method, **params)))
        while True:
            msg = self.client.recv()
            if msg.get("type") == "response" and msg.get("id") == self.ids:
                return msg

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.d._stop_now)
        self.thread.join(10)
        self.d.release_lock()


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """The idle rewrite every 0.2 s rather than every few seconds (the daemon's ticks are 0.2 s)."""
    monkeypatch.setattr(textfile, "IDLE_INTERVAL_S", 0.2)
    monkeypatch.setattr(textfile, "MIN_INTERVAL_S", 0.0)


def _util0(path: Path) -> float:
    return read(path.read_text()).value("rigdeck_gpu_utilization_ratio", gpu="0")


def test_the_daemon_writes_the_file_when_told_and_keeps_it_fresh_with_nobody_subscribed(
        tmp_path: Path, quick: None) -> None:
    target = tmp_path / "node" / "rigdeck.prom"
    target.parent.mkdir()
    served = _Served(tmp_path / "state")
    try:
        reply = served.call("prometheus_textfile", path=str(target), host="gpu7")
        assert reply["ok"] and reply["result"] == {"path": str(target), "error": None}
        r = read(target.read_text())  # written before the answer
        assert {s["host"] for s in r.series("rigdeck_gpu_info")} == {"gpu7"}
        first = _util0(target)
        wait_until(lambda: _util0(target) > first, 20, "the file written again at a later tick")
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
        assert sorted(os.listdir(target.parent)) == ["rigdeck.prom"]
        bad = served.call("prometheus_textfile", path="relative.prom", host="gpu7")
        assert not bad["ok"] and bad["error"]["code"] == protocol.BAD_PARAMS
        assert "an absolute path or one that starts with ~" in bad["error"]["message"]
        missing = served.call("prometheus_textfile", path=str(tmp_path / "nope" / "x.prom"), host="gpu7")
        assert missing["ok"] and "No such file or directory" in missing["result"]["error"]
        assert not target.exists(), "the file of the path before is taken away"
        off = served.call("prometheus_textfile", path=None, host="gpu7")
        assert off["result"] == {"path": None, "error": None}
        assert not (tmp_path / "state" / textfile.SETTING_FILE).exists()
    finally:
        served.stop()


def test_a_daemon_that_starts_later_goes_on_writing_and_a_stopped_one_takes_the_file_away(
        tmp_path: Path, quick: None) -> None:
    target = tmp_path / "rigdeck.prom"
    served = _Served(tmp_path / "state")
    try:
        assert served.call("prometheus_textfile", path=str(target), host="h1")["ok"]
    finally:
        served.stop()
    assert not target.exists(), "a daemon stopped for good leaves no figures that stopped changing"
    again = _Served(tmp_path / "state")  # as after an upgrade: nobody tells it anything
    try:
        wait_until(target.exists, 20, "the next daemon's first write")
        assert read(target.read_text()).value("rigdeck_gpu_info", gpu="0", host="h1") == 1
    finally:
        again.stop()


def test_the_controller_tells_each_agent_its_hosts_setting_on_connecting() -> None:
    from tui.control.hostlinks import HostLinks
    from tui.model.inventory import HostSpec

    sent: list[tuple[str, dict[str, Any]]] = []

    def call(method: str, **params: Any) -> dict[str, Any]:
        sent.append((method, params))
        return {"path": "/home/ml/p/rigdeck.prom", "error": None}

    spec = HostSpec(name="gpu7", address="10.0.0.7", prometheus_textfile="~/p/rigdeck.prom", connect_timeout=4.0)
    HostLinks.configure_agent(spec, AgentClient("gpu7", call))
    HostLinks.configure_agent(HostSpec(name="gpu8", address="10.0.0.8"), AgentClient("gpu8", call))
    assert sent == [("prometheus_textfile", {"timeout": 4.0, "path": "~/p/rigdeck.prom", "host": "gpu7"}),
                    ("prometheus_textfile", {"timeout": 10.0, "path": None, "host": "gpu8"})]


# -- on a test bed host, served by node_exporter -------------------------------------------------


def _rigdeck_part(text: str) -> Read:
    """The rigdeck families of a node_exporter scrape (the rest: its own, of other types)."""
    keep = [ln for ln in text.splitlines()
            if ln.startswith(("rigdeck_", "# HELP rigdeck_", "# TYPE rigdeck_"))]
    return read("\n".join(keep) + "\n")


@contextlib.contextmanager
def node_exporter(directory: Path, tmp: Path) -> Iterator[str]:
    """Debian's node_exporter with only its textfile collector, reading ``directory``, on a free
    loopback port (its own process, not the system service); yields its /metrics URL."""
    port = free_port()
    with process_for_the_test(
            [NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
             f"--collector.textfile.directory={directory}", f"--web.listen-address=127.0.0.1:{port}"],
            tmp / "node-exporter.log"):
        yield f"http://127.0.0.1:{port}/metrics"


def scrape(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return str(r.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return ""  # not listening yet


@pytest.mark.testbed
def test_node_exporter_serves_a_bed_hosts_gpus_with_the_job_and_ranks_on_them(testbed: TestBed,
                                                                             tmp_path: Path) -> None:
    """The inventory's [defaults] prometheus_textfile reaches h1's agent when `rigdeck launch`
    connects; after the command has ended (no controller connected), node_exporter serves the
    file the agent keeps writing, with the job's id and ranks on the GPUs its ranks run on."""
    require(shutil.which("promtool"), PROMTOOL_MISSING)
    require(os.access(NODE_EXPORTER, os.X_OK), NODE_EXPORTER_MISSING)
    bed = testbed
    cli = Cli(bed, tmp_path)
    directory = bed.host(1).state_dir / "prom"  # h1's ~/.rigdeck/prom, as this machine sees it
    directory.mkdir(exist_ok=True)
    target = directory / "rigdeck.prom"
    cli.env["RIGDECK_INVENTORY"] = str(bed.write_inventory(
        tmp_path / "prom.toml", hosts=[1], python=sys.executable, connect_timeout=5.0,
        prometheus_textfile="~/.rigdeck/prom/rigdeck.prom"))
    spec = cli.spec("textfile", f"""
command = ["{{python}}", "{TICKER}", "--steps", "3000", "--sleep", "0.1"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
gpus_per_node = 2
""")
    job = cli.json("launch", str(spec))
    job_id = job["job_id"]
    try:
        gpus = next(n["gpus"] for n in job["placement"] if n["host"] == "h1")
        assert stat.S_IMODE(target.stat().st_mode) == 0o644  # written as the launch connected
        with node_exporter(directory, tmp_path) as url:
            text = wait_until(lambda: (t := scrape(url)) and len(ranks_of(t, job_id)) == 2 and t, 90,
                              f"node_exporter serving {job_id}'s two ranks")
        assert ranks_of(text, job_id) == {str(gpus[0]): "0", str(gpus[1]): "1"}
        assert "node_textfile_scrape_error 0" in text
        r = _rigdeck_part(text)
        info = r.series("rigdeck_gpu_info")
        assert sorted(s["gpu"] for s in info) == ["0", "1", "2", "3"]
        assert {(s["host"], s["simulated"], s["model"]) for s in info} == {("h1", "true", "Simulated GPU")}
        assert {s["user"] for s in info if s["job_id"] == job_id} == {"root"}
        assert r.value("rigdeck_gpu_memory_total_bytes", gpu="0") == 81920 * 1024 * 1024
        assert len(r.series("rigdeck_gpu_health")) == 16
        done = promtool(target.read_text())
        assert (done.returncode, done.stdout + done.stderr) == (0, "")
        assert sorted(os.listdir(directory)) == ["rigdeck.prom"]
    finally:
        cli.run("stop", job_id, "--grace", "2")
        # An inventory without the setting turns it off when it connects: the file goes.
        cli.env["RIGDECK_INVENTORY"] = str(bed.write_inventory(tmp_path / "plain.toml", hosts=[1],
                                                               connect_timeout=5.0))
        cli.run("hosts")
    assert not target.exists() and not (bed.host(1).state_dir / textfile.SETTING_FILE).exists()
    directory.rmdir()


def ranks_of(text: str, job_id: str) -> dict[str, str]:
    return {s["gpu"]: s["rank"] for s in _rigdeck_part(text).series("rigdeck_gpu_info") if s["job_id"] == job_id}
