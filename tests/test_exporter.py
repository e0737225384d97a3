"""``/metrics`` and ``rigdeck exporter``: the controller's exposition over real HTTP, read by real
clients: urllib, ``promtool check metrics`` and a Prometheus server (Debian's ``prometheus``)
that scrapes it; and the command, with a local agent's simulated GPUs."""

from __future__ import annotations

import gzip
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._require import PROMETHEUS_MISSING, PROMTOOL_MISSING, require
from tests.kit import ROOT
from tests.kit.prom import Exporter, Serving, get, prometheus, promtool_check, query, read
from tests.ui_fixtures import (
    FAILED_JOB,
    JOB,
    FakeController,
    FakeMonitor,
    RecordedJobs,
    RecordedSweeps,
    cluster_state,
    healing_jobs,
    healing_state,
    recorded_service,
    served_client,
    stop_servers,
)
from tests.webpage import write_local_inventory
from tui.cli.main import build_parser, main
from tui.client import InProcessClient, MetricsServer, http_listener
from tui.model.promexport import CONTENT_TYPE

WEIRD = 'we"ird\\name\nline two'  # a job name with every character the format escapes


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The recorded cluster's controller (tests/ui_fixtures.py): after a GPU fault healed, one job
    running, its history in a fresh RIGDECK_HOME with one job waiting in the queue."""
    monkeypatch.setenv("RIGDECK_HOME", str(tmp_path / "home"))
    jobs = healing_jobs()
    track = jobs._tracks[FAILED_JOB]
    track.rec = {**track.rec, "name": WEIRD}
    svc = recorded_service(FakeController(), FakeMonitor(healing_state()), jobs, RecordedSweeps())
    svc.manager.history.create("wait-1", "wait", {"nodes": 2, "gpus_per_node": 8}, state="queued")
    svc.manager.history.update("wait-1", priority=3)
    yield svc
    svc.manager.history.close()


@pytest.fixture
def metrics(service: Any) -> Iterator[MetricsServer]:
    with MetricsServer(InProcessClient(service=service).exposition, "127.0.0.1", 0).start() as server:
        yield server


# -- the endpoint ------------------------------------------------------------------------------


def test_metrics_answers_a_real_http_get_with_the_controllers_exposition(metrics: MetricsServer) -> None:
    host, port = metrics.address
    assert host == "127.0.0.1" and port > 0 and metrics.url == f"http://127.0.0.1:{port}/metrics"
    status, headers, body = get(metrics.url)
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8" == CONTENT_TYPE
    r = read(body.decode())
    assert r.value("rigdeck_gpu_utilization_ratio", host="h1", gpu="0", job_id=JOB, rank="0", user="root",
                   simulated="true") >= 0
    assert r.value("rigdeck_gpu_health", host="h1", gpu="1", health="unhealthy") == 1
    assert r.value("rigdeck_job_restarts_total", job_id=JOB, name="ddp") == 1
    assert r.value("rigdeck_job_state", name=WEIRD, state="failed") == 1
    assert r.value("rigdeck_queue_jobs", priority="3") == 1  # from the history's queue
    assert r.value("rigdeck_hosts", status="up") == 3


def test_metrics_is_gzipped_for_a_scraper_that_accepts_it(metrics: MetricsServer) -> None:
    status, headers, body = get(metrics.url, {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    plain = read(gzip.decompress(body).decode())
    assert set(plain.types) == set(read(get(metrics.url)[2].decode()).types)


def test_anything_but_metrics_is_a_404_and_head_has_no_body(metrics: MetricsServer) -> None:
    base = metrics.url.removesuffix("/metrics")
    for path in ("/", "/metric", "/metrics/x", "/api/v1/query"):
        status, _, body = get(base + path)
        assert status == 404 and b"/metrics" in body, path
    assert get(metrics.url + "?name[]=rigdeck_host_up")[0] == 200  # a query string is no other path
    host, port = metrics.address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("HEAD", "/metrics")
    resp = conn.getresponse()
    assert resp.status == 200 and int(resp.headers["Content-Length"]) > 1000 and resp.read() == b""
    conn.close()


def test_metrics_refuses_a_host_header_that_does_not_name_it(metrics: MetricsServer) -> None:
    """DNS rebinding: a page whose own name now resolves to 127.0.0.1 sends that name as Host."""
    host, port = metrics.address

    def ask(method: str, host_header: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        try:
            conn.request(method, "/metrics", headers={"Host": host_header})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    for bad in (f"evil.example:{port}", f"127.0.0.1:{port + 1}", "127.0.0.1", f"127.0.0.1.evil.example:{port}"):
        status, body = ask("GET", bad)
        assert status == 403 and b"Host header does not name this server" in body, bad
        assert b"rigdeck_" not in body, bad  # not a line of the metrics
    assert ask("HEAD", f"evil.example:{port}") == (403, b"")
    for good in (f"127.0.0.1:{port}", f"localhost:{port}"):
        status, body = ask("GET", good)
        assert status == 200 and b"rigdeck_host_up" in body, good
    # Bound beyond loopback, the machine's own name is one a Prometheus target may use.
    assert http_listener("0.0.0.0", port).allows_host(f"{socket.gethostname()}:{port}")
    assert not http_listener("0.0.0.0", port).allows_host(f"evil.example:{port}")


def test_a_failing_exposition_fails_that_scrape_only() -> None:
    calls = []

    def exposition() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the history is locked")
        return "# HELP rigdeck_host_up x\n# TYPE rigdeck_host_up gauge\nrigdeck_host_up{host=\"h1\"} 1\n"

    with MetricsServer(exposition, "127.0.0.1", 0).start() as server:
        status, _, body = get(server.url)
        assert status == 500 and b"RuntimeError: the history is locked" in body
        status, _, body = get(server.url)
        assert status == 200 and read(body.decode()).value("rigdeck_host_up", host="h1") == 1


def test_through_a_server_each_scrape_is_the_servers_controllers(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With a [server], a face's client asks the server's controller (the API's ``exposition``)."""
    monkeypatch.setenv("RIGDECK_HOME", str(tmp_path / "home"))
    client = served_client(FakeController(), FakeMonitor(cluster_state()), RecordedJobs())
    try:
        r = read(client.exposition())
    finally:
        client.close()
        stop_servers()
    assert r.value("rigdeck_gpu_info", host="h2", gpu="3", user="bob", job_id="", model="Simulated GPU") == 1
    assert r.value("rigdeck_job_state", job_id=JOB, state="running") == 1
    assert r.value("rigdeck_host_up", host="h3") == 0


# -- the command -------------------------------------------------------------------------------


@pytest.mark.parametrize("listen,why", [
    ("9464", "ADDR:PORT"),
    (":9464", "no address: write it out, 0.0.0.0 for every interface"),
    ("::1:9464", "an IPv6 address goes in brackets"),
    ("[::zz]:9464", "'::zz' is no IPv6 address"),
    ("127.0.0.1:70000", "the port is '70000', not a number from 0 to 65535"),
    ("127.0.0.1:http", "the port is 'http'"),
    ("my host:9464", "'my host' is no address or host name"),
])
def test_a_bad_listen_is_refused_naming_what_was_expected(listen: str, why: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exporter", "--listen", listen]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rigdeck exporter: --listen {json.dumps(listen)}: expected ADDR:PORT"), err
    assert why in err and "127.0.0.1:9464" in err


def test_the_default_is_loopback_on_9464() -> None:
    assert build_parser().parse_args(["exporter"]).listen == "127.0.0.1:9464"


def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This user's own settings out of the way: a fresh home, config and history."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("RIGDECK_HOME", str(tmp_path / "rigdeck"))
    monkeypatch.delenv("RIGDECK_INVENTORY", raising=False)
    monkeypatch.delenv("RIGDECK_CONFIG", raising=False)


def test_an_address_in_use_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    _isolated(tmp_path, monkeypatch)
    inv = write_local_inventory(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["exporter", "--inventory", str(inv), "--listen", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert f"rigdeck exporter: cannot listen on 127.0.0.1:{port}: Address already in use" in err


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RIGDECK_INVENTORY", "RIGDECK_CONFIG")}
    return {**env, "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "RIGDECK_HOME": str(tmp_path / "rigdeck"), "PYTHONPATH": str(ROOT)}


def test_rigdeck_exporter_serves_a_local_agents_simulated_gpus_until_ctrl_c(tmp_path: Path) -> None:
    inv = write_local_inventory(tmp_path, name="here", sim_gpus=2)
    exporter = Exporter(inv, "127.0.0.1:0", _env(tmp_path))
    try:
        url = exporter.url()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        assert "(loopback only) from the embedded controller; Ctrl+C stops" in exporter.output()
        deadline = time.monotonic() + 60
        while True:  # the agent is deployed and sends its first samples
            r = read(get(url)[2].decode())
            if r.series("rigdeck_gpu_utilization_ratio") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        gpus = sorted((s["host"], s["gpu"], s["simulated"]) for s in r.series("rigdeck_gpu_utilization_ratio"))
        assert gpus == [("here", "0", "true"), ("here", "1", "true")], exporter.output()
        assert r.value("rigdeck_host_up", host="here") == 1
        assert r.value("rigdeck_gpu_memory_total_bytes", host="here", gpu="0") == 81920 * 1024 * 1024
    finally:
        code = exporter.stop()
    assert code == 0 and "rigdeck exporter: stopped" in exporter.output()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)  # nothing listens there any more


def test_rigdeck_exporter_stops_on_sigint_even_when_started_with_it_ignored(tmp_path: Path) -> None:
    """A parent that ignores SIGINT (a background job, a test runner's worker) passes that on;
    the exporter, like ``rigdeck serve``, still stops when sent it."""
    inv = write_local_inventory(tmp_path, name="here", sim_gpus=1)
    exporter = Exporter(inv, "127.0.0.1:0", _env(tmp_path), sigint_ignored=True)
    try:
        exporter.url()
    finally:
        code = exporter.stop(signal.SIGINT)
    assert code == 0 and "rigdeck exporter: stopped" in exporter.output()


# -- the server's /metrics ([server] metrics_listen, `rigdeck serve --metrics-listen`) --------


@pytest.mark.parametrize("listen,why", [
    ("9464", ""),
    (":9464", "no address: write it out, 0.0.0.0 for every interface"),
    ("127.0.0.1:65536", "the port is '65536', not a number from 0 to 65535"),
])
def test_serve_refuses_a_bad_metrics_listen_before_anything(listen: str, why: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "srv"
    assert main(["serve", "--state-dir", str(state), "--metrics-listen", listen]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rigdeck serve: --metrics-listen {json.dumps(listen)}: expected ADDR:PORT"), err
    assert why in err and not state.exists()  # nothing was started, not even its directory


def test_serve_with_its_metrics_address_in_use_stops_before_listening(tmp_path: Path) -> None:
    inv = write_local_inventory(tmp_path)
    state = tmp_path / "srv"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "tui.cli", "serve", "--state-dir", str(state), "--inventory",
                               str(inv), "--metrics-listen", f"127.0.0.1:{port}"], cwd=ROOT, env=_env(tmp_path),
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert f"rigdeck serve: cannot listen on 127.0.0.1:{port} for /metrics: Address already in use" in done.stdout
    assert not (state / "sock" / "server.sock").exists() and not (state / "server.pid").exists()


def test_rigdeck_serve_answers_metrics_from_the_servers_controller(tmp_path: Path) -> None:
    """`rigdeck serve --metrics-listen` (what `rigdeck server start` runs for [server]
    metrics_listen): its own controller's exposition on /metrics, a local agent's simulated
    GPUs in it, until SIGTERM stops the server."""
    require(shutil.which("promtool"), PROMTOOL_MISSING)
    inv = write_local_inventory(tmp_path, name="here", sim_gpus=2)
    server = Serving(["serve", "--state-dir", str(tmp_path / "srv"), "--inventory", str(inv),
                      "--metrics-listen", "127.0.0.1:0"], _env(tmp_path), ": metrics on ")
    try:
        url = server.url(60)
        assert url.startswith("http://127.0.0.1:") and "/metrics (loopback only)" in server.output()
        assert "listening on " + str(tmp_path / "srv" / "sock" / "server.sock") in server.output()
        deadline = time.monotonic() + 60
        while True:  # the agent is deployed and sends its first samples
            text = get(url)[2].decode()
            if read(text).series("rigdeck_gpu_utilization_ratio") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        r = read(text)
        gpus = sorted((s["host"], s["gpu"], s["simulated"]) for s in r.series("rigdeck_gpu_utilization_ratio"))
        assert gpus == [("here", "0", "true"), ("here", "1", "true")], server.output()
        assert r.value("rigdeck_host_up", host="here") == 1
        done = promtool_check(text)
        assert (done.returncode, done.stdout + done.stderr) == (0, "")
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0, server.output()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)  # the listener went with the server


# -- promtool and Prometheus -------------------------------------------------------------------


def test_promtool_accepts_the_exposition(metrics: MetricsServer) -> None:
    require(shutil.which("promtool"), PROMTOOL_MISSING)
    text = get(metrics.url)[2].decode()
    assert len(read(text).types) >= 30
    done = promtool_check(text)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    # The judge judges: a counter without _total and a percentage are refused.
    bad = promtool_check("# HELP gpu_util_percent x\n# TYPE gpu_util_percent counter\ngpu_util_percent 3\n")
    assert bad.returncode != 0 and "_total" in bad.stdout + bad.stderr


def test_a_real_prometheus_scrapes_the_exporter_and_answers_with_job_and_rank_labels(
        metrics: MetricsServer, tmp_path: Path) -> None:
    require(shutil.which("prometheus"), PROMETHEUS_MISSING)
    host, port = metrics.address
    with prometheus(tmp_path, f"{host}:{port}") as prom:
        up = query(prom, 'up{job="rigdeck"} == 1')
        assert up[0]["metric"]["instance"] == f"{host}:{port}"
        gpus = query(prom, f'rigdeck_gpu_utilization_ratio{{job_id="{JOB}"}}')
        placed = sorted((g["metric"]["host"], g["metric"]["gpu"], g["metric"]["rank"]) for g in gpus)
        assert placed == [("h1", "0", "0"), ("h1", "2", "1"), ("h2", "0", "2"), ("h2", "1", "3")]
        assert {g["metric"]["user"] for g in gpus} == {"root"}
        assert {g["metric"]["job"] for g in gpus} == {"rigdeck"}  # the scrape job's label, beside job_id
        loss = query(prom, f'rigdeck_job_loss{{job_id="{JOB}"}}')
        assert float(loss[0]["value"][1]) == pytest.approx(read(get(metrics.url)[2].decode()).value(
            "rigdeck_job_loss", job_id=JOB))
        unhealthy = query(prom, 'rigdeck_gpu_health{health="unhealthy"} == 1')
        assert [(u["metric"]["host"], u["metric"]["gpu"]) for u in unhealthy] == [("h1", "1")]
        # A name with a quote, a backslash and a newline comes back as it was.
        weird = query(prom, 'rigdeck_job_state{state="failed"} == 1')
        assert [w["metric"]["name"] for w in weird] == [WEIRD]
