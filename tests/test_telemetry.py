"""agent.telemetry: NVML through a fake pynvml that replays what a real H100 gave, nvidia-smi
through that card's recorded rows and a stand-in binary replaying them (tests/h100data.py), simulated
GPUs driven by real processes, host metrics through psutil and through /proc."""

from __future__ import annotations

import json
import os
import pwd
import re
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent import telemetry
from agent.facts import simulated_gpus
from agent.telemetry import (
    NVIDIA_SMI_QUERY,
    NVIDIA_SMI_RESERVED,
    Collector,
    GpuProcess,
    GpuSample,
    HostSample,
    Sample,
    TelemetryError,
    parse_diskstats,
    parse_environ,
    parse_meminfo,
    parse_net_dev,
    parse_nvidia_smi_row,
    parse_proc_stat_cpus,
    sample_from_dict,
    sample_to_dict,
    whole_disks,
)
from tests import h100data
from tests._require import PY39_MISSING, has_module, python39, require
from tests.kit import wait_until
from tests.kit.fakes import FakeNvml

ROOT = Path(__file__).resolve().parent.parent
PSUTIL_MISSING = "psutil is not installed (a dependency of rigdeck: pip install -e .)"
ME = pwd.getpwuid(os.geteuid()).pw_name

H100_ROW = h100data.smi_gpu_row(0)  # recorded on a real H100 under load
NA_ROW = (
    "2, NVIDIA GeForce RTX 4090, GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6, [N/A], 512, 24564, "
    "38, [N/A], [Not Supported], 210, [N/A]"
)


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any rigdeck tags, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RIGDECK_") and k not in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK")
    }
    env.update(extra)
    return env


@pytest.fixture
def spawn() -> Iterator[Any]:
    """spawn(argv, **env) -> a started child with those tags; every one is killed afterwards."""
    children: list[subprocess.Popen] = []

    def start(argv: list[str], user: int | None = None, **env: str) -> subprocess.Popen:
        kwargs: dict[str, Any] = {"user": user} if user is not None else {}
        p = subprocess.Popen(argv, env=_clean_env(**env), **kwargs)
        children.append(p)
        # Popen returns once the exec has begun; the child's new environment is readable a
        # moment later. A one-shot sample must find it whole.
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{p.pid}/environ").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.001)
        return p

    yield start
    for p in children:
        p.kill()
        p.wait(timeout=10)


# --- samples and their dicts ------------------------------------------------------------------


def _sample() -> Sample:
    return Sample(
        seq=7,
        time=1700000000.25,
        hostname="gpu-01",
        gpu_source="nvml",
        simulated=False,
        host=HostSample(
            cpu_pct=12.5,
            cpu_per_core=[10.0, 15.0],
            load=[0.5, 0.25, 0.1],
            mem_used_mb=1000,
            mem_total_mb=64000,
            swap_used_mb=0,
            swap_total_mb=2048,
            disk_read_bps=1024.0,
            disk_write_bps=0.0,
            net_rx_bps=99.5,
            net_tx_bps=12.0,
        ),
        gpus=[
            GpuSample(
                index=0,
                name="NVIDIA H100 80GB HBM3",
                uuid="GPU-5f3c",
                simulated=False,
                utilization_pct=87.0,
                memory_used_mb=61234,
                memory_total_mb=81559,
                temperature_c=64.0,
                power_w=512.34,
                power_limit_w=700.0,
                sm_clock_mhz=1980,
                ecc_volatile_errors=None,
                processes=[
                    GpuProcess(pid=4242, user="ada", used_memory_mb=None, job_id="j1", rank=3)
                ],
            )
        ],
        cost_s=0.0004,
    )


def test_sample_round_trips_through_dict_and_json() -> None:
    s = _sample()
    d = sample_to_dict(s)
    assert d["gpus"][0]["processes"][0] == {
        "pid": 4242,
        "user": "ada",
        "used_memory_mb": None,
        "job_id": "j1",
        "rank": 3,
    }
    again = sample_from_dict(json.loads(json.dumps(d)))
    assert again == s
    assert sample_to_dict(again) == d


def test_sample_from_dict_ignores_unknown_keys_and_fills_missing_optionals() -> None:
    d = sample_to_dict(_sample())
    d["future_field"] = 1
    del d["gpus"][0]["ecc_volatile_errors"]
    s = sample_from_dict(d)
    assert s.gpus[0].ecc_volatile_errors is None


def test_live_sample_round_trips(spawn: Any) -> None:
    p = spawn(["sleep", "60"], RIGDECK_JOB_ID="j9", RIGDECK_RANK="0", CUDA_VISIBLE_DEVICES="1")
    with Collector(sim_gpus=2, backend="simulated", hostname="rt") as c:
        c.sample()
        s = c.sample()
    assert p.pid in [x.pid for x in s.gpus[1].processes]
    assert sample_from_dict(json.loads(json.dumps(sample_to_dict(s)))) == s


# --- nvidia-smi rows --------------------------------------------------------------------------


def test_parse_recorded_h100_rows() -> None:
    for tick, recorded in enumerate(h100data.samples("nvidia-smi")):
        want = GpuSample.from_dict({**recorded["gpus"][0], "processes": []})
        assert parse_nvidia_smi_row(h100data.smi_gpu_row(tick) + "\n") == want
        with_reserved = parse_nvidia_smi_row(h100data.smi_gpu_row(tick, reserved=True), True)
        assert with_reserved == replace(want, memory_reserved_mb=h100data.RESERVED_MB)
    g = parse_nvidia_smi_row(H100_ROW)
    assert g is not None
    assert (g.name, g.memory_used_mb, g.memory_total_mb) == ("NVIDIA H100 80GB HBM3", 6863, 81559)
    # The plain query's row read as one with memory.reserved is one field short: not a GPU row.
    assert parse_nvidia_smi_row("0, H100, GPU-1, 87, 1, 2, 3, 4, 5, 6, 7", reserved=True) is None


def test_parse_compute_app_rows() -> None:
    assert telemetry.parse_compute_app_row(h100data.smi_app_row(497) + "\n") == (
        h100data.UUID, 497, 6854)
    assert telemetry.parse_compute_app_row("GPU-1, 12, [N/A]") == ("GPU-1", 12, None)
    for line in ("", "No running processes found", "gpu_uuid, pid, used_gpu_memory [MiB]",
                 "GPU-1, x, 5", "GPU-1, 5"):
        assert telemetry.parse_compute_app_row(line) is None


def test_parse_row_with_missing_fields() -> None:
    g = parse_nvidia_smi_row(NA_ROW)
    assert g is not None
    assert (g.index, g.name, g.memory_used_mb, g.memory_total_mb) == (
        2,
        "NVIDIA GeForce RTX 4090",
        512,
        24564,
    )
    assert g.utilization_pct is None
    assert g.power_w is None
    assert g.power_limit_w is None
    assert g.ecc_volatile_errors is None
    assert g.sm_clock_mhz == 210
    plain = parse_nvidia_smi_row("3, Tesla T4, GPU-1, N/A, 0, 15360, N/A, N/A, 70.00, 585, ERR!")
    assert plain is not None
    assert (plain.utilization_pct, plain.temperature_c, plain.power_w) == (None, None, None)
    assert plain.ecc_volatile_errors is None
    assert plain.power_limit_w == 70.0


@pytest.mark.parametrize(
    "line",
    [
        "",
        "index, name, uuid, utilization.gpu [%], memory.used [MiB], memory.total [MiB], "
        "temperature.gpu, power.draw [W], power.limit [W], clocks.sm [MHz], "
        "ecc.errors.uncorrected.volatile.total",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "No devices were found",
        "0, NVIDIA H100, GPU-1, 87",
    ],
)
def test_parse_rejects_what_is_not_a_gpu_row(line: str) -> None:
    assert parse_nvidia_smi_row(line) is None


def test_parse_row_tolerates_units_and_commas_in_names() -> None:
    g = parse_nvidia_smi_row("1, Odd, Name, GPU-2, 5 %, 10 MiB, 100 MiB, 30, 50.5 W, 300 W, 900, 2")
    assert g is not None
    assert (g.name, g.uuid, g.utilization_pct, g.memory_used_mb, g.power_w) == (
        "Odd, Name",
        "GPU-2",
        5.0,
        10,
        50.5,
    )
    assert g.ecc_volatile_errors == 2


# --- nvidia-smi stream with a stand-in binary replaying the recorded rows ---------------------

# A stand-in ``nvidia-smi``: logs each start, then prints the rows of its query (the GPU rows,
# with memory.reserved where asked; the compute-apps rows from a file the test may change) every
# -lms milliseconds (or -l seconds), looping over the recording, as the real one does.
STAND_IN = '''#!{python}
import os, sys, time
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write("%d %s\\n" % (os.getpid(), " ".join(args)))
mode = {mode!r}
if mode == "fail":
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    sys.exit(9)
query = next(a for a in args if a.startswith("--query-"))
if "memory.reserved" in query and mode == "old-driver":
    print('Field "memory.reserved" is not a valid field to query.')
    sys.exit(2)
period = None  # -lms N (milliseconds) or -l N (seconds): loop; neither: one query
if "-lms" in args:
    period = int(args[args.index("-lms") + 1]) / 1000.0
elif "-l" in args:
    period = float(args[args.index("-l") + 1])
name = "apps" if query.startswith("--query-compute-apps") else (
    "gpu-reserved" if "memory.reserved" in query else "gpu")
tick = 0
while True:
    with open(os.path.join({rows!r}, name)) as f:
        ticks = [t for t in f.read().split("\\n\\n") if t.strip()] or [""]
    if ticks[tick % len(ticks)]:
        sys.stdout.write(ticks[tick % len(ticks)].strip("\\n") + "\\n")
        sys.stdout.flush()
    tick += 1
    if period is None or mode == "once":
        break
    time.sleep(period)
'''


def _fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str = "loop",
              apps: list[str] | None = None) -> Path:
    """Put the stand-in ``nvidia-smi`` first on PATH, replaying the recorded H100 rows (and
    ``apps``: compute-apps rows, one tick); returns the file where it logs each start."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    rows = tmp_path / "rows"
    rows.mkdir()
    ticks = range(len(h100data.samples("nvidia-smi")))
    (rows / "gpu").write_text("\n\n".join(h100data.smi_gpu_row(t) for t in ticks) + "\n")
    (rows / "gpu-reserved").write_text(
        "\n\n".join(h100data.smi_gpu_row(t, reserved=True) for t in ticks) + "\n")
    (rows / "apps").write_text("\n".join(apps or []) + "\n")
    log = tmp_path / "invocations.log"
    script = bindir / "nvidia-smi"
    script.write_text(STAND_IN.format(python=sys.executable, log=str(log), mode=mode,
                                      rows=str(rows)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return log


def _invocations(log: Path, query: str = "--query-gpu=") -> list[list[str]]:
    """The starts of the stand-in whose query begins with ``query``: [pid, args...] each."""
    calls = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return [c for c in calls if any(a.startswith(query) for a in c[1:])]


def _failing_nvml() -> Any:
    fake = FakeNvml(gpus=0)
    fake.fail_init = True
    return fake


def test_nvidia_smi_stream_is_one_child_per_query_across_many_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _fake_smi(tmp_path, monkeypatch)
    c = Collector(interval=0.2, nvml_module=_failing_nvml(), hostname="h")
    try:
        assert c.gpu_source == "nvidia-smi"
        samples = []
        for _ in range(30):
            samples.append(c.sample())
            time.sleep(0.02)
        assert all(s.gpu_source == "nvidia-smi" and not s.simulated for s in samples)
        last = samples[-1]
        assert [g.index for g in last.gpus] == [0]
        g = last.gpus[0]
        # As nvidia-smi showed it under the load, with the driver's reservation apart.
        assert (g.memory_used_mb, g.memory_total_mb) == (h100data.SMI_USED_MB, h100data.TOTAL_MB)
        assert g.memory_reserved_mb == h100data.RESERVED_MB
        assert g.processes == []  # nobody on the GPU: the compute-apps child prints nothing
        recorded = {parse_nvidia_smi_row(h100data.smi_gpu_row(t)).utilization_pct  # type: ignore[union-attr]
                    for t in range(8)}
        assert {s.gpus[0].utilization_pct for s in samples} <= recorded
        calls = _invocations(log)
        assert len(calls) == 1, calls
        argv = calls[0][1:]
        assert f"--query-gpu={NVIDIA_SMI_QUERY},memory.reserved" in argv
        assert "--format=csv,noheader,nounits" in argv
        assert argv[argv.index("-lms") + 1] == "200"
        apps = _invocations(log, "--query-compute-apps=")
        assert len(apps) == 1, apps  # one long-running process for the processes too
        assert "--query-compute-apps=gpu_uuid,pid,used_memory" in apps[0]
        assert apps[0][apps[0].index("-lms") + 1] == "200"

        c.set_interval(0.5)
        time.sleep(0.3)
        assert [g.index for g in c.sample().gpus] == [0]
        calls = _invocations(log)
        assert len(calls) == 2
        assert calls[1][calls[1].index("-lms") + 1] == "500"
        c.set_interval(0.5)  # unchanged: no restart
        assert len(_invocations(log)) == 2
        assert len(_invocations(log, "--query-compute-apps=")) == 2
    finally:
        c.close()
    for call in _invocations(log, "--query-"):
        assert not Path(f"/proc/{call[0]}").exists(), "nvidia-smi child left running"


def test_nvidia_smi_maps_a_tagged_process_to_its_job_and_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawn: Any
) -> None:
    """A real long-running process tagged as a rank, named by the recorded compute-apps row."""
    child = spawn(["sleep", "60"], RIGDECK_JOB_ID="probe-job-1", RIGDECK_RANK="0")
    log = _fake_smi(tmp_path, monkeypatch, apps=[h100data.smi_app_row(child.pid)])
    with Collector(interval=0.2, backend="nvidia-smi") as c:
        s = wait_until(lambda: (lambda x: x if x.gpus and x.gpus[0].processes else None)(c.sample()), 15,
                       "the tagged process in a sample", step=0.05)
        want = GpuProcess(child.pid, ME, h100data.TAGGED["used_memory_mb"], "probe-job-1", 0)
        assert s.gpus[0].processes == [want]
        # as the NVML path mapped the same process on the card
        assert (h100data.TAGGED["job_id"], h100data.TAGGED["rank"]) == ("probe-job-1", 0)
        for _ in range(10):
            assert c.sample().gpus[0].processes == [want]  # one row per tick: never piled up
            time.sleep(0.05)
        (tmp_path / "rows" / "apps").write_text("\n")  # the process left the GPU
        wait_until(lambda: c.sample().gpus[0].processes == [], 15, "the process gone from the samples", step=0.05)
    assert len(_invocations(log, "--query-compute-apps=")) == 1


def test_nvidia_smi_without_memory_reserved_asks_the_plain_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _fake_smi(tmp_path, monkeypatch, mode="old-driver")
    with Collector(interval=0.2, backend="nvidia-smi") as c:
        g = wait_until(lambda: c.sample().gpus, 15, "a GPU in a sample", step=0.05)[0]
    assert (g.memory_used_mb, g.memory_reserved_mb) == (h100data.SMI_USED_MB, None)
    calls = _invocations(log)
    assert [NVIDIA_SMI_RESERVED in " ".join(call) for call in calls] == [True, False]


def test_nvidia_smi_child_that_dies_is_restarted_at_most_every_restart_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _fake_smi(tmp_path, monkeypatch, mode="once")
    with Collector(interval=0.1, backend="nvidia-smi") as c:
        for _ in range(20):
            s = c.sample()
            time.sleep(0.05)
        assert len(_invocations(log)) == 1  # the default waits 10 s before a restart
        assert [g.index for g in s.gpus] == [0]  # the last rows stay until they are stale

    log.unlink()
    monkeypatch.setattr(telemetry._NvidiaSmiStream, "RESTART_MIN_S", 0.4)
    with Collector(interval=0.1, backend="nvidia-smi") as c:
        t_end = time.monotonic() + 1.5
        while time.monotonic() < t_end:
            c.sample()
            time.sleep(0.05)
    n = len(_invocations(log))
    assert 2 <= n <= 5, n


def test_auto_passes_over_a_failing_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_smi(tmp_path, monkeypatch, mode="fail")
    with Collector(sim_gpus=2, nvml_module=_failing_nvml()) as c:
        assert c.gpu_source == "simulated"
        assert any("nvidia-smi" in n for n in c.notes)
    with Collector(nvml_module=_failing_nvml()) as c:
        assert c.gpu_source == "none"
        assert c.sample().gpus == []


def test_forced_backends_that_cannot_start_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(TelemetryError, match="nvidia-smi"):
        Collector(backend="nvidia-smi")
    with pytest.raises(TelemetryError, match="NVML"):
        Collector(backend="nvml", nvml_module=_failing_nvml())
    with pytest.raises(ValueError, match="backend"):
        Collector(backend="cuda")


# --- NVML through a fake pynvml ---------------------------------------------------------------


def _nvproc(pid: int, mb: int | None) -> Any:
    return SimpleNamespace(pid=pid, usedGpuMemory=None if mb is None else mb * 1024 * 1024)


def test_nvml_reads_every_field_and_caches_handles(spawn: Any) -> None:
    fake = FakeNvml(gpus=2)
    fake.no_ecc.add(1)
    # The recorded load: a process tagged as rank 0 of probe-job-1 holding 6854 MB of GPU 0.
    tagged = h100data.TAGGED
    child = spawn(["sleep", "60"], RIGDECK_JOB_ID=tagged["job_id"], RIGDECK_RANK=str(tagged["rank"]))
    fake.compute[0] = [_nvproc(child.pid, tagged["used_memory_mb"])]
    fake.graphics[0] = [_nvproc(child.pid, None)]  # the same pid twice: reported once
    fake.compute[1] = [_nvproc(os.getpid(), None)]
    c = Collector(nvml_module=fake, hostname="gpu-01")
    try:
        assert c.gpu_source == "nvml"
        for _ in range(50):
            s = c.sample()
    finally:
        c.close()
        c.close()
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2  # once per GPU, never per tick
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlShutdown"] == 1
    assert s.gpu_source == "nvml" and not s.simulated and s.seq == 50
    g0, g1 = s.gpus
    rec0, rec1 = h100data.gpu("nvml", 0), h100data.gpu("nvml", 1)
    assert (g0.name, g0.uuid) == ("NVIDIA H100 80GB HBM3", "GPU-ed75f99d-faf1-c964-30aa-fa99a14baa78")
    assert g1.uuid != g0.uuid
    assert (g0.utilization_pct, g1.utilization_pct) == (rec0["utilization_pct"], rec1["utilization_pct"])
    assert (g0.temperature_c, g0.power_w, g0.power_limit_w) == (
        rec0["temperature_c"], rec0["power_w"], 700.0)
    assert g0.sm_clock_mhz == rec0["sm_clock_mhz"]
    assert g0.ecc_volatile_errors == 0
    assert g1.ecc_volatile_errors is None  # NOT_SUPPORTED: no ECC on this card
    # NOT_SUPPORTED does not change: GPU 1 is asked once, GPU 0 every tick.
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 50 + 1
    assert g0.processes == [GpuProcess(child.pid, ME, 6854, "probe-job-1", 0)]
    assert g1.processes == [GpuProcess(os.getpid(), ME, None, None, None)]


def test_nvml_memory_used_is_what_nvidia_smi_showed_on_the_same_card() -> None:
    smi = h100data.SMI_USED_MB  # 6863: nvidia-smi, the same load, the same seconds
    with Collector(nvml_module=FakeNvml(gpus=1)) as c:
        g = c.sample().gpus[0]
    assert abs(g.memory_used_mb - smi) <= 0.01 * smi, (g.memory_used_mb, smi)
    assert (g.memory_reserved_mb, g.memory_total_mb) == (h100data.RESERVED_MB, h100data.TOTAL_MB)
    # The first memory call alone (what rigdeck showed before: 7342 MB) is 7% off.
    assert abs(h100data.NVML_V1_USED_MB - smi) > 0.01 * smi


@pytest.mark.parametrize("missing", ["pynvml", "driver"])
def test_nvml_without_memory_info_v2_falls_back_to_the_first_version(missing: str) -> None:
    fake = FakeNvml(gpus=1)
    if missing == "pynvml":
        fake.nvmlMemory_v2 = None  # type: ignore[assignment]
    else:
        fake.driver_has_v2 = False
    with Collector(nvml_module=fake) as c:
        for _ in range(5):
            g = c.sample().gpus[0]
    assert (g.memory_used_mb, g.memory_reserved_mb) == (h100data.NVML_V1_USED_MB, None)
    # a driver without v2 is asked for it once, then the first version every tick
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == (5 if missing == "pynvml" else 6)


def test_nvml_error_on_one_field_gives_none_for_that_field_only() -> None:
    fake = FakeNvml(gpus=2)
    fake.lost_power.add(0)
    fake.compute[1] = [_nvproc(999_999_999, 10)]  # a pid this /proc does not show
    with Collector(nvml_module=fake) as c:
        s1 = c.sample()
        fake.lost_power.clear()
        s2 = c.sample()
    assert s1.gpus[0].power_w is None
    assert s1.gpus[0].power_limit_w == 700.0
    assert s1.gpus[1].power_w == h100data.gpu("nvml", 1)["power_w"]
    assert s2.gpus[0].power_w == h100data.gpu("nvml", 0)["power_w"]  # asked again next tick
    assert s1.gpus[1].processes == [GpuProcess(999_999_999, None, 10, None, None)]


def test_nvml_without_gpus_falls_through_in_auto_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    fake = FakeNvml(gpus=0)
    with Collector(nvml_module=fake, sim_gpus=1) as c:
        assert c.gpu_source == "simulated"
    assert fake.calls["nvmlShutdown"] == 1


# --- simulated GPUs ---------------------------------------------------------------------------


def test_simulated_gpu_follows_a_cpu_burning_process(spawn: Any) -> None:
    burner = spawn([sys.executable, "-c", "while True: pass"], RIGDECK_SIM_GPU="1")
    with Collector(sim_gpus=2, interval=0.5, hostname="sim-host") as c:
        assert c.gpu_source == "simulated"
        # A 2-core machine under test load gives the burner well under a full core at times:
        # the bar is "clearly busy", not "saturated".
        t_end = time.monotonic() + 10.0
        util1 = 0.0
        while time.monotonic() < t_end:
            s = c.sample()
            util1 = s.gpus[1].utilization_pct or 0.0
            if util1 > 25:
                break
            time.sleep(0.5)
    assert util1 > 25, util1
    assert s.simulated and s.gpu_source == "simulated"
    expected = simulated_gpus(2, "sim-host")
    for g, e in zip(s.gpus, expected, strict=True):
        assert (g.index, g.name, g.uuid, g.memory_total_mb) == (
            e["index"],
            e["name"],
            e["uuid"],
            81920,
        )
        assert g.simulated is True
    g0, g1 = s.gpus
    assert burner.pid in [p.pid for p in g1.processes]
    assert burner.pid not in [p.pid for p in g0.processes]
    if not g0.processes:  # other tagged processes of this user (a test bed job) could use GPU 0
        assert (g0.utilization_pct, g0.memory_used_mb, g0.sm_clock_mhz) == (0.0, 0, 345)
    mine = [p for p in g1.processes if p.pid == burner.pid][0]
    assert mine.user == ME and mine.job_id is None and mine.rank is None
    assert mine.used_memory_mb is not None and mine.used_memory_mb > 0
    u = g1.utilization_pct
    assert u is not None and g1.memory_used_mb is not None
    assert 300 < g1.memory_used_mb <= 81920
    assert g1.temperature_c == pytest.approx(30 + 0.5 * u, abs=0.051)
    assert g1.power_w == pytest.approx(60 + 6 * u, abs=0.051)
    assert (g1.power_limit_w, g1.sm_clock_mhz, g1.ecc_volatile_errors) == (700.0, 1980, 0)


def test_simulated_assignment_by_job_and_cuda_visible_devices(spawn: Any) -> None:
    uuid1 = simulated_gpus(4, "tags")[1]["uuid"]
    rank2 = spawn(
        ["sleep", "60"], RIGDECK_JOB_ID="j7", RIGDECK_RANK="2", CUDA_VISIBLE_DEVICES="2,3"
    )
    by_uuid = spawn(["sleep", "60"], RIGDECK_JOB_ID="j7", CUDA_VISIBLE_DEVICES=uuid1)
    untagged = spawn(["sleep", "60"], CUDA_VISIBLE_DEVICES="3")  # no job id: not a rank
    out_of_range = spawn(["sleep", "60"], RIGDECK_SIM_GPU="9")
    # torchrun gives each rank of a host all the host's GPUs; a rank uses the one at LOCAL_RANK.
    torchrun = [
        spawn(["sleep", "60"], RIGDECK_JOB_ID="j8", CUDA_VISIBLE_DEVICES="0,3", LOCAL_RANK=str(lr))
        for lr in (0, 1)
    ]
    with Collector(sim_gpus=4, backend="simulated", hostname="tags") as c:
        s = c.sample()
    pids = {g.index: {p.pid: p for p in g.processes} for g in s.gpus}
    assert torchrun[0].pid in pids[0] and torchrun[0].pid not in pids[3]
    assert torchrun[1].pid in pids[3] and torchrun[1].pid not in pids[0]
    assert pids[2][rank2.pid] == GpuProcess(
        rank2.pid, ME, pids[2][rank2.pid].used_memory_mb, "j7", 2
    )
    assert by_uuid.pid in pids[1]
    everywhere = {pid for g in pids.values() for pid in g}
    assert untagged.pid not in everywhere
    assert out_of_range.pid not in everywhere
    assert (s.gpus[2].memory_used_mb or 0) >= 300


def test_simulated_finds_processes_started_later_and_forgets_dead_ones(spawn: Any) -> None:
    with Collector(sim_gpus=1, backend="simulated") as c:
        c.sample()
        child = spawn(["sleep", "60"], RIGDECK_SIM_GPU="0")
        deadline = time.monotonic() + 6.0
        while child.pid not in [p.pid for p in c.sample().gpus[0].processes]:
            assert time.monotonic() < deadline, "a new tagged process was never picked up"
            time.sleep(0.2)
        child.kill()
        child.wait()
        assert child.pid not in [p.pid for p in c.sample().gpus[0].processes]


def test_simulated_holds_no_files_after_processes_die_or_close(spawn: Any) -> None:
    def held() -> set[int]:
        """The processes whose /proc/PID/stat this process holds open: the collector's, between
        ticks. (Not every fd of the process: another thread of the test worker may open and close
        files meanwhile; fresh-clone run 20 failed once on such a count.)"""
        out = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # closed since the listing
                continue
            m = re.fullmatch(r"/proc/(\d+)/stat", target)
            if m:
                out.add(int(m.group(1)))
        return out

    children = [spawn(["sleep", "60"], RIGDECK_SIM_GPU="0") for _ in range(3)]
    pids = {child.pid for child in children}
    c = Collector(sim_gpus=1, backend="simulated")
    c.sample()
    assert held() & pids == pids  # each tagged process's stat file stays open between ticks
    for child in children[:2]:
        child.kill()
        child.wait()
    c.sample()
    assert held() & pids == {children[2].pid}  # the dead ones' are closed
    c.close()
    assert held() & pids == set()


def test_simulated_ignores_other_users_processes(spawn: Any) -> None:
    require(os.geteuid() == 0, "needs root to start a process as another user")
    other = spawn(["sleep", "60"], user=65534, RIGDECK_SIM_GPU="0")
    with Collector(sim_gpus=1, backend="simulated") as c:
        s = c.sample()
    assert other.pid not in [p.pid for p in s.gpus[0].processes]


def test_parse_environ_keeps_only_rigdeck_tags() -> None:
    data = b"PATH=/bin\0RIGDECK_JOB_ID=j1\0RIGDECK_RANK=3\0CUDA_VISIBLE_DEVICES=1,2\0X=RIGDECK_\0"
    assert parse_environ(data) == {
        "RIGDECK_JOB_ID": "j1",
        "RIGDECK_RANK": "3",
        "CUDA_VISIBLE_DEVICES": "1,2",
    }
    assert parse_environ(b"PATH=/bin\0CUDA_VISIBLE_DEVICES=0\0") == {}


# --- host metrics -----------------------------------------------------------------------------


def _check_host(c: Collector) -> None:
    first = c.sample().host
    assert (first.disk_read_bps, first.disk_write_bps, first.net_rx_bps, first.net_tx_bps) == (
        0.0,
        0.0,
        0.0,
        0.0,
    )
    assert first.cpu_pct == 0.0
    t_end = time.monotonic() + 0.3
    while time.monotonic() < t_end:  # some CPU work to measure
        sum(range(10000))
    with open(os.devnull, "wb") as f:
        f.write(b"x")
    h = c.sample().host
    assert 0.0 <= h.cpu_pct <= 100.0
    assert h.cpu_pct > 0.0
    assert 1 <= len(h.cpu_per_core) <= (os.cpu_count() or 1)
    assert all(0.0 <= x <= 100.0 for x in h.cpu_per_core)
    assert len(h.load) == 3 and all(x >= 0 for x in h.load)
    assert h.mem_total_mb > 0 and 0 < h.mem_used_mb <= h.mem_total_mb
    assert 0 <= h.swap_used_mb <= max(h.swap_total_mb, 0) or h.swap_total_mb == 0
    assert min(h.disk_read_bps, h.disk_write_bps, h.net_rx_bps, h.net_tx_bps) >= 0.0


def test_host_metrics_with_psutil() -> None:
    require(has_module("psutil"), PSUTIL_MISSING)
    with Collector(backend="none", use_psutil=True) as c:
        assert c.uses_psutil
        _check_host(c)


def test_host_metrics_from_proc() -> None:
    with Collector(backend="none", use_psutil=False) as c:
        assert not c.uses_psutil
        _check_host(c)
    with Collector(backend="none") as c:  # the default where there is a /proc: psutil unused
        assert not c.uses_psutil


def test_host_metrics_without_psutil_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil -> ImportError
    with Collector(backend="none") as c:
        assert not c.uses_psutil
        _check_host(c)
    with pytest.raises(TelemetryError, match="psutil"):
        Collector(backend="none", use_psutil=True)


def test_psutil_and_proc_agree_on_memory() -> None:
    require(has_module("psutil"), PSUTIL_MISSING)
    with (
        Collector(backend="none", use_psutil=True) as a,
        Collector(backend="none", use_psutil=False) as b,
    ):
        ha, hb = a.sample().host, b.sample().host
    assert ha.mem_total_mb == hb.mem_total_mb
    assert ha.swap_total_mb == hb.swap_total_mb
    assert len(ha.cpu_per_core) == len(hb.cpu_per_core)


def test_proc_parsers_on_recorded_text() -> None:
    stat_text = textwrap.dedent(
        """\
        cpu  400 0 200 1000 100 0 0 0 0 0
        cpu0 200 0 100 500 50 0 0 0 0 0
        cpu1 200 0 100 500 50 0 0 0 0 0
        intr 123456 0 0 0
        ctxt 98765
        """
    )
    assert parse_proc_stat_cpus(stat_text) == [(300.0, 850.0), (300.0, 850.0)]

    meminfo = "MemTotal: 2048000 kB\nMemFree: 100000 kB\nMemAvailable: 1024000 kB\n"
    meminfo += "SwapTotal: 1024000 kB\nSwapFree: 512000 kB\n"
    assert parse_meminfo(meminfo) == (1000, 2000, 500, 1000)
    old_kernel = "MemTotal: 2048000 kB\nMemFree: 1024000 kB\nBuffers: 0 kB\nCached: 0 kB\n"
    assert parse_meminfo(old_kernel) == (1000, 2000, 0, 0)

    diskstats = textwrap.dedent(
        """\
           7       0 loop0 10 0 80 0 0 0 0 0 0 0 0 0 0 0 0 0 0
         259       0 nvme0n1 100 0 2000 0 50 0 4000 0 0 0 0 0 0 0 0 0 0
         259       1 nvme0n1p1 100 0 2000 0 50 0 4000 0 0 0 0 0 0 0 0 0 0
         254       0 vda 1 0 8 0 2 0 16 0 0 0 0
        """
    )
    disks = parse_diskstats(diskstats)
    assert disks["nvme0n1"] == (2000 * 512, 4000 * 512)
    assert disks["vda"] == (8 * 512, 16 * 512)

    net = textwrap.dedent(
        """\
        Inter-|   Receive                                                |  Transmit
         face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs
            lo:    3193      29    0    0    0     0          0         0     3193      29    0
          eth0:61022065    1875    0    0    0     0          0         0   137285    1074    0
        """
    )
    assert parse_net_dev(net) == {"lo": (3193, 3193), "eth0": (61022065, 137285)}


def test_whole_disks_skips_partitions_and_virtual_devices() -> None:
    names = [
        "loop0",
        "ram0",
        "zram0",
        "sda",
        "sda1",
        "sda2",
        "nvme0n1",
        "nvme0n1p1",
        "nvme1n1",
        "mmcblk0",
        "mmcblk0p1",
        "dm-0",
        "md0",
        "vda",
        "xvdb1",  # a partition whose disk is not listed counts on its own
        "sr0",
    ]
    assert whole_disks(names) == ["sda", "nvme0n1", "nvme1n1", "mmcblk0", "vda", "xvdb1", "sr0"]


# --- the collector itself ---------------------------------------------------------------------


def test_interval_is_clamped_and_seq_counts() -> None:
    with Collector(backend="none", interval=0.01) as c:
        assert c.interval == 0.1
        c.set_interval(1000)
        assert c.interval == 60.0
        c.set_interval(0.5)
        assert c.interval == 0.5
        assert [c.sample().seq for _ in range(3)] == [1, 2, 3]
        s = c.sample()
        assert s.cost_s >= 0 and s.gpu_source == "none" and not s.simulated
    with pytest.raises(TelemetryError, match="closed"):
        c.sample()


def test_import_pulls_in_no_optional_module() -> None:
    code = (
        "import sys, agent.telemetry\n"
        "bad = [m for m in ('psutil', 'pynvml') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_smoke_under_python_3_9() -> None:
    py39 = python39()
    require(py39, PY39_MISSING)
    code = textwrap.dedent(
        """\
        import json, sys, time
        import agent.telemetry as t
        c = t.Collector(sim_gpus=2)
        c.sample()
        time.sleep(0.2)
        s = c.sample()
        c.close()
        d = t.sample_to_dict(s)
        assert t.sample_from_dict(d) == s
        print(json.dumps({"sample": d, "has_psutil": "psutil" in sys.modules}))
        """
    )
    env = _clean_env(PYTHONPATH=str(ROOT))
    env.pop("PYTHONHOME", None)
    proc = subprocess.run(
        [str(py39), "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    d = out["sample"]
    assert d["seq"] == 2
    assert d["hostname"]
    assert d["host"]["mem_total_mb"] > 0
    if d["gpu_source"] == "simulated":
        assert [g["simulated"] for g in d["gpus"]] == [True, True]
        assert d["simulated"] is True


def test_a_process_caught_inside_its_exec_is_read_again_even_at_the_first_scan(tmp_path: Path) -> None:
    """An environment read empty is a process whose exec has not yet set the new one: it is read
    once more at the next scan. One read whole at the first scan is past its exec: read once."""
    proc = tmp_path / "proc"
    for pid, environ in ((101, b""), (102, b"PATH=/bin\0")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "environ").write_bytes(environ)
    table = telemetry.ProcessTable(str(proc))
    assert table.rescan(0.0, force=True) and table.tagged() == []
    (proc / "101" / "environ").write_bytes(b"PATH=/bin\0RIGDECK_JOB_ID=j1\0RIGDECK_RANK=0\0")
    (proc / "102" / "environ").write_bytes(b"RIGDECK_JOB_ID=j2\0")  # not a real change: never read
    table.rescan(10.0, force=True)
    assert [(p.pid, p.env) for p in table.tagged()] == [(101, {"RIGDECK_JOB_ID": "j1", "RIGDECK_RANK": "0"})]
    (proc / "101" / "environ").write_bytes(b"")
    table.rescan(20.0, force=True)
    assert [p.pid for p in table.tagged()] == [101]  # read twice at most


def test_proc_is_listed_again_only_once_a_new_pid_was_handed_out(tmp_path: Path) -> None:
    """/proc/loadavg names the newest pid: while it stays, no process was made (a new one, even
    under a reused pid, takes a new pid) and /proc is not listed again; the processes that were
    new at the last listing are still read once more (one may have been caught before its exec)."""
    proc = tmp_path / "proc"

    def newest(pid: int) -> None:
        (proc / "loadavg").write_text(f"0.10 0.20 0.30 1/99 {pid}\n")

    def spawn(pid: int, environ: bytes) -> None:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "environ").write_bytes(environ)

    spawn(101, b"PATH=/bin\0")
    newest(101)
    table = telemetry.ProcessTable(str(proc))
    assert table.rescan(0.0) and len(table) == 1
    spawn(102, b"PATH=/bin\0")  # between fork and exec: its parent's environment
    newest(102)
    assert table.rescan(2.0) and len(table) == 2 and table.tagged() == []
    (proc / "102" / "environ").write_bytes(b"RIGDECK_JOB_ID=j1\0RIGDECK_RANK=3\0")  # its exec
    spawn(103, b"RIGDECK_JOB_ID=j9\0")  # made up: no real process appears without a new pid
    assert not table.rescan(4.0)  # the newest pid is the same: not listed...
    assert [(p.pid, p.env) for p in table.tagged()] == [(102, {"RIGDECK_JOB_ID": "j1", "RIGDECK_RANK": "3"})]
    assert len(table) == 2  # ...so 103 is not seen, as no real process could be there
    assert not table.rescan(5.0)  # and not before RESCAN_S either
    newest(104)
    assert table.rescan(6.0) and len(table) == 3
    assert sorted(p.pid for p in table.tagged()) == [102, 103]
    (proc / "loadavg").unlink()  # no newest pid to tell: listed every RESCAN_S, as before
    spawn(105, b"RIGDECK_JOB_ID=j5\0")
    assert table.rescan(8.0) and len(table) == 4
