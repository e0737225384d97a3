"""The controller over SSH at 32, 64 and 128 real hosts: threads, CPU, memory, sample latency.

One test bed of max(N) hosts is brought up once (each host a real OpenSSH sshd in its own
network namespace; 8 *simulated* GPUs each, since this machine has no NVML), and the current
agent is deployed to every host with ``HostLinks.deploy()``. Then, for each N (ascending), a
fresh process runs the real controller side against hosts h1..hN: ``tui.control.hostlinks.HostLinks``
and ``tui.control.monitor.Monitor`` unchanged (one reader thread for every host, paramiko SSH served
by the fixed hub threads of ``tui/remote/hub.py``, the deploy
check, ``agent.pyz attach`` and a 1 Hz subscription), with a ``ClusterState`` that records when
each sample is applied (bench/telemetry.py's ``RecordingState``). Once every host has sent
telemetry, and 2 s more, it measures over D seconds:

- controller CPU: that process, all its threads (SSH included: paramiko runs in it), in % of
  one core, total and per host;
- controller memory: its RSS (and PSS) at the end, and per host its growth since just before the
  Monitor started (imports, the inventory and the agent bundle already there), divided by N;
- sample-to-state latency p50/p95: from the agent's sample time (``data["time"]``, taken at
  the start of collection, so it includes the collection's cost) to ``apply_sample`` in the
  controller's ClusterState. Hosts share this machine's clock (namespaces, one kernel);
- samples/s (N expected).

The hosts run on this machine too: their daemons, sshd and attach bridges compete with the
controller for the same cores. Their CPU (every process in the hosts' network namespaces) and
the machine's total use during the window are reported next to the controller's, and what is
left is other processes' (interference). Hosts beyond N idle between runs (their daemons keep
running, unsubscribed).

The same hosts are then held by ``rigdeck serve`` (a real server process: its controller
service with telemetry, job poller and queue, its unix socket, ``/metrics`` on loopback, which
the bench reads to see every host up): its threads, CPU and RSS from ``/proc``, its samples
taken as N per second while ``/metrics`` says every host is up at the start and the end of the
window.

``--against TREE``: a checkout of an earlier rigdeck (e.g. a worktree of main) whose controller
is measured the same way, on the same bed, right after this one: the baseline. The result ends
with a least-squares line through the sizes of each figure (threads, CPU % of a core, RSS) and
what it gives at 512 hosts.

Needs root (the network-namespace test bed).
Usage: .venv/bin/python bench/scale.py [--n 32,64,128] [--seconds 20] [--against /path/to/main]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from bench.telemetry import (  # noqa: E402
    RecordingState,
    busy_pct,
    cpu_delta,
    latency_fields,
    machine_cpu,
    proc_cpu_s,
    proc_mem_mb,
)
from tests.testbed import TestBed, available  # noqa: E402
from tui.control.hostlinks import HostLinks  # noqa: E402
from tui.control.monitor import Monitor  # noqa: E402
from tui.remote.inventoryfile import load_inventory  # noqa: E402

SIM_GPUS = 8
SETTLE_S = 2.0  # after every host's first sample: every collector past its first, costly one


def netns_pids(names: list[str]) -> list[int]:
    """Every process in these network namespaces (the test bed hosts): daemons, sshd, attach."""
    pids: list[int] = []
    for ns in names:
        res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        pids += [int(x) for x in res.stdout.split() if x.isdigit()]
    return pids


def cpu_of(pids: list[int]) -> dict[int, float | None]:
    return {pid: proc_cpu_s(pid) for pid in pids}


# -------------------------------------------------------------------------------------------
# one N, in its own process


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, summed by kind: the monitor's reader, its setup
    threads, the SSH hub's threads (a fixed pool serving every connection), paramiko's own
    transport threads (one per connection where the hub does not serve it, or in a baseline
    without the hub), the rest."""
    import threading

    import paramiko

    kinds = {}
    for t in threading.enumerate():
        name = t.name
        kind = ("paramiko" if isinstance(t, paramiko.Transport) else
                "ssh-hub" if name.startswith("ssh-hub-") else
                "monitor-setup" if name.startswith("monitor-setup") else
                "reader" if name == "monitor" or name.startswith("reader-") else "other")
        if t.native_id is not None:
            kinds[t.native_id] = kind
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        kind = kinds.get(int(tid), "other")
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def measure(inventory: Path, seconds: float, netns: list[str]) -> dict[str, Any]:
    """The controller side against every host of ``inventory``, measured over ``seconds``."""
    inv = load_inventory(inventory)
    n = len(inv.hosts)
    ctl = HostLinks(inv)
    ctl.bundle  # noqa: B018  (built before the baseline memory reading, as the app has it)
    me = os.getpid()
    rss0 = proc_mem_mb(me)
    mon = Monitor(ctl, rate_hz=1.0)
    state = RecordingState([(s.name, s.address) for s in inv.hosts])
    mon.state = state
    t_setup = time.monotonic()
    mon.start()
    try:
        state.wait_all_up(max(60.0, 2.0 * n))
        setup_s = time.monotonic() - t_setup
        time.sleep(SETTLE_S)

        hpids = netns_pids(netns)  # spawns `ip`: before the window
        h0 = cpu_of(hpids)
        m0 = machine_cpu()
        t0s = thread_cpu()
        c0 = time.process_time()
        w0 = time.time()
        time.sleep(seconds)
        w1 = time.time()
        c1 = time.process_time()
        t1s = thread_cpu()
        m1 = machine_cpu()
        h1 = cpu_of(hpids)
        rss1 = proc_mem_mb(me)
        statuses = state.status_counts()
        threads = len(os.listdir(f"/proc/{me}/task"))
    finally:
        mon.stop(timeout=15)
        ctl.close()

    window, lat, costs, missed = state.window(w0, w1)
    elapsed = w1 - w0
    ctl_pct = 100.0 * (c1 - c0) / elapsed
    hosts_pct = 100.0 * cpu_delta(h0, h1) / elapsed
    machine_pct = busy_pct(m0, m1) * (os.cpu_count() or 1)
    rss_growth = rss1.get("rss", 0.0) - rss0.get("rss", 0.0)
    return {
        "n": n,
        "seconds": elapsed,
        "setup_s": setup_s,
        "samples": len(window),
        "expected_samples": n * elapsed,
        "samples_per_s": len(window) / elapsed,
        "missed_samples": missed,
        "hosts_reporting": len({r[3] for r in window}),
        "status_at_end": statuses,
        "controller_threads": threads,
        "controller_cpu_pct_by_thread_kind": {k: 100.0 * (t1s.get(k, 0.0) - t0s.get(k, 0.0)) / (w1 - w0)
                                              for k in t1s},
        "controller_cpu_s": c1 - c0,
        "controller_cpu_pct_of_core": ctl_pct,
        "controller_cpu_pct_of_core_per_host": ctl_pct / n,
        "controller_cpu_ms_per_sample": 1000 * (c1 - c0) / max(1, len(window)),
        "controller_rss_mb": rss1.get("rss"),
        "controller_pss_mb": rss1.get("pss"),
        "controller_rss_mb_before_monitor": rss0.get("rss"),
        "controller_rss_mb_per_host": rss_growth / n,
        **latency_fields(lat, costs),
        "hosts_cpu_pct_of_core": hosts_pct,
        "hosts_processes": len(hpids),
        "machine_cpu_pct_of_core": machine_pct,
        "others_cpu_pct_of_core": max(0.0, machine_pct - ctl_pct - hosts_pct),
    }


# -------------------------------------------------------------------------------------------


def print_table(rows: list[dict[str, Any]], seconds: float) -> None:
    print(f"\ncontroller over SSH, 1 Hz per host, {SIM_GPUS} simulated GPUs per host, "
          f"{seconds:g} s per N, hosts and controller on this {os.cpu_count()}-core machine")
    print("     N  samples/s   controller CPU        controller RSS       "
          "sample-to-state latency   hosts CPU  others")
    print("                    % core  per host      MB   per host MB     "
          "p50 ms   p95 ms   max ms   % core     % core")
    for r in rows:
        print(f"  {r['n']:4d}  {r['samples_per_s']:9.1f}  {r['controller_cpu_pct_of_core']:7.1f}  "
              f"{r['controller_cpu_pct_of_core_per_host']:8.2f}  "
              f"{r['controller_rss_mb'] or 0:6.0f}  {r['controller_rss_mb_per_host']:11.2f}     "
              f"{r['latency_ms_p50']:6.1f}  {r['latency_ms_p95']:7.1f}  {r['latency_ms_max']:7.0f}"
              f"   {r['hosts_cpu_pct_of_core']:7.1f}  {r['others_cpu_pct_of_core']:7.0f}")
    for r in rows:
        print(f"  N={r['n']}: {r['samples']} samples of {r['expected_samples']:.0f} expected, "
              f"{r['missed_samples']} skipped, status {r['status_at_end']}, "
              f"{r['controller_threads']} threads, setup {r['setup_s']:.1f} s, "
              f"{r['controller_cpu_ms_per_sample']:.2f} ms controller CPU per sample")


def run_one(n: int, inventory: Path, seconds: float, netns: list[str], tree: Path = ROOT) -> dict[str, Any]:
    """The controller of the checkout ``tree`` (this one by default), in a process of its own."""
    child = subprocess.run(
        [sys.executable, str(tree / "bench" / "scale.py"), "--one", str(inventory), "--seconds", str(seconds),
         "--netns", ",".join(netns)],
        capture_output=True, text=True, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
    )
    if child.returncode != 0:
        raise RuntimeError(f"N={n} failed (exit {child.returncode}): {child.stderr[-2000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hosts_up(url: str) -> int:
    """How many hosts the server's /metrics says are up (0 when it does not answer)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return 0
    m = re.search(r'^rigdeck_hosts\{status="up"\} (\S+)$', text, re.M)
    return int(float(m.group(1))) if m else 0


def run_serve(n: int, inventory: Path, seconds: float, state_dir: Path) -> dict[str, Any]:
    """``rigdeck serve`` holding the hosts of ``inventory``: measured from /proc over ``seconds``."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "serve", "--state-dir", str(state_dir), "--inventory", str(inventory),
         "--metrics-listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        t0 = time.monotonic()
        while _hosts_up(url) < n:
            if proc.poll() is not None or time.monotonic() - t0 > max(90.0, 3.0 * n):
                raise RuntimeError(f"serve N={n}: only {_hosts_up(url)} hosts up (exit {proc.poll()})")
            time.sleep(1.0)
        setup_s = time.monotonic() - t0
        time.sleep(SETTLE_S)
        c0, w0 = proc_cpu_s(proc.pid), time.monotonic()
        time.sleep(seconds)
        c1, w1 = proc_cpu_s(proc.pid), time.monotonic()
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
        mem = proc_mem_mb(proc.pid)
        up_at_end = _hosts_up(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert c0 is not None and c1 is not None
    elapsed = w1 - w0
    return {
        "n": n, "seconds": elapsed, "setup_s": setup_s, "hosts_up_at_end": up_at_end,
        "threads": threads, "cpu_s": c1 - c0, "cpu_pct_of_core": 100.0 * (c1 - c0) / elapsed,
        "cpu_ms_per_sample": 1000 * (c1 - c0) / (n * elapsed), "rss_mb": mem.get("rss"), "pss_mb": mem.get("pss"),
    }


def fit(rows: list[dict[str, Any]], key: str, at: int = 512) -> dict[str, float]:
    """A least-squares line through (n, rows[key]): its intercept, slope per host, and its value
    at ``at`` hosts."""
    xs = [float(r["n"]) for r in rows]
    ys = [float(r[key] or 0.0) for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    base = my - slope * mx
    return {"intercept": base, "per_host": slope, f"at_{at}": base + slope * at}


def models(rows: list[dict[str, Any]], serve: list[dict[str, Any]],
           against: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, rs, keys in (("controller", rows, ("controller_threads", "controller_cpu_pct_of_core",
                                                 "controller_rss_mb")),
                           ("serve", serve, ("threads", "cpu_pct_of_core", "rss_mb")),
                           ("baseline_controller", against, ("controller_threads", "controller_cpu_pct_of_core",
                                                             "controller_rss_mb"))):
        rs = [r for r in rs if "error" not in r]
        if len(rs) >= 2:
            out[name] = {k: fit(rs, k) for k in keys}
    return out


def print_models(m: dict[str, Any]) -> None:
    print("\nlinear fit through the sizes, and at 512 hosts:")
    for name, figs in m.items():
        for k, f in figs.items():
            print(f"  {name:<20} {k:<30} {f['intercept']:9.2f} + {f['per_host']:8.4f}/host  "
                  f"-> {f['at_512']:9.1f} at 512")


def print_comparison(rows: list[dict[str, Any]], against: list[dict[str, Any]], serve: list[dict[str, Any]],
                     tree: str | None) -> None:
    by_n = {b["n"]: b for b in against}
    for r in rows:
        b = by_n.get(r["n"])
        if b is None:
            continue
        if "error" in b:
            print(f"  N={r['n']}: threads {r['controller_threads']}, CPU per host-sample "
                  f"{r['controller_cpu_ms_per_sample']:.2f} ms; baseline ({tree}) failed: {b['error'][-300:]}")
            continue
        mine, theirs = r["controller_cpu_ms_per_sample"], b["controller_cpu_ms_per_sample"]
        print(f"  N={r['n']}: threads {r['controller_threads']} vs {b['controller_threads']} ({tree}); "
              f"CPU per host-sample {mine:.2f} ms vs {theirs:.2f} ms ({theirs / mine:.2f}x less); "
              f"RSS {r['controller_rss_mb']:.0f} vs {b['controller_rss_mb']:.0f} MB")
    for sv in serve:
        print(f"  rigdeck serve N={sv['n']}: {sv['threads']} threads, {sv['cpu_ms_per_sample']:.2f} ms CPU per "
              f"host-sample, RSS {sv['rss_mb']:.0f} MB, hosts up at the end {sv['hosts_up_at_end']}")


def combine(parts: list[Path], out: str) -> int:
    """One result from several runs (one size each): their rows, serve and baseline rows, each
    run's own meta kept, and the fit through every size."""
    runs = [json.loads(p.read_text()) for p in parts]
    rows = sorted((r for d in runs for r in d["rows"]), key=lambda r: r["n"])
    serve = sorted((r for d in runs for r in d.get("serve") or []), key=lambda r: r["n"])
    against = sorted((r for d in runs for r in (d.get("baseline") or {}).get("rows") or []), key=lambda r: r["n"])
    tree = next((d["baseline"]["tree"] for d in runs if d.get("baseline")), None)
    print_table(rows, rows[0]["seconds"] if rows else 0.0)
    print_comparison(rows, against, serve, tree)
    fits = models(rows, serve, against)
    print_models(fits)
    first = runs[0]
    write_result(out, {
        "what": first["what"], "sim_gpus": first["sim_gpus"], "gpu_source": first["gpu_source"],
        "runs": [{"meta": d["meta"], "n": [r["n"] for r in d["rows"]], "testbed_up_s": d["testbed_up_s"],
                  "deploy_s": d["deploy_s"]} for d in runs],
        "rows": rows, "serve": serve, "baseline": {"tree": tree, "rows": against} if tree else None, "fit": fits,
    }, run_meta())
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="32,64,128", help="comma-separated host counts")
    ap.add_argument("--against", default=None, metavar="TREE",
                    help="a checkout of an earlier rigdeck whose controller is measured too (the baseline)")
    ap.add_argument("--no-serve", action="store_true", help="measure no `rigdeck serve`")
    ap.add_argument("--combine", metavar="A.json,B.json", default=None,
                    help="join results of runs at one size each (each its own bed and locked run) into --out, "
                    "with the fit through all their sizes")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per N")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale.json"))
    ap.add_argument("--one", metavar="INVENTORY", help=argparse.SUPPRESS)  # a child's run
    ap.add_argument("--netns", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        netns = [x for x in args.netns.split(",") if x]
        print(json.dumps(measure(Path(args.one), args.seconds, netns)))
        return 0
    if args.combine:
        return combine([Path(x) for x in args.combine.split(",")], args.out)
    ns = sorted({int(x) for x in args.n.split(",") if x.strip()})
    meta = run_meta()
    ok, why = available()
    if not ok:
        print(f"bench/scale.py needs the test bed: {why}", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    against: list[dict[str, Any]] = []
    serve: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with TestBed(max(ns), sim_gpus=SIM_GPUS) as bed, tempfile.TemporaryDirectory() as tmp:
        up_s = time.monotonic() - t0
        print(f"test bed of {max(ns)} hosts up in {up_s:.1f} s", flush=True)
        t1 = time.monotonic()
        with HostLinks(load_inventory(bed.inventory_path)) as ctl:
            reports = ctl.deploy()
        bad = {r.name: r.error for r in reports if r.error}
        if bad:
            raise RuntimeError(f"deploy failed: {bad}")
        deploy_s = time.monotonic() - t1
        print(f"agent deployed to {len(reports)} hosts in {deploy_s:.1f} s", flush=True)
        for n in ns:
            inv = bed.write_inventory(Path(tmp) / f"hosts-{n}.toml", hosts=list(range(1, n + 1)))
            netns = [h.netns for h in bed.hosts[:n]]
            row = run_one(n, inv, args.seconds, netns)
            rows.append(row)
            print(f"  ... N={n}: {row['samples_per_s']:.1f} samples/s, controller "
                  f"{row['controller_cpu_pct_of_core']:.1f} % of a core, {row['controller_threads']} threads, "
                  f"{row['controller_cpu_ms_per_sample']:.2f} ms CPU per sample", flush=True)
            if args.against:
                try:
                    base = run_one(n, inv, args.seconds, netns, tree=Path(args.against))
                except RuntimeError as e:  # the baseline may not reach every host: said, not fatal
                    print(f"  ... N={n} baseline {args.against} failed: {str(e)[-600:]}", flush=True)
                    base = {"n": n, "error": str(e)[-2000:]}
                against.append(base)
                print(f"  ... N={n} baseline {args.against}: {base['controller_threads']} threads, "
                      f"{base['controller_cpu_ms_per_sample']:.2f} ms CPU per sample", flush=True)
            if not args.no_serve:
                sv = run_serve(n, inv, args.seconds, Path(tmp) / f"serve-{n}")
                serve.append(sv)
                print(f"  ... N={n} rigdeck serve: {sv['threads']} threads, {sv['cpu_pct_of_core']:.1f} % of a "
                      f"core, {sv['cpu_ms_per_sample']:.2f} ms CPU per sample, RSS {sv['rss_mb']:.0f} MB", flush=True)
    print_table(rows, args.seconds)
    print_comparison(rows, against, serve, args.against)
    fits = models(rows, serve, against)
    if fits:
        print_models(fits)
    result = {
        "what": "the real controller (HostLinks + Monitor, paramiko SSH) against N test bed "
        "hosts (real sshd, real agent, simulated GPUs), telemetry at 1 Hz",
        "sim_gpus": SIM_GPUS,
        "gpu_source": "simulated (no NVML on the measuring machine)",
        "testbed_up_s": up_s,
        "deploy_s": deploy_s,
        "rows": rows,
        "serve": serve,
        "baseline": {"tree": args.against, "rows": against} if args.against else None,
        "fit": fits,
    }
    write_result(args.out, result, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
