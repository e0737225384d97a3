"""The doctor's per-host checks: disk throughput, version drift, the network interface towards
the primary, clock offset and GPU health.

Everything that runs on a host runs through its agent's ``exec`` with no shell: the host's own
interpreter (``python`` in the inventory) runs the source of ``agent/doctorprobe.py`` with ``-c``
(its ``probe`` or ``disk`` command), and the paths and addresses are passed as separate
arguments, so no remote shell ever parses a user's value. The clock is read with the agent's
``ping``. All hosts are asked at once.

``host_findings`` returns the findings and the checks it could not run, with why; the doctor's
entry point (``tui.control.doctor``) merges them with the network measurements.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent.roles import program_source
from tui.model.doctor import Finding

# What runs on a host: agent/doctorprobe.py, whose source the host's own interpreter runs with -c
# (as the controller runs agent/facts.py): its ``probe`` and ``disk`` commands each print one JSON line.
HOST_SOURCE = program_source("doctorprobe.py")  # one of the server key's programs (agent/roles.py)

DISK_MB = 256
MEMORY_FS = ("tmpfs", "ramfs")


# -- helpers ----------------------------------------------------------------------------------


def _hosts_text(hosts: Sequence[str]) -> str:
    return ", ".join(hosts)


def _last_json(stdout: str) -> Any:
    for line in reversed((stdout or "").splitlines()):
        line = line.strip()
        if line.startswith(("{", "[")):
            return json.loads(line)
    raise ValueError("no JSON in its output")


def _run_probe(ctl: Any, hosts: Sequence[str], args: Callable[[str], list[str]],
               timeout_s: float) -> dict[str, Any]:
    """A command of agent/doctorprobe.py (``args(host)``: its name and arguments) on every host
    at once, with the host's own interpreter: host -> the parsed JSON it printed, or an error string."""
    out: dict[str, Any] = {}

    def one(h: str) -> Any:
        python = ctl.inventory.get(h).python
        try:
            res = ctl.agent(h).exec(argv=[python, "-c", HOST_SOURCE, *args(h)], timeout_s=timeout_s,
                                    timeout=timeout_s + 30)
        except Exception as e:  # an unreachable host, an agent error
            return f"{type(e).__name__}: {e}"
        if res.get("timed_out"):
            return f"timed out after {timeout_s:.0f} s"
        if res.get("exit_code") != 0:
            err = (res.get("error") or res.get("stderr") or "").strip().splitlines()
            return f"{python} exited {res.get('exit_code')}: {err[-1] if err else ''}".strip()
        try:
            return _last_json(res.get("stdout") or "")
        except ValueError as e:
            return f"{python}: {e}"

    if not hosts:
        return out
    with ThreadPoolExecutor(max_workers=min(32, len(hosts)), thread_name_prefix="doctorhost") as pool:
        return dict(zip(hosts, pool.map(one, hosts), strict=True))


def _unreachable(check: str, host: str, why: str) -> Finding:
    return Finding(check=check, subject=host, verdict="bad", summary=f"could not check {host}: {why}",
                   advice="make the host reachable (rigdeck hosts) and run the doctor again")


def _fmt_rate(mb_s: float) -> str:
    return f"{mb_s / 1000:.2f} GB/s" if mb_s >= 1000 else f"{mb_s:.0f} MB/s"


# -- disk ------------------------------------------------------------------------------------


def disk_findings(results: dict[str, Any]) -> list[Finding]:
    """Findings from each host's ``disk`` results: per host and dir role, write (fsync) and read
    throughput, compared with the median of the hosts for that role (bad < 50 %, warn < 80 %)."""
    findings: list[Finding] = []
    rows: dict[str, dict[str, dict[str, Any]]] = {}  # role -> host -> row
    for host, res in results.items():
        if isinstance(res, str):
            findings.append(_unreachable("disk", host, res))
            continue
        for r in res:
            rows.setdefault(r["role"], {})[host] = r
    for role, per_host in rows.items():
        rates: dict[str, tuple[float, float]] = {}
        for host, r in per_host.items():
            if r.get("error") or not r.get("write_s") or not r.get("read_s"):
                findings.append(Finding(
                    check="disk", subject=host, verdict="bad",
                    summary=f"{role} dir {r.get('dir')}: {r.get('error') or 'no figures'}",
                    advice=f"check that {r.get('dir')} exists, is writable and has room for the test file"))
                continue
            rates[host] = (r["bytes"] / r["write_s"] / 1e6, r["read_bytes"] / r["read_s"] / 1e6)
        if not rates:
            continue
        med_w = statistics.median(w for w, _ in rates.values())
        med_r = statistics.median(rd for _, rd in rates.values())
        for host, (w, rd) in rates.items():
            r = per_host[host]
            ratio = min(w / med_w if med_w else 1.0, rd / med_r if med_r else 1.0)
            verdict = "bad" if ratio < 0.5 else "warn" if ratio < 0.8 else "ok"
            memory = r.get("fstype") in MEMORY_FS
            how = r.get("read_method")
            cache = ("memory-backed filesystem: figures are RAM's" if memory
                     else "read may come from page cache" if how == "page cache" else f"read uncached ({how})")
            summary = (f"{role} dir {r['dir']} ({r.get('fstype')}): write {_fmt_rate(w)} with fsync, "
                       f"read {_fmt_rate(rd)}, {cache}; {r['bytes'] >> 20} MB")
            if verdict != "ok":
                summary += f"; {ratio:.0%} of the hosts' median"
            advice = ""
            if memory:  # RAM against disks says nothing about either
                advice = f"{r['dir']} is in memory: point the {role} dir at a real disk to measure it"
            elif verdict != "ok":
                advice = (f"{host}'s {role} dir is slow next to the others: check its disk (fio, smartctl), "
                          "that it is local and not nearly full")
            findings.append(Finding(
                check="disk", subject=host, verdict=verdict, summary=summary, advice=advice,
                value=round(w, 1), unit="MB/s", baseline=round(med_w, 1),
                details=(("role", role), ("dir", r["dir"]), ("fstype", r.get("fstype")),
                         ("write_mb_s", round(w, 1)), ("read_mb_s", round(rd, 1)),
                         ("read_mb_s_median", round(med_r, 1)), ("read_method", how),
                         ("bytes", r["bytes"]))))
    return findings


# -- versions --------------------------------------------------------------------------------

COMPONENTS = (("python", "Python"), ("torch", "torch"), ("cuda", "CUDA"), ("nccl", "NCCL"),
              ("driver", "NVIDIA driver"))
STRICT = {"torch", "cuda", "nccl"}  # a major.minor difference here breaks collectives


def _major_minor(v: str) -> str:
    return ".".join(v.split("+")[0].split(".")[:2])


def _absent(key: str, probe: dict[str, Any]) -> str:
    if key == "torch":
        return "missing"
    if key == "cuda" and probe.get("torch"):
        return "none (CPU-only torch)"
    if key == "nccl" and probe.get("torch"):
        return "none (no CUDA device)" if probe.get("cuda") else "none (CPU-only torch)"
    if key == "driver":
        return "none (no NVIDIA driver seen)"
    return "none (no torch)"


def version_findings(probes: dict[str, dict[str, Any]]) -> list[Finding]:
    """One finding per component (Python, torch, CUDA, NCCL, driver): ok when every host has the
    same, else drift naming which hosts have which (bad for torch, CUDA and NCCL when major.minor
    differ or torch is missing somewhere, warn otherwise)."""
    findings: list[Finding] = []
    if not probes:
        return findings
    for key, label in COMPONENTS:
        seen: dict[str, list[str]] = {}
        raw: dict[str, str | None] = {}
        # CUDA and NCCL come with torch: a host without torch is the torch finding's, not theirs
        without = [h for h, p in probes.items()
                   if key in ("cuda", "nccl") and (not p.get("torch") or p.get("torch_broken"))]
        for host, p in probes.items():
            if host in without:
                continue
            v = p.get(key)
            raw[host] = None if v in (None, "") else str(v)
            shown = raw[host] or _absent(key, p)
            if key == "torch" and p.get("torch_broken"):
                shown += " (installed, does not import)"
            seen.setdefault(shown, []).append(host)
        groups = "; ".join(f"{v} on {_hosts_text(hs)}" for v, hs in seen.items())
        details = tuple((h, v) for h, v in raw.items())
        if not seen:
            continue
        if len(seen) == 1:
            (v,) = seen
            where = (f"every host ({_hosts_text(list(probes))})" if not without
                     else f"{_hosts_text(seen[v])} ({_hosts_text(without)}: no usable torch)")
            findings.append(Finding(check="versions", subject="all", verdict="ok", summary=f"{label}: {v} on {where}",
                                    details=(("component", key), *details)))
            continue
        present = {v for v in raw.values() if v is not None}
        missing = [h for h, v in raw.items() if v is None]
        strict_diff = len({_major_minor(v) for v in present}) > 1
        verdict = "bad" if key in STRICT and (strict_diff or (key == "torch" and missing)) else "warn"
        broken = [h for h, p in probes.items() if key == "torch" and p.get("torch_broken")]
        if key == "torch" and missing:
            advice = (f"install torch on {_hosts_text(missing)} (or point their python in the "
                      "inventory at an environment that has it), the same version as the others")
        elif broken:
            advice = (f"repair torch on {_hosts_text(broken)} ({probes[broken[0]].get('torch_error')}); "
                      "use one torch version on every host")
        elif key == "driver":
            advice = "install the same NVIDIA driver on every host"
        else:
            advice = f"use one {label} version on every host (one image or environment everywhere)"
        findings.append(Finding(check="versions", subject="all", verdict=verdict,
                                summary=f"{label} differs across hosts: {groups}", advice=advice,
                                details=(("component", key), *details)))
    return findings


# -- network ---------------------------------------------------------------------------------


def ifname_matches(spec: str, iface: str) -> bool:
    """Whether NCCL would take ``iface`` under ``NCCL_SOCKET_IFNAME=spec``: a comma list of
    prefixes; ``^`` in front excludes them, ``=`` in front asks for exact names."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    hit = any(iface == n if exact else iface.startswith(n) for n in names)
    return not hit if exclude else hit


def network_findings(probes: dict[str, dict[str, Any]], primary: str,
                     env: dict[str, dict[str, str]]) -> list[Finding]:
    """Per host: the interface and MTU towards the primary, and ``NCCL_SOCKET_IFNAME`` (from the
    inventory's env for the host) against that interface. Warn when MTUs differ across hosts."""
    findings: list[Finding] = []
    mtus: dict[str, int] = {h: int(p["mtu"]) for h, p in probes.items() if p.get("mtu")}
    common: int | None = None  # the MTU most hosts have (the primary's on a tie)
    if mtus:
        counts = Counter(mtus.values())
        top = [m for m, k in counts.items() if k == max(counts.values())]
        common = mtus[primary] if mtus.get(primary) in top else max(top)
    mismatch = len(set(mtus.values())) > 1
    for host, p in probes.items():
        iface, mtu = p.get("interface"), p.get("mtu")
        ifname = env.get(host, {}).get("NCCL_SOCKET_IFNAME")
        towards = "itself" if host == primary else primary
        details: tuple[tuple[str, object], ...] = (
            ("interface", iface), ("mtu", mtu), ("primary_address", p.get("primary_address")),
            ("NCCL_SOCKET_IFNAME", ifname), ("route_source", p.get("route_source")))
        if not iface:
            findings.append(Finding(check="network", subject=host, verdict="warn",
                                    summary=f"no route found towards {towards} ({p.get('primary_address')})",
                                    advice="check the host's routing table (ip route) and the primary's address",
                                    details=details))
            continue
        verdict, notes, advice = "ok", [], ""
        if mismatch and mtu != common:
            verdict = "warn"
            notes.append(f"MTU differs from the other hosts' {common}")
            advice = f"set one MTU on every host's {iface} (ip link set {iface} mtu N) and on the switch"
        if ifname is None:
            notes.append("NCCL_SOCKET_IFNAME not set (NCCL picks an interface itself)")
        elif ifname_matches(ifname, iface):
            notes.append(f"NCCL_SOCKET_IFNAME={ifname} takes {iface}")
        else:
            others = [i for i in p.get("interfaces") or [] if ifname_matches(ifname, i) and i != "lo"]
            if others:
                verdict = "bad" if verdict == "bad" else "warn"
                notes.append(f"NCCL_SOCKET_IFNAME={ifname} takes {', '.join(others)}, not {iface}")
            else:
                verdict = "bad"
                notes.append(f"NCCL_SOCKET_IFNAME={ifname} matches no interface on the host")
            advice = (f"set NCCL_SOCKET_IFNAME={iface} for {host} in the inventory's env "
                      "(the route to the primary uses it)")
        findings.append(Finding(
            check="network", subject=host, verdict=verdict,
            summary=f"towards {towards} via {iface}, MTU {mtu}; " + "; ".join(notes),
            advice=advice, value=float(mtu) if mtu else None, unit="bytes",
            baseline=float(common) if common else None, details=details))
    return findings


# -- clock -----------------------------------------------------------------------------------

CLOCK_WARN_S = 0.05
CLOCK_BAD_S = 1.0


def measure_clock(ctl: Any, host: str, tries: int = 5) -> tuple[float, float]:
    """(offset, round trip) in seconds of ``host``'s clock against this one, NTP-style: the
    agent's time against the middle of send and receive, from the try with the shortest round
    trip (whose half is the error bound)."""
    agent = ctl.agent(host)
    agent.ping(timeout=30)  # connected (and the agent deployed) before anything is timed
    best: tuple[float, float] | None = None
    for _ in range(tries):
        t0 = time.time()
        remote = agent.ping(timeout=30)
        t1 = time.time()
        rtt = t1 - t0
        if best is None or rtt < best[1]:
            best = (remote - (t0 + t1) / 2, rtt)
    assert best is not None
    return best


def clock_finding(host: str, offset: float, rtt: float) -> Finding:
    off = abs(offset)
    shown = round(offset * 1000, 1) or 0.0  # no "-0.0"
    verdict = "bad" if off > CLOCK_BAD_S else "warn" if off > CLOCK_WARN_S else "ok"
    advice = "" if verdict == "ok" else (f"run NTP (chrony or systemd-timesyncd) on {host}: "
                                         "logs and timeouts across hosts disagree")
    return Finding(check="clock", subject=host, verdict=verdict,
                   summary=f"clock {shown:+.1f} ms from the controller's (± {rtt * 500:.1f} ms)",
                   advice=advice, value=round(offset * 1000, 3), unit="ms", baseline=0.0,
                   details=(("offset_ms", round(offset * 1000, 3)), ("rtt_ms", round(rtt * 1000, 3))))


# -- gpu -------------------------------------------------------------------------------------

# NVML's clocks throttle reasons (nvmlClocksThrottleReason*), the ones that say something.
THROTTLE_BAD = {0x8: "hardware slowdown", 0x40: "hardware thermal slowdown", 0x80: "power brake"}
THROTTLE_WARN = {0x4: "software power cap", 0x20: "software thermal slowdown"}
THROTTLE_IDLE = 0x1


def gpu_findings(host: str, gpus: list[dict[str, Any]]) -> list[Finding]:
    """One finding per GPU from what ``probe`` read through NVML: uncorrected ECC errors,
    current throttle reasons, PCIe link generation and width against their maximum."""
    findings: list[Finding] = []
    for g in gpus:
        bad: list[str] = []
        warn: list[str] = []
        notes: list[str] = []
        vol, agg = g.get("ecc_volatile_uncorrected"), g.get("ecc_aggregate_uncorrected")
        if vol:
            bad.append(f"{vol} uncorrected ECC errors since the last reset")
        elif agg:
            warn.append(f"{agg} uncorrected ECC errors in its lifetime")
        elif vol is None and agg is None:
            notes.append("ECC not reported")
        else:
            notes.append("no uncorrected ECC errors")
        reasons = g.get("throttle_reasons")
        idle = bool(reasons and reasons & THROTTLE_IDLE)
        if reasons:
            bad += [f"throttled: {t}" for bit, t in THROTTLE_BAD.items() if reasons & bit]
            warn += [f"throttled: {t}" for bit, t in THROTTLE_WARN.items() if reasons & bit]
        gen, gen_max = g.get("pcie_gen"), g.get("pcie_gen_max")
        width, width_max = g.get("pcie_width"), g.get("pcie_width_max")
        if width and width_max and width < width_max:
            warn.append(f"PCIe x{width} of x{width_max}")
        if gen and gen_max and gen < gen_max:
            if idle:  # an idle GPU lowers its link's generation to save power
                notes.append(f"PCIe gen {gen} of {gen_max} (idle)")
            else:
                warn.append(f"PCIe gen {gen} of {gen_max} while busy")
        if gen and width and not any("PCIe" in x for x in warn + notes):
            notes.append(f"PCIe gen {gen} x{width}")
        verdict = "bad" if bad else "warn" if warn else "ok"
        advice = ""
        if any("ECC" in b for b in bad):
            advice = f"drain {host} and reset GPU {g.get('index')} (nvidia-smi -r); replace it if errors return"
        elif bad or any("throttled" in w for w in warn):
            advice = f"check cooling and power of {host} (nvidia-smi -q -d PERFORMANCE)"
        elif warn:
            advice = f"reseat GPU {g.get('index')} of {host} or check its slot and BIOS link settings"
        findings.append(Finding(
            check="gpu", subject=f"{host} gpu{g.get('index')}", verdict=verdict,
            summary=f"{g.get('name')}: " + "; ".join(bad + warn + notes),
            advice=advice, value=float(vol) if vol is not None else None, unit="ECC errors",
            details=tuple((k, g.get(k)) for k in (
                "index", "name", "ecc_volatile_uncorrected", "ecc_aggregate_uncorrected", "throttle_reasons",
                "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"))))
    return findings


# -- all of it -------------------------------------------------------------------------------


def _default_dirs(spec: Any) -> tuple[str, str]:
    """(data dir, checkpoint dir) for a host: the agent state dir's parent (the user's home
    with the default ``~/.rigdeck``) and the state dir itself (where jobs' checkpoints go)."""
    state = spec.state_dir.rstrip("/") or "~/.rigdeck"
    parent = state.rsplit("/", 1)[0] if "/" in state else "~"
    return parent or "/", state


def host_findings(ctl: Any, hosts: list[str], *, data_dirs: dict[str, str] | None = None,
                  checkpoint_dirs: dict[str, str] | None = None,
                  disk_mb: int = DISK_MB, disk_parallel: bool = True) -> tuple[list[Finding], list[tuple[str, str]]]:
    """The per-host checks over ``hosts`` (the first is the primary): disk, versions, network,
    clock, gpu. ``ctl`` is a ``tui.control.hostlinks.HostLinks``. ``data_dirs`` and
    ``checkpoint_dirs`` (host -> path) replace the defaults (``_default_dirs``); ``disk_mb`` is
    the size of the file written and read in each; ``disk_parallel=False`` measures the hosts'
    disks one host after another (for storage they share). Returns (findings, skipped checks with why)."""
    findings: list[Finding] = []
    skipped: list[tuple[str, str]] = []
    for name, given in (("data_dirs", data_dirs), ("checkpoint_dirs", checkpoint_dirs)):
        for h, path in (given or {}).items():
            if h not in hosts:
                raise ValueError(f"{name}: {h!r} is not one of the hosts checked ({_hosts_text(hosts)})")
            if not isinstance(path, str) or not path.strip():
                raise ValueError(f"{name}: {h}: expected a directory path, got {path!r}")
    if isinstance(disk_mb, bool) or not isinstance(disk_mb, int) or disk_mb < 1:
        raise ValueError(f"disk_mb: expected a whole number of MB >= 1, got {disk_mb!r}")
    if not hosts:
        return findings, skipped
    specs = {h: ctl.inventory.get(h) for h in hosts}
    primary = hosts[0]

    # clock first: the pings are short and nothing else holds the hosts' links yet
    def clock(h: str) -> Finding:
        try:
            return clock_finding(h, *measure_clock(ctl, h))
        except Exception as e:
            return _unreachable("clock", h, f"{type(e).__name__}: {e}")

    with ThreadPoolExecutor(max_workers=min(32, len(hosts)), thread_name_prefix="doctorclock") as pool:
        clocks = list(pool.map(clock, hosts))

    probes_raw = _run_probe(ctl, hosts, lambda h: ["probe", specs[primary].address], timeout_s=120)
    probes = {h: p for h, p in probes_raw.items() if isinstance(p, dict)}
    failed = {h: p for h, p in probes_raw.items() if not isinstance(p, dict)}

    def disk_args(h: str) -> list[str]:
        data, ckpt = _default_dirs(specs[h])
        data = (data_dirs or {}).get(h, data)
        ckpt = (checkpoint_dirs or {}).get(h, ckpt)
        args = ["disk", str(int(disk_mb)), "data", data]
        if ckpt != data:
            args += ["checkpoint", ckpt]
        return args

    if disk_parallel:
        disks = _run_probe(ctl, hosts, disk_args, timeout_s=600)
    else:  # storage the hosts share (NFS, one disk): one at a time, or they measure each other
        disks = {}
        for h in hosts:
            disks.update(_run_probe(ctl, [h], disk_args, timeout_s=600))

    findings += disk_findings(disks)
    findings += version_findings(probes)
    findings += [_unreachable("versions", h, why) for h, why in failed.items()]
    env = {h: dict(specs[h].env) for h in hosts}
    findings += network_findings(probes, primary, env)
    findings += [_unreachable("network", h, why) for h, why in failed.items()]
    findings += clocks

    no_nvml = [h for h, p in probes.items() if not p.get("nvml")]
    for h, p in probes.items():
        if p.get("nvml"):
            findings += gpu_findings(h, p["nvml"])
    if no_nvml:
        simulated = all(getattr(specs[h], "sim_gpus", 0) > 0 for h in no_nvml)
        skipped.append(("gpu", f"no NVML on {_hosts_text(no_nvml)}" + (" (simulated GPUs)" if simulated else "")))
    if failed:
        skipped.append(("gpu", f"not checked on {_hosts_text(list(failed))} (unreachable)"))
    return findings, skipped
