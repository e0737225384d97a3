"""The doctor's per-host checks (tui.control.doctorhost, and agent/doctorprobe.py on the hosts): on
the test bed (real hosts, real agents, real disks and routes), the host side on this machine, and
the parsing of what NVML says, from recorded values."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import doctorprobe
from tests._require import PY39_MISSING, python39, require
from tests.testbed import TestBed
from tui.control.doctorhost import (
    HOST_SOURCE,
    _last_json,
    clock_finding,
    disk_findings,
    gpu_findings,
    host_findings,
    ifname_matches,
    network_findings,
    version_findings,
)
from tui.model.doctor import CHECKS, VERDICTS, Finding

HOSTS = ["h1", "h2", "h3"]


def _controller(inventory: Path) -> object:
    from tui.control.hostlinks import HostLinks
    from tui.remote.inventoryfile import load_inventory

    return HostLinks(load_inventory(inventory))


def _host_line(inventory: Path, host: str, line: str) -> None:
    """Add a setting to ``host``'s entry in the inventory (a line after its name)."""
    lines = inventory.read_text().splitlines()
    i = lines.index(f'name = "{host}"')
    lines.insert(i + 1, line)
    inventory.write_text("\n".join(lines) + "\n")


def _with_python(inventory: Path, host: str, python: str) -> None:
    """Give ``host`` its own interpreter in the inventory."""
    _host_line(inventory, host, f'python = "{python}"')


@pytest.fixture
def ctl(testbed: TestBed, tmp_path: Path) -> Iterator[object]:
    # The hosts run this interpreter (it has torch), as the job tests do.
    c = _controller(testbed.write_inventory(tmp_path / "hosts.toml", python=sys.executable))
    try:
        yield c
    finally:
        c.close()  # type: ignore[attr-defined]


def _by(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


@pytest.mark.testbed
def test_every_host_is_checked_and_agrees_on_the_bed(ctl: object, testbed: TestBed) -> None:
    # one host at a time: the bed's hosts share one disk
    # h3's data dir is its own /dev/shm (a tmpfs): the figures say they are memory's
    findings, skipped = host_findings(ctl, HOSTS, disk_mb=16, disk_parallel=False, data_dirs={"h3": "/dev/shm"})
    assert all(f.check in CHECKS and f.verdict in VERDICTS for f in findings)

    # disk: both dirs of every host measured, with positive figures, and the read method named
    disk = _by(findings, "disk")
    assert sorted((f.subject, dict(f.details)["role"]) for f in disk) == sorted(
        (h, role) for h in HOSTS for role in ("data", "checkpoint")), disk
    for f in disk:
        d = dict(f.details)
        assert f.unit == "MB/s" and f.value is not None and f.value > 0
        assert isinstance(d["read_mb_s"], float) and d["read_mb_s"] > 0
        assert d["bytes"] == 16 << 20
        assert d["read_method"] in ("O_DIRECT", "fadvise DONTNEED", "page cache")
        assert d["read_method"] in f.summary or "memory-backed" in f.summary
    # by default the data dir is the state dir's parent (~) and the checkpoint dir the agent's
    # own state dir (/root/.rigdeck on each host); the test files are gone afterwards
    dirs = {(f.subject, dict(f.details)["role"]): f for f in disk}
    assert {k: dict(f.details)["dir"] for k, f in dirs.items()} == {
        ("h1", "data"): "/root", ("h2", "data"): "/root", ("h3", "data"): "/dev/shm",
        **{(h, "checkpoint"): "/root/.rigdeck" for h in HOSTS}}
    shm = dirs[("h3", "data")]
    assert dict(shm.details)["fstype"] == "tmpfs" and "memory-backed filesystem" in shm.summary
    assert "/dev/shm is in memory" in shm.advice
    for i in range(1, 4):
        left = testbed.exec(i, ["sh", "-c", "ls -a /root /root/.rigdeck /dev/shm | grep rigdeck-doctor || true"]).stdout
        assert left.strip() == "", left

    # versions: the same interpreter everywhere, so every component agrees
    versions = _by(findings, "versions")
    assert [dict(f.details)["component"] for f in versions] == ["python", "torch", "cuda", "nccl", "driver"]
    assert all(f.verdict == "ok" for f in versions), versions
    import torch

    torch_f = next(f for f in versions if dict(f.details)["component"] == "torch")
    assert torch_f.summary == f"torch: {torch.__version__} on every host (h1, h2, h3)"

    # network: eth0 of each namespace towards h1, with its real MTU
    net = {f.subject: f for f in _by(findings, "network")}
    assert set(net) == set(HOSTS)
    for i, h in enumerate(HOSTS, start=1):
        mtu = int(testbed.exec(i, ["cat", "/sys/class/net/eth0/mtu"]).stdout)
        assert dict(net[h].details)["interface"] == "eth0" and net[h].value == mtu
        assert net[h].verdict == "ok", net[h]
    assert "towards itself" in net["h1"].summary and "towards h1" in net["h2"].summary

    # clock: one namespace's clock is this machine's clock: small offsets, small error bounds
    clock = {f.subject: f for f in _by(findings, "clock")}
    assert set(clock) == set(HOSTS)
    for f in clock.values():
        d = dict(f.details)
        offset, rtt = float(d["offset_ms"]), float(d["rtt_ms"])  # type: ignore[arg-type]
        assert f.verdict == "ok" and abs(offset) < 50 and 0 < rtt < 1000, f

    # gpu: simulated GPUs, no NVML: skipped with why, no figures made up
    assert _by(findings, "gpu") == []
    assert ("gpu", "no NVML on h1, h2, h3 (simulated GPUs)") in skipped


@pytest.mark.testbed
def test_torch_drift_and_network_mismatches(testbed: TestBed, tmp_path: Path) -> None:
    # No other torch wheel can be had here (no network but the registries, and a torch wheel is
    # hundreds of MB): h2's python is a venv of the same interpreter without torch.
    venv = tmp_path / "venv-no-torch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    inventory = testbed.write_inventory(tmp_path / "hosts.toml", python=sys.executable)
    _with_python(inventory, "h2", str(venv / "bin" / "python"))
    _with_python(inventory, "h3", sys.executable)
    # The same run checks the network: h1 names its interface for NCCL, h2 names one it lacks,
    # and h3's link towards h1 gets a smaller MTU than the others'.
    _host_line(inventory, "h1", 'env = { NCCL_SOCKET_IFNAME = "=eth0" }')
    _host_line(inventory, "h2", 'env = { NCCL_SOCKET_IFNAME = "ib" }')
    netns = testbed.host(3).netns
    subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "mtu", "1400"], check=True)
    ctl = _controller(inventory)
    try:
        findings, _ = host_findings(ctl, HOSTS, disk_mb=4)
    finally:
        ctl.close()  # type: ignore[attr-defined]
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "mtu", "1500"], check=True)
    net = {f.subject: f for f in _by(findings, "network")}
    assert net["h1"].verdict == "ok" and "NCCL_SOCKET_IFNAME==eth0 takes eth0" in net["h1"].summary
    assert net["h2"].verdict == "bad" and "NCCL_SOCKET_IFNAME=ib matches no interface" in net["h2"].summary
    assert net["h2"].advice.startswith("set NCCL_SOCKET_IFNAME=eth0 for h2")
    assert net["h3"].verdict == "warn" and net["h3"].value == 1400
    assert "MTU 1400; MTU differs from the other hosts' 1500" in net["h3"].summary
    import torch

    versions = {dict(f.details)["component"]: f for f in _by(findings, "versions")}
    t = versions["torch"]
    assert t.verdict == "bad"
    assert t.summary == f"torch differs across hosts: {torch.__version__} on h1, h3; missing on h2"
    assert "h2" in t.advice
    assert dict(t.details)["h2"] is None and dict(t.details)["h1"] == torch.__version__
    # the venv shares the interpreter: Python itself does not drift; CUDA and NCCL are compared
    # where torch is (h2's lack of them is the torch finding's)
    assert versions["python"].verdict == "ok"
    assert versions["cuda"].verdict == "ok" and versions["cuda"].summary.endswith("on h1, h3 (h2: no usable torch)")


# -- parsing, from recorded values -------------------------------------------------------


# What the probe read through NVML on an 8-GPU host (recorded; throttle reasons as NVML's bits).
RECORDED_NVML = [
    {"index": 0, "name": "NVIDIA H100 80GB HBM3", "ecc_volatile_uncorrected": 0, "ecc_aggregate_uncorrected": 0,
     "throttle_reasons": 0x1, "pcie_gen": 1, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16},
    {"index": 1, "name": "NVIDIA H100 80GB HBM3", "ecc_volatile_uncorrected": 2, "ecc_aggregate_uncorrected": 2,
     "throttle_reasons": 0x0, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16},
    {"index": 2, "name": "NVIDIA H100 80GB HBM3", "ecc_volatile_uncorrected": 0, "ecc_aggregate_uncorrected": 0,
     "throttle_reasons": 0x40 | 0x4, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16},
    {"index": 3, "name": "NVIDIA H100 80GB HBM3", "ecc_volatile_uncorrected": 0, "ecc_aggregate_uncorrected": 0,
     "throttle_reasons": 0x0, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 8, "pcie_width_max": 16},
    {"index": 4, "name": "NVIDIA A10", "ecc_volatile_uncorrected": None, "ecc_aggregate_uncorrected": None,
     "throttle_reasons": 0x0, "pcie_gen": 3, "pcie_gen_max": 4, "pcie_width": 16, "pcie_width_max": 16},
    {"index": 5, "name": "NVIDIA H100 80GB HBM3", "ecc_volatile_uncorrected": 0, "ecc_aggregate_uncorrected": 7,
     "throttle_reasons": 0x4, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16},
]


def test_nvml_figures_become_verdicts() -> None:
    got = {f.subject: f for f in gpu_findings("g1", RECORDED_NVML)}
    assert list(got) == [f"g1 gpu{i}" for i in range(6)]
    # idle, link down-shifted at rest: fine
    assert got["g1 gpu0"].verdict == "ok" and "PCIe gen 1 of 5 (idle)" in got["g1 gpu0"].summary
    # uncorrected ECC errors since the reset: bad, with a reset advised
    assert got["g1 gpu1"].verdict == "bad" and "2 uncorrected ECC errors" in got["g1 gpu1"].summary
    assert "nvidia-smi -r" in got["g1 gpu1"].advice and got["g1 gpu1"].value == 2.0
    # hardware thermal slowdown is bad, the software power cap beside it is named too
    s2 = got["g1 gpu2"].summary
    assert got["g1 gpu2"].verdict == "bad" and "hardware thermal slowdown" in s2 and "software power cap" in s2
    # a link at half its width
    assert got["g1 gpu3"].verdict == "warn" and "PCIe x8 of x16" in got["g1 gpu3"].summary
    # no ECC on the board; busy below its PCIe generation
    assert got["g1 gpu4"].verdict == "warn" and "ECC not reported" in got["g1 gpu4"].summary
    assert "PCIe gen 3 of 4 while busy" in got["g1 gpu4"].summary
    # errors in its lifetime only, and a power cap: warn
    assert got["g1 gpu5"].verdict == "warn" and "7 uncorrected ECC errors in its lifetime" in got["g1 gpu5"].summary
    assert all(f.advice for f in got.values() if f.verdict != "ok")


def test_versions_drift_verdicts() -> None:
    base = {"python": "3.11.7", "torch": "2.3.1+cu121", "cuda": "12.1", "nccl": "2.20.5", "driver": "550.54.15"}
    same = version_findings({"a": dict(base), "b": dict(base)})
    assert [f.verdict for f in same] == ["ok"] * 5
    patch = version_findings({"a": dict(base), "b": {**base, "torch": "2.3.0+cu121", "driver": "550.90.07",
                                                        "python": "3.11.9"}})
    v = {dict(f.details)["component"]: f for f in patch}
    assert v["torch"].verdict == "warn" and v["torch"].summary == (
        "torch differs across hosts: 2.3.1+cu121 on a; 2.3.0+cu121 on b")
    assert v["driver"].verdict == "warn" and v["python"].verdict == "warn" and v["cuda"].verdict == "ok"
    # torch installed but failing to import (a CUDA build without its libraries): its version counts
    broken = version_findings({"a": dict(base), "b": {**base, "torch": "2.4.0", "torch_broken": True, "cuda": None,
                                                         "nccl": None, "torch_error": "OSError: libcudnn.so.9"}})
    v = {dict(f.details)["component"]: f for f in broken}
    assert v["torch"].verdict == "bad" and v["torch"].summary == (
        "torch differs across hosts: 2.3.1+cu121 on a; 2.4.0 (installed, does not import) on b")
    assert "repair torch on b (OSError: libcudnn.so.9)" in v["torch"].advice
    assert v["cuda"].verdict == "ok" and v["cuda"].summary == "CUDA: 12.1 on a (b: no usable torch)"
    minor = version_findings({"a": dict(base), "b": {**base, "cuda": "11.8", "nccl": "2.18.1"}, "c": dict(base)})
    v = {dict(f.details)["component"]: f for f in minor}
    assert v["cuda"].verdict == "bad" and v["cuda"].summary == "CUDA differs across hosts: 12.1 on a, c; 11.8 on b"
    assert v["nccl"].verdict == "bad"


def test_disk_compares_each_host_with_the_median() -> None:
    def row(role: str, write_s: float, read_s: float) -> dict[str, object]:
        return {"role": role, "dir": "/data", "fstype": "ext4", "bytes": 256 << 20, "write_s": write_s,
                "read_s": read_s, "read_bytes": 256 << 20, "read_method": "O_DIRECT"}

    got = disk_findings({"a": [row("data", 1.0, 0.5)], "b": [row("data", 1.0, 0.5)],
                         "c": [row("data", 1.5, 0.5)], "d": [row("data", 3.0, 0.5)], "f": [row("data", 1.0, 0.5)],
                         "e": "TransportError: down"})
    v = {f.subject: f for f in got}
    assert v["a"].verdict == "ok" and v["a"].value == pytest.approx(268.4, abs=0.1)
    assert v["c"].verdict == "warn" and "67% of the hosts' median" in v["c"].summary  # 1.0/1.5 of it
    assert v["d"].verdict == "bad" and v["d"].advice
    assert v["e"].verdict == "bad" and "TransportError: down" in v["e"].summary


def test_nccl_socket_ifname_and_mtu() -> None:
    assert ifname_matches("eth", "eth0") and not ifname_matches("eth", "ib0")
    assert ifname_matches("^docker,lo", "eth0") and not ifname_matches("^docker,lo", "docker0")
    assert ifname_matches("=eth0", "eth0") and not ifname_matches("=eth0", "eth01")
    probe = {"interface": "eth0", "mtu": 9000, "primary_address": "10.0.0.1", "interfaces": ["eth0", "ib0", "lo"]}
    got = {f.subject: f for f in network_findings(
        {"a": dict(probe), "b": dict(probe), "c": {**probe, "mtu": 1500}}, "a",
        {"a": {"NCCL_SOCKET_IFNAME": "eth0"}, "b": {"NCCL_SOCKET_IFNAME": "ib"}, "c": {"NCCL_SOCKET_IFNAME": "enp"}})}
    assert got["a"].verdict == "ok" and "NCCL_SOCKET_IFNAME=eth0 takes eth0" in got["a"].summary
    assert got["b"].verdict == "warn" and "takes ib0, not eth0" in got["b"].summary
    assert got["c"].verdict == "bad" and "matches no interface" in got["c"].summary
    assert "MTU differs from the other hosts' 9000" in got["c"].summary
    # two hosts, two MTUs: the primary's is the reference
    two = {f.subject: f for f in network_findings({"a": {**probe, "mtu": 1500}, "b": dict(probe)}, "a", {})}
    assert two["a"].verdict == "ok" and two["b"].verdict == "warn" and "other hosts' 1500" in two["b"].summary


def test_clock_offsets_against_the_thresholds() -> None:
    assert clock_finding("a", 0.004, 0.002).verdict == "ok"
    warn = clock_finding("b", -0.2, 0.01)
    assert warn.verdict == "warn" and warn.summary == "clock -200.0 ms from the controller's (± 5.0 ms)"
    assert "NTP" in warn.advice and warn.value == -200.0
    assert clock_finding("c", 3.5, 0.01).verdict == "bad"
    assert clock_finding("d", -0.00001, 0.0004).summary == "clock +0.0 ms from the controller's (± 0.2 ms)"


def test_bad_arguments_are_refused_before_any_host_is_asked() -> None:
    class NoHosts:  # anything touching it fails the test
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"a host was asked ({name})")

    with pytest.raises(ValueError, match=r"data_dirs: 'h9' is not one of the hosts checked \(h1, h2\)"):
        host_findings(NoHosts(), ["h1", "h2"], data_dirs={"h9": "/data"})
    with pytest.raises(ValueError, match=r"checkpoint_dirs: h1: expected a directory path, got ''"):
        host_findings(NoHosts(), ["h1", "h2"], checkpoint_dirs={"h1": ""})
    with pytest.raises(ValueError, match=r"disk_mb: expected a whole number of MB >= 1, got 0"):
        host_findings(NoHosts(), ["h1"], disk_mb=0)


@pytest.mark.testbed
def test_the_client_runs_the_host_checks_and_names_what_it_skipped(ctl: object) -> None:
    """What the app's Doctor view calls, with the host checks chosen: every host checked, what
    cannot be checked (no NVML on simulated GPUs) named as skipped, never made up; unknown hosts
    and checks refused before anything runs."""
    from tui.client import DoctorError, InProcessClient

    client = InProcessClient(controller=ctl)  # type: ignore[arg-type]
    report = client.doctor(checks=["versions", "clock", "gpu"])
    assert report.hosts == ("h1", "h2", "h3") and report.ended is not None and report.job_ids == ()
    assert {f.check for f in report.findings} == {"versions", "clock"}, report.findings
    assert all(f.verdict == "ok" for f in report.findings), report.findings
    skipped = dict(report.skipped)
    assert "simulated" in skipped["gpu"] and set(skipped) == {"gpu"}, skipped
    with pytest.raises(DoctorError, match="unknown host 'h9'"):
        client.doctor(hosts=["h9"])
    with pytest.raises(DoctorError, match="unknown check 'speed'"):
        client.doctor(checks=["speed"])


# -- the host side (agent/doctorprobe.py), on this machine -------------------------------------


def _run_source(python: str, *args: str) -> object:
    """The probe as the doctor runs it on a host: its source with ``-c``, arguments apart."""
    out = subprocess.run([python, "-c", HOST_SOURCE, *args], capture_output=True, text=True, check=True, timeout=120)
    return _last_json(out.stdout)


@pytest.mark.parametrize("which", ["this", "3.9"])
def test_the_probe_runs_from_its_source_and_finds_the_route_and_versions(which: str) -> None:
    python = sys.executable if which == "this" else python39()
    require(python, PY39_MISSING)
    assert python
    got = _run_source(python, "probe", "127.0.0.1")
    assert isinstance(got, dict)
    assert got["executable"] == python and got["python"].startswith("3.9." if which == "3.9" else "3.")
    # towards itself the route is lo, and lo is what holds 127.0.0.1
    assert got["primary_address"] == "127.0.0.1" and got["interface"] == "lo" and isinstance(got["mtu"], int)
    assert "lo" in got["interfaces"] and got["route_source"] in ("ip route get", "/proc/net/route")
    for key in ("torch", "cuda", "nccl", "driver", "nvml"):
        assert key in got
    if which == "this":  # the same module in-process says the same (the versions at least)
        here = doctorprobe.probe("127.0.0.1")
        assert {k: here[k] for k in ("python", "torch", "cuda", "interface", "mtu")} == {
            k: got[k] for k in ("python", "torch", "cuda", "interface", "mtu")}


def test_the_disk_check_measures_each_dir_and_leaves_nothing_behind(tmp_path: Path) -> None:
    data = tmp_path / "data"
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    got = _run_source(sys.executable, "disk", "1", "data", str(data), "checkpoint", str(blocked / "ckpt"))
    assert isinstance(got, list) and [r["role"] for r in got] == ["data", "checkpoint"]
    ok, bad = got
    assert ok["dir"] == str(data.resolve()) and ok["bytes"] == doctorprobe.CHUNK == ok["read_bytes"]
    assert ok["write_s"] > 0 and ok["read_s"] > 0 and "error" not in ok
    assert ok["read_method"] in ("O_DIRECT", "fadvise DONTNEED", "page cache") and ok["fstype"] != ""
    assert list(data.iterdir()) == []  # the test file is gone
    assert bad["error"].startswith(("NotADirectoryError", "FileExistsError")), bad
    findings = {dict(f.details).get("role", "?") if f.value is not None else "failed": f
                for f in disk_findings({"h1": got})}
    assert findings["data"].verdict == "ok" and findings["failed"].verdict == "bad"
    assert "checkpoint dir" in findings["failed"].summary


def test_the_probe_refuses_what_it_does_not_know() -> None:
    assert doctorprobe.main(["probe"]) == 2
    assert doctorprobe.main(["disk", "many", "data", "/tmp"]) == 2
    assert doctorprobe.main(["disk", "1", "data"]) == 2
    assert doctorprobe.main(["format", "/"]) == 2


class _FakeNvml:
    """pynvml's calls the probe makes, for two GPUs: the second has no ECC (NVML raises)."""

    def __init__(self) -> None:
        self.shut = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H100 80GB HBM3" if h == 0 else "NVIDIA A10"

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        if h == 1:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 3 if counter == 0 else 5

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return 0x1

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return 4

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16


def test_nvml_readings_reach_the_gpu_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    got = doctorprobe.nvml()
    assert fake.shut and got["driver"] == "550.54.15" and "nvml_error" not in got
    first, second = got["nvml"]
    assert first == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "ecc_volatile_uncorrected": 3,
                     "ecc_aggregate_uncorrected": 5, "throttle_reasons": 1, "pcie_gen": 4, "pcie_gen_max": 5,
                     "pcie_width": 16, "pcie_width_max": 16}
    assert second["ecc_volatile_uncorrected"] is None and second["pcie_gen"] == 4
    verdicts = {f.subject: f.verdict for f in gpu_findings("g", got["nvml"])}
    assert verdicts == {"g gpu0": "bad", "g gpu1": "ok"}
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    none = doctorprobe.nvml()
    assert none["nvml"] is None and none["driver"] is None
    assert none["nvml_error"].startswith(("ImportError", "ModuleNotFoundError"))


def test_a_torch_that_does_not_import_still_reports_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("torch")
    except PackageNotFoundError:
        pytest.skip("torch is not installed here")
    monkeypatch.setitem(sys.modules, "torch", None)  # installed, but its import fails
    got = doctorprobe.torch_versions()
    assert got["torch"] == installed and got["torch_broken"] is True
    assert got["torch_error"].startswith(("ImportError", "ModuleNotFoundError"))
    assert got["cuda"] is None and got["nccl"] is None
