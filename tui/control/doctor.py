"""``rigdeck doctor``: measurement jobs through the normal launch path, and what they say.

The network checks run ``runtime/netcheck.py`` (stdlib + torch) as ordinary short jobs, one rank
per chosen host, through the queue like any job: ``python -m runtime.netcheck allreduce`` and
``... p2p``. The script needs no shipping of its own: the runtime travels inside the agent's
zipapp, which every host that runs jobs has (``rigdeck deploy``), and ranks import it from there,
so the hosts run the version of the script that matches their agent. The ranks write their
figures as metrics events (``{"event": "doctor", "kind": ...}``), read back here with
``JobManager.metrics``.

Verdicts of the point-to-point matrix compare every link with the *typical* link: the median,
over the hosts, of each host's fastest link. (The plain median of the links fails where it is
needed most: with one slow host among three, two links of three are slow and the median is one
of them; the rule is ``runtime.netcheck.link_figures``.) A link below 50% of the typical one is
bad, below 80% a warning; a host whose every link is that slow is named as the cause. A link is
flagged only if it stays slow: the p2p job measures the links below 80% again (up to 6 more
rounds) and each way keeps its best, so an idle link that lost a round to a busy moment on a
shared machine is not flagged.

Every measurement is sized by time, not bytes (``P2P_BUDGET_S``, ``ALLREDUCE_BUDGET_S``, and a
start-up allowance after which the job is stopped): a link of 40 Mbit/s costs the doctor
seconds, and a pair that did not report before its job was stopped is named too slow to finish.

The per-host checks (disk, versions, MTU, clock, GPU health) live in ``tui.control.doctorhost``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from runtime.netcheck import link_figures
from tui.control.doctorhost import host_findings
from tui.model.doctor import CHECKS, NETWORK_CHECKS, DoctorReport, Finding
from tui.model.jobspec import JobSpec
from tui.model.scheduler import NO_JOBS_ON_SERVER

log = logging.getLogger(__name__)

HOST_CHECKS = tuple(c for c in CHECKS if c not in NETWORK_CHECKS)
BAD_RATIO = 0.5  # a link below half the typical one is bad
WARN_RATIO = 0.8  # below 80% a warning
# All-reduce sizes (MB). On CPU (gloo) the largest is 64 MB: the rest of the doctor's time.
SIZES_MB_GPU = (1, 4, 16, 64, 256)
SIZES_MB_CPU = (1, 4, 16, 64)
ALLREDUCE_ITERS, ALLREDUCE_WARMUP = 10, 2
# Each measurement is sized by time (runtime/netcheck.py): it measures for at most its budget,
# and its job is stopped once the budget and a start-up allowance (launch, torch's import, the
# process group) have passed, so a slow link costs the doctor seconds, not minutes.
P2P_BUDGET_S = 20.0
ALLREDUCE_BUDGET_S = 20.0
JOB_START_S = 45.0
LINKS_KEPT_S = 900.0  # the last links measured judge a later all-reduce of the same hosts


class DoctorError(ValueError):
    """Bad input to the doctor (unknown host or check), said before anything starts."""


def _gbps(v: float) -> str:
    return f"{v:.3f} GB/s" if v >= 1 else f"{v * 1e3:.1f} MB/s"


def _pair(a: str, b: str) -> str:
    return f"{a}<->{b}"


def choose(inventory_names: Sequence[str], hosts: Sequence[str] | None,
           checks: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """The hosts and checks to run, checked: unknown names raise DoctorError."""
    names = list(inventory_names)
    chosen = list(dict.fromkeys(hosts)) if hosts else names
    unknown = [h for h in chosen if h not in names]
    if unknown:
        raise DoctorError(f"doctor: unknown host {', '.join(map(repr, unknown))}; "
                          f"expected hosts from the inventory ({', '.join(names)})")
    wanted = list(dict.fromkeys(checks)) if checks else list(CHECKS)
    bad = [c for c in wanted if c not in CHECKS]
    if bad:
        raise DoctorError(f"doctor: unknown check {', '.join(map(repr, bad))}; "
                          f"expected some of {', '.join(CHECKS)}")
    return chosen, [c for c in CHECKS if c in wanted]


# -- reading the figures ------------------------------------------------------------------------


def allreduce_findings(records: list[dict[str, Any]], hosts: Sequence[str],
                       slowest_link_gbps: float | None = None) -> list[Finding]:
    """One finding for the set of hosts from the allreduce events: busbw at the largest size,
    every size in ``details``. With NCCL, a warning when the bus bandwidth is under half of what
    the slowest link allows (the all-reduce is held back by something else than the links). With
    gloo the reduction itself runs on the hosts' CPUs and bounds it as much as the links do, so
    the figure is reported, not judged against them."""
    rows = sorted((r for r in records if r.get("event") == "doctor" and r.get("kind") == "allreduce"),
                  key=lambda r: r["size_bytes"])
    if not rows:
        return [Finding("allreduce", "all", "bad", "the all-reduce job reported no figures",
                        "look at its log: rigdeck logs JOB")]
    top = rows[-1]
    busbw = float(top["busbw_gbps"])
    details: list[tuple[str, object]] = [("backend", top.get("backend")), ("world", top.get("world"))]
    for r in rows:
        mb = r["size_bytes"] / (1 << 20)
        details.append((f"{mb:g}MB", {"time_ms": round(r["time_s"] * 1e3, 3),
                                      "algbw_gbps": round(r["algbw_gbps"], 4),
                                      "busbw_gbps": round(r["busbw_gbps"], 4)}))
    summary = (f"busbw {_gbps(busbw)} (algbw {_gbps(float(top['algbw_gbps']))}) at "
               f"{top['size_bytes'] / (1 << 20):g} MB over {len(hosts)} hosts ({top.get('backend')})")
    verdict, advice = "ok", ""
    cut = [r for r in records if r.get("event") == "doctor" and r.get("kind") == "allreduce_cut"]
    if cut:  # the sizes that did not fit the time budget: the all-reduce is slow
        sizes = ", ".join(f"{float(s):g}" for s in cut[-1].get("sizes_mb") or ())
        verdict = "warn"
        summary += f"; {sizes} MB not measured: they would not fit the {float(cut[-1].get('budget_s') or 0):g} s budget"
        advice = "the all-reduce is slow: see the p2p links for the slowest host"
        details.append(("not_measured_mb", sizes))
    if top.get("backend") != "nccl":
        summary += "; gloo reduces on the CPUs: not judged against the links"
    elif slowest_link_gbps is not None and busbw < 0.5 * slowest_link_gbps and not cut:
        verdict = "warn"
        summary += f"; under half the slowest link ({_gbps(slowest_link_gbps)})"
        advice = ("the links are not what holds it back: check NCCL_SOCKET_IFNAME / the interface "
                  "used, and CPU or GPU load on the hosts")
    return [Finding("allreduce", "all", verdict, summary, advice, value=busbw, unit="GB/s",
                    baseline=slowest_link_gbps, details=tuple(details))]


def p2p_findings(records: list[dict[str, Any]], hosts: Sequence[str],
                 unfinished: str | None = None) -> list[Finding]:
    """Per pair, per host and one for the set, from the p2p events (rank i = hosts[i]); a way's
    figure is its best event (a round, or a re-measure of a link that looked slow).
    ``unfinished``: why the job ended before every pair reported (it ran out of time): the pairs
    without figures are named too slow to finish, and a host all of whose links are is named."""
    rows = [r for r in records if r.get("event") == "doctor" and r.get("kind") == "p2p"]
    bw: dict[tuple[str, str], float] = {}
    ranks: dict[tuple[int, int], float] = {}
    lat: dict[tuple[str, str], float] = {}
    measured: dict[tuple[str, str], int] = {}
    for r in rows:
        src, dst = int(r["src"]), int(r["dst"])
        if src >= len(hosts) or dst >= len(hosts) or src == dst:
            continue
        way = (hosts[src], hosts[dst])
        bw[way] = max(bw.get(way, 0.0), float(r["gbps"]))
        ranks[(src, dst)] = bw[way]
        measured[way] = measured.get(way, 0) + 1
        pair = (hosts[min(src, dst)], hosts[max(src, dst)])
        lat[pair] = min(lat.get(pair, float("inf")), float(r["latency_ms"]))
    pairs = [(a, b) for i, a in enumerate(hosts) for b in hosts[i + 1:]]
    missing = [p for p in pairs if (p[0], p[1]) not in bw or (p[1], p[0]) not in bw]
    if not rows or (missing and unfinished is None) or len(missing) == len(pairs):
        what = f"for {', '.join(_pair(*p) for p in missing)}" if rows else "at all"
        return [Finding("p2p", "all", "bad", f"the point-to-point job reported no figures {what}"
                        + (f" ({unfinished})" if unfinished else ""), "look at its log: rigdeck logs JOB")]
    by_rank, best_r, typical = link_figures(ranks, len(hosts))
    link = {(hosts[i], hosts[j]): v for (i, j), v in by_rank.items()}
    best = {hosts[i]: v for i, v in best_r.items()}
    findings: list[Finding] = []

    def verdict(v: float) -> str:
        return "bad" if v < BAD_RATIO * typical else "warn" if v < WARN_RATIO * typical else "ok"

    host_verdict = {h: verdict(best[h]) if h in best else "bad" for h in hosts}
    for a, b in pairs:
        if (a, b) not in link:
            findings.append(Finding("p2p", _pair(a, b), "bad", f"too slow to finish: {unfinished}",
                                    _slow_advice([h for h in (a, b) if host_verdict[h] != "ok"], a, b)))
            continue
        v = link[(a, b)]
        ver = verdict(v)
        pct = 100.0 * v / typical if typical > 0 else 0.0
        times = min(measured[(a, b)], measured[(b, a)])
        summary = (f"{a}->{b} {_gbps(bw[(a, b)])}, {b}->{a} {_gbps(bw[(b, a)])}, "
                   f"latency {lat[(a, b)]:.3f} ms; {pct:.0f}% of typical {_gbps(typical)}"
                   + (f", best of {times} measures" if ver != "ok" else ""))
        advice = ""
        if ver != "ok":
            advice = _slow_advice([h for h in (a, b) if host_verdict[h] != "ok"], a, b)
        findings.append(Finding("p2p", _pair(a, b), ver, summary, advice, value=v, unit="GB/s",
                                baseline=typical,
                                details=((f"{a}->{b}_gbps", round(bw[(a, b)], 4)),
                                         (f"{b}->{a}_gbps", round(bw[(b, a)], 4)),
                                         ("latency_ms", round(lat[(a, b)], 4)), ("measures", times))))
    for h in hosts:
        mine = sorted((v, p) for p, v in link.items() if h in p)
        ver = host_verdict[h]
        if not mine:
            findings.append(Finding("p2p", h, "bad", f"none of its links finished: {unfinished}",
                                    "all its links are slow: check its NIC, cable, switch port, MTU and "
                                    "any rate limit (tc)"))
            continue
        slow_v, slow_p = mine[0]
        summary = (f"links {_gbps(mine[0][0])}..{_gbps(mine[-1][0])}, slowest {_pair(*slow_p)}; "
                   f"best {100.0 * best[h] / typical:.0f}% of typical {_gbps(typical)}")
        advice = ("all its links are slow: check its NIC, cable, switch port, MTU and any rate limit (tc)"
                  if ver != "ok" else "")
        findings.append(Finding("p2p", h, ver, summary, advice, value=best[h], unit="GB/s", baseline=typical,
                                details=tuple((_pair(*p), round(v, 4)) for v, p in mine)))
    slow_v, slow_p = min((v, p) for p, v in link.items())
    below = 100.0 * (1 - slow_v / typical) if typical > 0 else 0.0
    ver = "bad" if missing else verdict(slow_v)
    summary = (f"slowest link {_pair(*slow_p)} {_gbps(slow_v)}, {below:.0f}% below typical {_gbps(typical)} "
               f"(median of each host's fastest link; {len(pairs)} links)")
    if missing:
        summary = f"{len(missing)} of {len(pairs)} links did not finish ({unfinished}); " + summary
    advice = f"see {_pair(*missing[0])}" if missing else f"see {_pair(*slow_p)}" if ver != "ok" else ""
    findings.insert(0, Finding("p2p", "all", ver, summary, advice, value=slow_v, unit="GB/s", baseline=typical,
                               details=tuple((_pair(*p), round(v, 4)) for p, v in link.items())))
    return findings


def _slow_advice(culprits: list[str], a: str, b: str) -> str:
    return (f"every link of {' and '.join(culprits)} is slow: check its NIC, cable, switch port, "
            "MTU and any rate limit (tc)" if culprits else
            f"{a} and {b} are fast to others: check the path between them (switch, routing)")


# -- running the jobs ---------------------------------------------------------------------------


def _uses_gpus(service: Any, hosts: list[str]) -> bool:
    """Every chosen host has real GPUs: ranks take one each (NCCL). Simulated GPUs, or none:
    one process per host (gloo on CPU)."""
    try:
        caps = service.manager.capacity(hosts)
    except Exception as e:  # a host that cannot say: the job's own launch will tell
        log.info("doctor: capacity: %s", e)
        return False
    return bool(caps) and all(c.gpus and not c.simulated for c in caps)


def measurement_spec(kind: str, hosts: list[str], args: Sequence[str], gpus: bool, timeout_s: float) -> JobSpec:
    return JobSpec(
        name=f"doctor-{kind}", command=("{python}", "-m", "runtime.netcheck", kind, *args), workdir="",
        hosts=tuple(hosts), nodes=len(hosts),
        gpus_per_node=1 if gpus else None, processes_per_node=None if gpus else 1,
        max_runtime_s=max(1, math.ceil(timeout_s)), grace_s=5.0, priority=100,
    )


def _run_job(service: Any, spec: JobSpec, timeout_s: float) -> tuple[str, str, str | None, list[dict[str, Any]]]:
    """Launch through the queue, wait for the end; (job_id, state, why, metrics records)."""
    view = service.launch(spec, queue=True)
    job_id = view.job_id
    state = view.state
    for v in service.wait(job_id, timeout=timeout_s):
        state = v.state
    why = None
    if state != "succeeded":
        rec = service.manager.record(job_id)
        why = (rec.get("cause") or {}).get("message") or state
        if state not in ("succeeded", "failed", "stopped"):
            service.stop(job_id, grace_s=2.0, yes=True)
            why = f"did not end within {timeout_s:.0f} s"
    try:
        records = service.metrics(job_id)
    except Exception as e:
        log.info("doctor: metrics of %s: %s", job_id, e)
        records = []
    return job_id, state, why, records


def _links_memory(service: Any) -> dict[tuple[str, ...], tuple[float, float]]:
    """The slowest link each set of hosts had when last measured: (monotonic time, GB/s)."""
    memory = getattr(service, "doctor_links", None)
    if memory is None:
        memory = {}
        service.doctor_links = memory
    return memory  # type: ignore[no-any-return]


def _p2p(service: Any, chosen: list[str], gpus: bool, size_mb: float, min_s: float,
         budget_s: float) -> tuple[str, list[Finding]]:
    timeout = budget_s + JOB_START_S
    spec = measurement_spec("p2p", chosen, ["--size-mb", f"{size_mb:g}", "--min-s", f"{min_s:g}",
                                            "--recheck-below", f"{WARN_RATIO:g}", "--budget-s", f"{budget_s:g}"],
                            gpus, timeout)
    job_id, state, why, records = _run_job(service, spec, timeout)
    if state == "succeeded":
        found = p2p_findings(records, chosen)
    elif any(r.get("kind") == "p2p" for r in records):  # cut short: what it measured, and what not
        found = p2p_findings(records, chosen, unfinished=f"the job {job_id} {state}: {why}")
    else:
        found = [Finding("p2p", "all", "bad", f"the point-to-point job {job_id} {state}: {why}",
                         f"rigdeck logs {job_id}")]
    links = [f.value for f in found if f.subject not in chosen and f.subject != "all" and f.value is not None]
    if links:
        _links_memory(service)[tuple(sorted(chosen))] = (time.monotonic(), min(links))
    return job_id, found


def _allreduce(service: Any, chosen: list[str], gpus: bool, sizes_mb: Sequence[float] | None,
               budget_s: float) -> tuple[str, list[Finding]]:
    sizes = list(sizes_mb) if sizes_mb else list(SIZES_MB_GPU if gpus else SIZES_MB_CPU)
    timeout = budget_s + JOB_START_S
    spec = measurement_spec("allreduce", chosen, ["--sizes-mb", ",".join(f"{s:g}" for s in sizes),
                                                  "--iters", str(ALLREDUCE_ITERS),
                                                  "--warmup", str(ALLREDUCE_WARMUP),
                                                  "--budget-s", f"{budget_s:g}"], gpus, timeout)
    job_id, state, why, records = _run_job(service, spec, timeout)
    if state != "succeeded":
        return job_id, [Finding("allreduce", "all", "bad", f"the all-reduce job {job_id} {state}: {why}",
                                f"rigdeck logs {job_id}")]
    at, slowest = _links_memory(service).get(tuple(sorted(chosen)), (0.0, None))
    if slowest is not None and time.monotonic() - at > LINKS_KEPT_S:
        slowest = None
    return job_id, allreduce_findings(records, chosen, slowest)


def run_doctor(service: Any, hosts: Sequence[str] | None = None, checks: Sequence[str] | None = None,
               *, sizes_mb: Sequence[float] | None = None, p2p_size_mb: float = 8.0,
               p2p_min_s: float = 0.3, p2p_budget_s: float = P2P_BUDGET_S,
               allreduce_budget_s: float = ALLREDUCE_BUDGET_S) -> DoctorReport:
    """Run the chosen checks over ``hosts`` (default: the inventory) with ``service`` (a
    ControllerService) and return the report. The links are measured before the all-reduce,
    which is judged against the slowest of them (this run's, or the same hosts' last within
    ``LINKS_KEPT_S``: a face that runs the checks one at a time gets the same judgement)."""
    chosen, wanted = choose(service.inventory.names, hosts, checks)
    started = time.time()
    findings: list[Finding] = []
    skipped: list[tuple[str, str]] = []
    job_ids: list[str] = []
    net = [c for c in wanted if c in NETWORK_CHECKS]
    server = getattr(service.inventory, "server", None)
    measured = [h for h in chosen if server is None or server.allow_jobs or h != server.host]
    if net and len(measured) < len(chosen):
        skipped += [(c, f"{server.host}: {NO_JOBS_ON_SERVER}") for c in net]  # type: ignore[union-attr]
    if net and len(measured) < 2:
        skipped += [(c, "needs at least 2 hosts that take jobs") for c in net]
        net = []
    if net:
        gpus = _uses_gpus(service, measured)
        if "p2p" in net:
            job_id, found = _p2p(service, measured, gpus, p2p_size_mb, p2p_min_s, p2p_budget_s)
            job_ids.append(job_id)
            findings += found
        if "allreduce" in net:
            job_id, found = _allreduce(service, measured, gpus, sizes_mb, allreduce_budget_s)
            job_ids.append(job_id)
            findings += found
    host_checks = [c for c in wanted if c in HOST_CHECKS]
    if host_checks:
        got, skip = host_findings(service.ctl, chosen)
        findings += [f for f in got if f.check in host_checks]
        skipped += [s for s in skip if s[0] in host_checks]
    order = {c: i for i, c in enumerate(CHECKS)}
    findings.sort(key=lambda f: order.get(f.check, len(order)))  # stable: each check's own order kept
    return DoctorReport(hosts=tuple(chosen), started=started, ended=time.time(), findings=tuple(findings),
                        skipped=tuple(skipped), job_ids=tuple(job_ids))
