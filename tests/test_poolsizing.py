"""Reduction Server sizing (tui.model.poolsizing): the seed's rule, reducers' total bandwidth
against the workers', and the count that would match."""

from __future__ import annotations

from tui.model.poolsizing import host_gbps, sizing


def test_the_seeds_example_eight_workers_at_100_gbps_want_25_reducers_of_32() -> None:
    replicas = [("primary", "w0")] + [("worker", f"w{i}") for i in range(1, 8)] + [("reduction_server", "r0")]
    gbps = {**{f"w{i}": 100.0 for i in range(8)}, "r0": 32.0}
    got = sizing(replicas, gbps)
    assert got == {"workers_gbps": 800.0, "reducers_gbps": 32.0, "per_reducer_gbps": 32.0, "reducers": 1,
                   "match": 25, "ok": False,
                   "text": "reduction servers 1 x 32 Gbps = 32 Gbps < workers 8 x 100 Gbps = 800 Gbps: 25 would match"}


def test_the_contracts_example_and_enough_reducers() -> None:
    reps = [("primary", "h1"), ("worker", "h2"), ("worker", "h3"), ("reduction_server", "h4")]
    got = sizing(reps, {"h1": 10.0, "h2": 10.0, "h3": 10.0, "h4": 10.0})
    assert got is not None and got["text"] == ("reduction servers 1 x 10 Gbps = 10 Gbps < workers 3 x 10 Gbps "
                                               "= 30 Gbps: 3 would match")
    reps += [("reduction_server", "h5"), ("reduction_server", "h6")]
    got = sizing(reps, {"h1": 10.0, "h2": 10.0, "h3": 10.0, "h4": 10.0, "h5": 25.0, "h6": 25.0})
    assert got is not None and got["ok"] is True and got["reducers_gbps"] == 60.0 and got["match"] == 2
    assert got["text"] == ("reduction servers 3 (10 + 25 + 25 Gbps) = 60 Gbps >= workers 3 x 10 Gbps = 30 Gbps: "
                           "enough (2 would match)")


def test_no_reducers_no_sizing_and_unknown_speeds_are_said() -> None:
    assert sizing([("primary", "h1"), ("parameter_server", "h2")], {}) is None
    got = sizing([("primary", "h1"), ("reduction_server", "h2")], {"h1": 10.0})
    assert got is not None and got["ok"] is None and got["match"] is None and got["workers_gbps"] is None
    assert got["text"] == ("reduction servers 1, workers 1: NIC speed unknown on h2 (the agent reports none), "
                           "so the sizing cannot be checked")


def test_a_hosts_speed_is_its_nic_carrying_the_address_else_the_fastest_known() -> None:
    nics = [{"name": "eth0", "speed_mbps": 10000, "addresses": ["10.0.0.1"]},
            {"name": "ib0", "speed_mbps": 100000, "addresses": ["10.1.0.1"]},
            {"name": "veth", "speed_mbps": None, "addresses": []}]
    assert host_gbps(nics, "10.0.0.1") == 10.0
    assert host_gbps(nics, "192.168.1.1") == 100.0
    assert host_gbps(nics) == 100.0
    assert host_gbps([{"name": "eth0", "speed_mbps": -1, "addresses": []}]) is None
    assert host_gbps(None) is None  # an agent without "nics" in its facts
