"""agent.gpuhealth: each GPU's health judged on the host, from NVML (a fake pynvml here; the real
one is exercised on a GPU machine) and from the simulated GPUs' faults file."""
from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

from agent import gpuhealth
from agent.gpuhealth import HealthJudge, Observation
from agent.telemetry import Collector, GpuSample
from tests.kit.fakes import FakeNvml, FakeNVMLError


def test_a_critical_xid_makes_a_gpu_unhealthy_until_an_operator_clears_it() -> None:
    j = HealthJudge()
    assert j.judge(0, Observation(ecc_uncorrected=0)) == ("ok", None)
    assert j.judge(1, Observation(xids=[79])) == ("unhealthy", "XID 79: GPU has fallen off the bus")
    # the event was heard once; the GPU stays suspect
    assert j.judge(1, Observation()) == ("unhealthy", "XID 79: GPU has fallen off the bus")
    assert j.judge(0, Observation()) == ("ok", None)
    assert j.clear(1) == [1]
    assert j.judge(1, Observation()) == ("ok", None)


def test_an_application_xid_and_throttling_only_warn() -> None:
    j = HealthJudge()
    health, why = j.judge(0, Observation(xids=[13]))
    assert health == "warn" and why is not None and why.startswith("XID 13 (not one NVIDIA lists")
    assert j.judge(0, Observation()) == ("ok", None)  # a warning is not remembered
    assert j.judge(2, Observation(throttle=gpuhealth.throttle_text(0x40 | 0x8))) == (
        "warn", "throttled: hardware slowdown, hardware thermal slowdown")


def test_uncorrected_ecc_rising_lost_and_pending_remaps_are_faults() -> None:
    j = HealthJudge()
    assert j.judge(0, Observation(ecc_uncorrected=2)) == ("ok", None)  # counted before we looked
    assert j.judge(0, Observation(ecc_uncorrected=5)) == ("unhealthy", "ECC: 5 uncorrected errors (was 2)")
    assert j.judge(1, Observation(lost=True)) == ("unhealthy", "GPU is lost (NVML cannot reach it)")
    assert j.judge(2, Observation(remap_pending=True))[1] == "rows pending remap: the GPU needs a reset"
    assert j.judge(3, Observation(retired_pending=True))[1] == "retired pages pending: the GPU needs a reset"
    assert j.judge(4, Observation(remap_failed=True))[0] == "unhealthy"
    # cleared: the baseline moves to the count then, so the same errors are not a fault again
    j.clear(0)
    assert j.judge(0, Observation(ecc_uncorrected=5)) == ("ok", None)


def _write(path: Path, faults: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    tmp.replace(path)


def test_simulated_faults_file_breaks_a_paper_gpu_for_as_long_as_its_entry_lasts(tmp_path: Path) -> None:
    faults = tmp_path / gpuhealth.SIM_FAULTS_FILE
    with Collector(sim_gpus=4, backend="simulated", hostname="h1", faults_path=str(faults)) as c:
        assert [g.health for g in c.sample().gpus] == ["ok"] * 4  # no file: no fault
        _write(faults, {"1": {"xid": 79}, "2": {"ecc_uncorrected": 3}, "0": {"lost": True},
                        "3": {"throttle": "hw_slowdown"}})
        gpus = c.sample().gpus
        assert [(g.health, g.health_reason) for g in gpus] == [
            ("unhealthy", "GPU is lost (NVML cannot reach it)"),
            ("unhealthy", "XID 79: GPU has fallen off the bus"),
            ("unhealthy", "ECC: 3 uncorrected errors (was 0)"),
            ("warn", "throttled: hardware slowdown"),
        ]
        assert gpus[2].ecc_volatile_errors == 3 and all(g.simulated for g in gpus)
        _write(faults, {"2": {"ecc_uncorrected": 3}})
        assert [g.health for g in c.sample().gpus] == ["ok", "ok", "unhealthy", "ok"]
        faults.write_text("{not json")  # half-written or broken: read as no fault, never a crash
        assert [g.health for g in c.sample().gpus] == ["ok"] * 4


def test_health_crosses_the_wire_and_an_old_agent_reads_as_ok() -> None:
    g = GpuSample(0, "sim", "GPU-x", True, 0.0, 0, 1, 30.0, 60.0, 700.0, 345, 0,
                  health="unhealthy", health_reason="XID 79: GPU has fallen off the bus")
    back = GpuSample.from_dict(json.loads(json.dumps(g.to_dict())))
    assert (back.health, back.health_reason) == ("unhealthy", "XID 79: GPU has fallen off the bus")
    old = g.to_dict()
    del old["health"], old["health_reason"]
    assert (GpuSample.from_dict(old).health, GpuSample.from_dict(old).health_reason) == ("ok", None)


class EventNvml(FakeNvml):
    """A fake pynvml that also has NVML's event set, clock-event reasons and the memory-repair reads."""

    nvmlEventTypeXidCriticalError = 8
    NVML_ERROR_TIMEOUT = 10
    NVML_FEATURE_ENABLED = 1

    def __init__(self, gpus: int = 2) -> None:
        super().__init__(gpus)
        self.queued: deque[tuple[int, int]] = deque()  # (gpu, xid)
        self.registered: list[int] = []
        self.no_events: set[int] = set()
        self.throttle: dict[int, int] = {}
        self.remap_pending: set[int] = set()
        self.freed = 0

    def nvmlEventSetCreate(self) -> Any:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: Any, kind: int, events: Any) -> None:
        i = self._h("nvmlDeviceRegisterEvents", h)
        assert (kind, events) == (8, "event-set")
        if i in self.no_events:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append(i)

    def nvmlEventSetWait_v2(self, events: Any, timeout_ms: int) -> Any:
        self._h("nvmlEventSetWait_v2")
        assert timeout_ms == 0  # a sample never waits for an event
        if not self.queued:
            raise FakeNVMLError(self.NVML_ERROR_TIMEOUT)
        i, xid = self.queued.popleft()
        return type("EventData", (), {"device": ("handle", i), "eventData": xid, "eventType": 8})()

    def nvmlEventSetFree(self, events: Any) -> None:
        self.freed += 1

    def nvmlDeviceGetIndex(self, h: Any) -> int:
        return self._h("nvmlDeviceGetIndex", h)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self.throttle.get(self._h("nvmlDeviceGetCurrentClocksEventReasons", h), 0)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        self._h("nvmlDeviceGetRetiredPagesPendingStatus", h)
        return 0

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        i = self._h("nvmlDeviceGetRemappedRows", h)
        return (0, 1 if i in self.remap_pending else 0, int(i in self.remap_pending), 0)


def test_nvml_xid_events_throttling_and_remaps_reach_each_gpus_health() -> None:
    fake = EventNvml(gpus=3)
    fake.no_events.add(2)  # a GPU that cannot report XIDs still gets judged on its counters
    fake.remap_pending.add(2)
    with Collector(nvml_module=fake) as c:
        assert fake.registered == [0, 1]
        assert [g.health for g in c.sample().gpus] == ["ok", "ok", "unhealthy"]
        fake.queued.extend([(1, 79), (0, 13)])
        fake.throttle[0] = 0x20
        g0, g1, g2 = c.sample().gpus
        assert (g1.health, g1.health_reason) == ("unhealthy", "XID 79: GPU has fallen off the bus")
        assert g0.health == "warn" and "XID 13" in (g0.health_reason or "")
        assert "software thermal slowdown" in (g0.health_reason or "")
        assert g2.health_reason == "rows pending remap: the GPU needs a reset"
        fake.throttle.clear()
        assert [g.health for g in c.sample().gpus] == ["ok", "unhealthy", "unhealthy"]
        # the slow reads (remaps, retired pages) are not made every sample
        assert fake.calls["nvmlDeviceGetRemappedRows"] == 3
    assert fake.freed == 1


def test_a_gpu_whose_queries_say_it_is_lost_is_unhealthy() -> None:
    fake = FakeNvml(gpus=2)  # an NVML without events: health from the counters alone
    fake.lost_power.add(1)
    with Collector(nvml_module=fake) as c:
        g0, g1 = c.sample().gpus
    assert g0.health == "ok"
    assert (g1.health, g1.health_reason) == ("unhealthy", "GPU is lost (NVML cannot reach it)")


def test_the_pci_bus_tells_how_many_gpus_the_host_booted_with(tmp_path: Path) -> None:
    devices = tmp_path / "bus" / "pci" / "devices"
    for name, vendor, cls in [("0000:01:00.0", "0x10de", "0x030200"), ("0000:02:00.0", "0x10de", "0x030000"),
                              ("0000:03:00.0", "0x10de", "0x040300"), ("0000:04:00.0", "0x8086", "0x030000")]:
        (devices / name).mkdir(parents=True)
        (devices / name / "vendor").write_text(vendor + "\n")
        (devices / name / "class").write_text(cls + "\n")
    assert gpuhealth.pci_gpu_count(str(tmp_path)) == 2  # the NVIDIA audio function is not a GPU
    assert gpuhealth.pci_gpu_count(str(tmp_path / "none")) is None


def test_a_gpu_a_job_host_held_out_reads_unhealthy_until_cleared_and_is_no_spare(tmp_path: Path) -> None:
    """agent/gpuhealth.py's held-out record (a job host moved its ranks off the GPU with nobody
    watching): the daemon's samples call the GPU unhealthy with the fault and who held it out,
    even once the sensor reads it ok again; the first record stays; clearing forgets it. The
    spares a job host may move to are the ok GPUs with no process and no claim."""
    d = str(tmp_path)
    assert gpuhealth.read_held_out(d) == {} and gpuhealth.release_held_out(d) == []
    assert gpuhealth.hold_out(d, 1, "XID 79: GPU has fallen off the bus (simulated)", "j1", "h2's job host", 5.0)
    assert not gpuhealth.hold_out(d, 1, "another", "j2", "h2's job host", 6.0)  # the first record stays
    assert gpuhealth.hold_out(d, 2, "ECC", "j2", "h2's job host", 7.0)
    held = gpuhealth.read_held_out(d)
    assert sorted(held) == [1, 2] and held[1]["job_id"] == "j1"
    gpus: list[dict[str, Any]] = [
        {"index": i, "health": "ok", "processes": [], "claim": None} for i in range(5)]
    gpus[3]["processes"] = [{"pid": 9, "user": "bob", "job_id": None}]  # another person's process
    gpus[4]["claim"] = {"job_id": "j7", "user": "ann"}
    gpuhealth.lay_held_out(gpus, held)
    assert (gpus[1]["health"], gpus[1]["health_reason"]) == (
        "unhealthy", "XID 79: GPU has fallen off the bus (simulated); held out by h2's job host (job j1) "
                     "until undrained")
    assert gpuhealth.spare_gpus(gpus) == [0]
    assert gpuhealth.release_held_out(d, [1]) == [1] and sorted(gpuhealth.read_held_out(d)) == [2]
    assert gpuhealth.release_held_out(d) == [2] and gpuhealth.read_held_out(d) == {}
    # a record that is not one is none (the daemon and the job hosts read it at every sample)
    for junk in ("not json", "[1, 2]", '{"x": {}, "-1": {}, "3": "no"}'):
        (tmp_path / gpuhealth.HELD_OUT_FILE).write_text(junk)
        assert gpuhealth.read_held_out(d) == {}
    assert gpuhealth.spare_gpus([{"index": True}, {"index": "1"}, {"health": "ok"}]) == []
