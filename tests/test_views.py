"""The typed host and GPU views the app reads (tui/model/hostviews.py): what ClusterState builds
from the agent's sample dicts, that they are immutable and shared, that the plain dicts
(``to_json``) keep their shape, and that a face's mirror of a server's state sees the same."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.ui_fixtures import FINGERPRINT, JOB, cluster_state, gpu_sample, host_sample
from tui.model.hostviews import GpuClaim, GpuProcess, GpuView, HostKey, HostSample, HostView
from tui.model.state import ClusterState, HostStatus

HOST_JSON_KEYS = {
    "name", "address", "status", "reason", "error_kind", "host_key", "agent_version", "agent_pid",
    "hostname", "upgrade_pending", "simulated", "gpu_source", "samples", "host_sample", "gpus",
    "gpu_count", "gpus_busy", "gpus_simulated", "gpu_model", "gpus_unhealthy", "gpus_drained", "sample_age_s",
}


def _gpu_as_dict_says(d: dict[str, Any]) -> dict[str, Any]:
    """What a GPU view should hold, from the GPU's plain dict."""
    procs = tuple(GpuProcess(p.get("pid"), p.get("user"), p.get("used_memory_mb"), p.get("job_id"),
                             p.get("rank")) for p in d.get("processes") or ())
    claim = d.get("claim")
    return {
        "host": d["host"], "index": d["index"], "uuid": d["uuid"], "name": d["name"],
        "simulated": bool(d["simulated"]), "utilization_pct": d["utilization_pct"],
        "memory_used_mb": d["memory_used_mb"], "memory_total_mb": d["memory_total_mb"],
        "temperature_c": d["temperature_c"], "power_w": d["power_w"],
        "power_limit_w": d["power_limit_w"], "sm_clock_mhz": d["sm_clock_mhz"],
        "ecc_volatile_errors": d["ecc_volatile_errors"], "processes": procs,
        "claim": GpuClaim(claim.get("job_id"), claim.get("user"), claim.get("since")) if claim else None,
        "stale": d["stale"], "history": tuple(d["history"]),
    }


def test_views_hold_what_the_dicts_hold() -> None:
    state = cluster_state()
    views, dicts = state.snapshot(), state.to_json()
    assert [set(d) for d in dicts] == [HOST_JSON_KEYS] * 3
    assert [set(d) for d in state.to_json(gpus=False)] == [HOST_JSON_KEYS - {"gpus"}] * 3
    for h, d in zip(views, dicts, strict=True):
        for f in dataclasses.fields(HostView):
            if f.name in ("gpus", "host_sample", "host_key", "sampled_at"):
                continue
            assert getattr(h, f.name) == d[f.name], f.name
        assert h.host_key == HostKey.from_info(d["host_key"])
        assert h.host_sample == HostSample.from_sample(d["host_sample"])
        assert [dataclasses.asdict(g) for g in h.gpus or ()] == [
            dataclasses.asdict(GpuView(**_gpu_as_dict_says(g))) for g in d["gpus"]
        ]
    h1, h2, h3 = views
    assert h1.up and h1.gpu_count == 4 and h1.gpus_busy == 2 and h1.gpu_model == "Simulated GPU"
    assert h2.gpus_busy == 3  # bob's process on GPU 3
    assert h1.host_sample is not None and len(h1.host_sample.cpu_per_core) == 16
    assert h1.host_sample.load == (1.0, 1.0, 1.0)
    g0 = (h1.gpus or ())[0]
    assert g0.busy and g0.job_ids == [JOB] and g0.processes[0].rank == 0 and len(g0.history) == 30
    assert not h3.up and h3.gpus == () and h3.gpu_count == 0 and h3.sampled_at is None
    assert h3.host_key == HostKey(FINGERPRINT, "ssh-ed25519", None, "10.213.1.13")
    assert h3.host_key is not None and not h3.host_key.changed
    assert h3.sample_age_s is None and (h1.sample_age_s or 0) > 0


def test_views_are_frozen_shared_and_rebuilt_on_change() -> None:
    state = cluster_state()
    full, hosts = state.snapshot(), state.snapshot(gpus=False)
    h1 = full[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        h1.name = "x"  # type: ignore[misc]
    g = state.gpu("h1", 1)
    assert g is not None and g is (h1.gpus or ())[1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.utilization_pct = 0.0  # type: ignore[misc]
    # A view made by a builder is a view like any other: equal to one made field by field.
    assert type(g) is GpuView and GpuView(**dataclasses.asdict(g) | {"processes": g.processes}) == g
    assert hash(g) == hash(dataclasses.replace(g))
    # Nothing changed: the same objects. Hosts-only: no GPU list, the same counts.
    assert state.snapshot()[0] is h1 and state.snapshot(gpus=False)[0] is hosts[0]
    assert hosts[0].gpus is None and hosts[0].gpu_count == h1.gpu_count == 4
    assert dataclasses.replace(hosts[0], gpus=h1.gpus) == h1
    # A host going stale marks its GPUs stale: new views; the old ones keep what they said.
    state.set_status("h1", HostStatus.STALE, "no telemetry for 3.0s")
    stale = state.snapshot()[0]
    assert stale.status == "stale" and all(x.stale for x in stale.gpus or ())
    assert not g.stale and state.gpu("h1", 1) is not g
    assert state.snapshot()[1] is full[1]  # the other hosts' views stay
    assert state.gpu("h1", 9) is None and state.gpu("nope", 0) is None


def test_a_new_sample_makes_new_gpu_views_and_keeps_unchanged_processes() -> None:
    state = ClusterState([("h1", "a")])
    gpus = [gpu_sample(1, 0, 0, JOB, 0), gpu_sample(1, 1, 0, None, None, "bob")]
    state.apply_sample("h1", host_sample(1, 0, gpus), received_at=0.0)
    before = state.gpu("h1", 0)
    gpus = [gpu_sample(1, 0, 1, JOB, 0), gpu_sample(1, 1, 1)]  # bob's process ended
    state.apply_sample("h1", host_sample(1, 1, gpus), received_at=1.0)
    after, idle = state.gpu("h1", 0), state.gpu("h1", 1)
    assert before is not None and after is not None and idle is not None
    assert after is not before and after.processes is before.processes
    assert idle.processes == () and not idle.busy and idle.job_ids == []
    assert len(after.history) == 2
    claimed = {**gpu_sample(1, 1, 2), "claim": {"job_id": "j", "user": "ana", "since": 1.0}}
    state.apply_sample("h1", host_sample(1, 2, [gpu_sample(1, 0, 2, JOB, 0), claimed]))
    g = state.gpu("h1", 1)
    assert g is not None and g.busy and g.claim == GpuClaim("j", "ana", 1.0)


def test_a_mirror_of_a_server_state_sees_the_same_views() -> None:
    from tui.control.server import StateMirror, _Sent, host_delta

    src = cluster_state()
    dst = ClusterState([(n, h.address) for n, h in src.hosts.items()])
    mirror = StateMirror(dst)
    sent: dict[str, _Sent] = {}

    def sync() -> None:
        deltas = [host_delta(h, sent.setdefault(h.name, _Sent())) for h in src.hosts.values()]
        mirror.apply([d for d in deltas if d is not None])

    def same() -> None:
        for a, b in zip(src.snapshot(), dst.snapshot(), strict=True):
            assert dataclasses.replace(a, samples=0, sampled_at=None) == dataclasses.replace(
                b, samples=0, sampled_at=None
            )

    sync()
    same()
    gpus = [gpu_sample(1, idx, 31, JOB if idx < 2 else None, idx if idx < 2 else None) for idx in range(3)]
    src.apply_sample("h1", host_sample(1, 31, gpus), received_at=31.0)  # h1 lost a GPU
    sync()
    same()
    assert dst.snapshot()[0].gpu_count == 3
