"""Prometheus, read and run for real: the text format (0.0.4) read strictly, from its
specification; a URL fetched as a scraper does; ``rigdeck exporter`` (and any ``rigdeck`` command
that serves /metrics) running; promtool's check; a Prometheus server scraping targets."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kit import ROOT
from tests.webpage import free_port, process_for_the_test

Labels = tuple[tuple[str, str], ...]

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def _unescape(v: str) -> str:
    out, i = [], 0
    while i < len(v):
        if v[i] == "\\":
            nxt = v[i + 1]
            assert nxt in '\\"n', f"an escape the format does not have: \\{nxt}"
            out.append("\n" if nxt == "n" else nxt)
            i += 2
        else:
            out.append(v[i])
            i += 1
    return "".join(out)


@dataclass
class Read:
    types: dict[str, str]
    helps: dict[str, str]
    samples: dict[tuple[str, Labels], str]  # (name, labels in order) -> the value as written

    def value(self, metric: str, /, **labels: str) -> float:
        """The one sample of ``metric`` whose labels include ``labels``."""
        found = [v for (n, ls), v in self.samples.items() if n == metric and labels.items() <= dict(ls).items()]
        assert len(found) == 1, (metric, labels, found)
        return float(found[0])

    def series(self, metric: str) -> list[dict[str, str]]:
        return [dict(ls) for (n, ls) in self.samples if n == metric]


def read(text: str) -> Read:
    """The exposition, read strictly: a family's HELP and TYPE once, before its samples; every
    sample's family the current one; no series twice; the text ends in a newline."""
    assert text.endswith("\n")
    r = Read({}, {}, {})
    current = None
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert name not in r.helps, f"HELP twice: {name}"
            r.helps[name] = help_text
            current = name
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name == current and name not in r.types, line
            assert kind in ("gauge", "counter"), line
            r.types[name] = kind
        else:
            m = _SAMPLE.fullmatch(line)
            assert m, f"not a sample line: {line!r}"
            name, body, value = m.groups()
            assert name == current and name in r.types, f"a sample outside its family: {line!r}"
            labels: list[tuple[str, str]] = []
            rest = body or ""
            while rest:
                p = _PAIR.match(rest)
                assert p, f"bad labels in {line!r}"
                labels.append((p.group(1), _unescape(p.group(2))))
                rest = rest[p.end():]
            key = (name, tuple(labels))
            assert key not in r.samples, f"a series twice: {line!r}"
            float(value)  # NaN, +Inf, -Inf and numbers all parse
            r.samples[key] = value
    return r



def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()



class Serving:
    """A running ``rigdeck ARGS...`` that serves /metrics (its own process group); ``url`` is the
    word after ``marker`` in its output, once it printed it."""

    def __init__(self, args: list[str], env: dict[str, str], marker: str, *, sigint_ignored: bool = False) -> None:
        self.what, self.marker = f"rigdeck {args[0]}", marker
        self.log = tempfile.TemporaryFile()

        def ignore_sigint() -> None:  # as a shell starts a background job
            signal.signal(signal.SIGINT, signal.SIG_IGN)

        self.proc = subprocess.Popen([sys.executable, "-m", "tui.cli", *args], cwd=ROOT, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                     preexec_fn=ignore_sigint if sigint_ignored else None)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def url(self, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.output()
            if self.marker in out:
                return out.split(self.marker, 1)[1].split()[0]
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.what} exited {self.proc.returncode}:\n{out}")
            time.sleep(0.1)
        raise AssertionError(f"{self.what} did not start in {timeout} s:\n{self.output()}")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60.0) -> int:
        """Signal it and wait for its end: the embedded controller closes its hosts first (a
        fresh-clone run on a loaded machine took over 20 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # where it is stuck: every thread's stack
            time.sleep(2)
            sigs = [ln for ln in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
                    if ln.startswith(("SigBlk", "SigIgn", "SigPnd", "ShdPnd"))]
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"{self.what} did not stop {timeout} s after signal {sig} ({sigs}):\n"
                                 f"{self.output()[-12000:]}") from None


class Exporter(Serving):
    """A running ``rigdeck exporter``."""

    def __init__(self, inventory: Path, listen: str, env: dict[str, str], *, sigint_ignored: bool = False) -> None:
        super().__init__(["exporter", "--inventory", str(inventory), "--listen", listen], env,
                         "rigdeck exporter: serving ", sigint_ignored=sigint_ignored)



def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None
    return subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)



@contextlib.contextmanager
def prometheus(tmp: Path, *targets: str) -> Iterator[str]:
    """A Prometheus server on a free loopback port, scraping ``targets`` (host:port each) every
    second as the scrape job ``rigdeck``; yields its URL."""
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: rigdeck\n    static_configs:\n      - targets: {json.dumps(targets)}\n")
    with process_for_the_test(
            [str(shutil.which("prometheus")), f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], tmp / "prometheus.log"):
        yield f"http://127.0.0.1:{port}"


def query(prom: str, expr: str, timeout: float = 60.0, count: int = 1) -> list[dict[str, Any]]:
    """The instant query's series, once it has ``count`` or more (Prometheus starts, then scrapes)."""
    deadline = time.monotonic() + timeout
    url = f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    result: list[dict[str, Any]] = []
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                result = json.load(r)["data"]["result"]
            if len(result) >= count:
                return list(result)
        except (urllib.error.URLError, ConnectionError):
            pass  # not up yet
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(result)} series, not {count}, for {expr} from {prom} in {timeout} s")
        time.sleep(0.5)
