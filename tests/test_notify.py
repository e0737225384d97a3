"""Notifications: the ``[notify]`` config and its errors, the event JSON, secrets kept out of
logs, the command and webhook notifiers, one event per transition, and a short job's
``started``/``succeeded`` sent by the embedded controller to a webhook on localhost."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.fakes import WRITER, written_lines
from tui.control.history import History
from tui.control.notify import Notifier, post_webhook
from tui.model.userconfig import (
    ConfigError,
    NotifyConfig,
    StateTracker,
    job_event,
    load_config,
    parse_config,
    redact_url,
    sweep_event,
)

ROOT = Path(__file__).resolve().parent.parent
RECEIVER = ROOT / "tests" / "notify_receiver.py"


# ---------------------------------------------------------------------------------------------
# The config


def test_a_full_notify_table_parses(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text('[notify]\nwebhook = "https://hooks.example.com/x?token=abc"\n'
                 'command = ["notify-send", "rigdeck"]\non = ["started", "failed", "failed"]\n'
                 'kinds = ["job"]\napp = false\ntimeout_s = 3\nretries = 0\n')
    cfg = load_config(p)
    n = cfg.notify
    assert cfg.path == p
    assert n.webhook == "https://hooks.example.com/x?token=abc"
    assert n.command == ("notify-send", "rigdeck")
    assert n.on == ("started", "failed")  # a repeat counts once
    assert n.kinds == ("job",) and n.app is False and n.timeout_s == 3.0 and n.retries == 0
    assert n.wants("job", "failed") and not n.wants("sweep", "failed") and not n.wants("job", "succeeded")
    assert n.sends


def test_defaults_and_a_missing_default_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RIGDECK_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "nothing-here"))
    cfg = load_config()
    assert cfg.path is None and cfg.notify == NotifyConfig()
    assert cfg.notify.on == ("failed", "succeeded", "incident") and not cfg.notify.sends and cfg.notify.app
    # The XDG location is where it is looked for; RIGDECK_CONFIG overrides it.
    (tmp_path / "xdg" / "rigdeck").mkdir(parents=True)
    (tmp_path / "xdg" / "rigdeck" / "config.toml").write_text('[notify]\non = ["queued"]\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert load_config().notify.on == ("queued",)
    other = tmp_path / "other.toml"
    other.write_text('[notify]\non = ["stopped"]\n')
    monkeypatch.setenv("RIGDECK_CONFIG", str(other))
    assert load_config().notify.on == ("stopped",)
    monkeypatch.setenv("RIGDECK_CONFIG", str(tmp_path / "gone.toml"))
    with pytest.raises(ConfigError, match="gone.toml: expected an existing config file"):
        load_config()


@pytest.mark.parametrize("body, needle", [
    ('webhook = "ftp://h/x"', "field 'notify.webhook': expected an http:// or https:// URL"),
    ('webhook = 5', "field 'notify.webhook': expected an http:// or https:// URL with a host, e.g."),
    ('webhook = "https:///nohost"', "field 'notify.webhook'"),
    ('command = "notify-send rigdeck"', "field 'notify.command': expected a program and its arguments"),
    ('command = []', "field 'notify.command'"),
    ('command = ["x", 3]', "field 'notify.command[1]': expected a string, got 3 (int)"),
    ('command = [" "]', "field 'notify.command[0]': expected a program"),
    ('on = ["fail"]',
     "field 'notify.on[0]': expected one of 'queued', 'started', 'succeeded', 'failed', 'stopped', 'incident', "
     "got \"fail\""),
    ('on = "failed"', "field 'notify.on': expected a list of events"),
    ('kinds = ["pipelines"]', "field 'notify.kinds[0]': expected one of 'job', 'sweep', 'pipeline'"),
    ('app = "yes"', "field 'notify.app': expected true or false"),
    ('retries = 99', "field 'notify.retries': expected an integer 0..10"),
    ('timeout_s = 0', "field 'notify.timeout_s': expected a number of seconds > 0"),
    ('webhok = "https://h/"', "field 'notify.webhok': expected one of the known fields app, command, "
                              "include_output, kinds, on, retries, timeout_s, webhook (did you mean 'webhook'?)"),
])
def test_a_bad_value_names_the_file_the_field_and_what_was_expected(tmp_path: Path, body: str, needle: str) -> None:
    p = tmp_path / "config.toml"
    p.write_text(f"[notify]\n{body}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}: "), str(e.value)
    assert needle in str(e.value), str(e.value)


def test_bad_files_and_tables(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    with pytest.raises(ConfigError, match=r"c.toml: expected a TOML file"):
        parse_config("[notify\n", p)
    with pytest.raises(ConfigError, match=r"field 'notfy': expected one of the known tables notify"):
        parse_config("[notfy]\n", p)
    with pytest.raises(ConfigError, match=r"field 'notify': expected a table"):
        parse_config('notify = "x"\n', p)


def test_a_bad_webhook_in_an_error_shows_no_secret(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config('[notify]\nwebhook = "ftp://user:pw@h/hook?token=SEKRET"\n', tmp_path / "c.toml")
    assert "SEKRET" not in str(e.value) and "pw" not in str(e.value), str(e.value)
    assert "ftp://user:***@h/hook?***" in str(e.value)


def test_redact_url() -> None:
    assert redact_url("https://h.example/hook?token=abc&x=1") == "https://h.example/hook?***"
    assert redact_url("https://u:secret@h.example:8443/a#frag") == "https://u:***@h.example:8443/a#***"
    slack = "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX"
    assert redact_url(slack) == "https://hooks.slack.com/services/T0000/B0000/***"
    assert redact_url("http://[::1]:8080/x") == "http://[::1]:8080/x"
    assert redact_url("http://h:notaport/x") == "***"


def test_the_notify_table_round_trips_to_what_the_server_gets() -> None:
    import tomli_w

    n = NotifyConfig(webhook="https://h/x?t=1", command=("a", "b"), on=("failed",), kinds=("job",), app=False)
    assert parse_config(tomli_w.dumps({"notify": n.to_toml()})).notify == n


# ---------------------------------------------------------------------------------------------
# Events


def _rec(**kw: Any) -> dict[str, Any]:
    rec = {"job_id": "train-1122-1", "name": "train", "spec": {}, "restarts": 0, "cause": None,
           "placement": [{"host": "h2", "gpus": [0]}, {"host": "h3", "gpus": [0]}, {"host": "h3", "gpus": [1]}]}
    rec.update(kw)
    return rec


def test_a_failed_job_event_says_which_rank_host_and_signal() -> None:
    cause = {"rank": 1, "host": "h3", "signal": 9, "exit_code": None}
    ev = job_event(_rec(), "failed", when=12.5, cause=cause, user="ana", controller="server")
    assert ev is not None
    d = ev.to_json()
    assert d == {"event": "failed", "kind": "job", "id": "train-1122-1", "name": "train", "state": "failed",
                 "time": 12.5, "user": "ana", "hosts": ["h2", "h3"], "host": "h3", "cause": cause,
                 "cause_text": "rank 1 on h3 killed by signal 9", "restarts": 0, "controller": "server"}
    assert json.loads(json.dumps(d)) == d
    assert ev.summary() == "job train-1122-1 failed: rank 1 on h3 killed by signal 9"
    env = ev.env()
    assert env["RIGDECK_JOB_ID"] == "train-1122-1" and env["RIGDECK_EVENT_NAME"] == "failed"
    assert env["RIGDECK_HOST"] == "h3"


def test_state_to_event_mapping() -> None:
    started = job_event(_rec(cause={"message": "old attempt"}), "running", when=1.0)
    assert started is not None and started.event == "started" and started.cause is None and started.host is None
    assert job_event(_rec(), "starting", when=1.0) is None
    assert job_event(_rec(), "pending", when=1.0) is None
    stopped = job_event(_rec(cause={"message": "max_runtime of 10s exceeded", "host": "h2"}), "stopped", when=1.0)
    assert stopped is not None and stopped.cause_text == "on h2 max_runtime of 10s exceeded"
    sw = sweep_event({"sweep_id": "lr-1", "name": "lr", "spec": {"hosts": ["h1"]}, "reason": None},
                     "completed", when=2.0)
    assert sw is not None and (sw.kind, sw.event, sw.id, sw.hosts) == ("sweep", "succeeded", "lr-1", ("h1",))
    assert sweep_event({"sweep_id": "lr-1", "name": "lr", "spec": {}}, "stopping", when=2.0) is None
    pl = sweep_event({"pipeline_id": "blobs-pl1", "name": "blobs", "spec": {},
                      "reason": "step train failed: rank 0 on h2 exited 4"}, "failed", when=3.0, kind="pipeline")
    assert pl is not None and (pl.kind, pl.event, pl.id) == ("pipeline", "failed", "blobs-pl1")
    assert pl.cause_text == "step train failed: rank 0 on h2 exited 4"
    assert pl.env()["RIGDECK_PIPELINE_ID"] == "blobs-pl1"
    assert sweep_event({"pipeline_id": "p", "name": "p", "spec": {}}, "stopping", when=2.0, kind="pipeline") is None


class _Row:
    def __init__(self, job_id: str, state: str, cause: dict[str, Any] | None = None):
        self.job_id, self.name, self.state, self.cause = job_id, job_id, state, cause
        self.placement = ({"host": "h1"},)
        self.restarts = 0


def test_the_tracker_tells_changes_after_the_first_look() -> None:
    t = StateTracker()
    assert t.feed([_Row("a", "running"), _Row("b", "failed")], 1.0) == []  # what was, is no news
    evs = t.feed([_Row("a", "failed", {"rank": 0, "host": "h1", "exit_code": 3}), _Row("b", "failed"),
                  _Row("c", "running")], 2.0)
    assert [(e.id, e.event) for e in evs] == [("a", "failed"), ("c", "started")]
    assert evs[0].cause_text == "rank 0 on h1 exited 3"
    assert t.feed([_Row("a", "failed"), _Row("c", "running")], 3.0) == []


# ---------------------------------------------------------------------------------------------
# Sending


def test_the_command_notifier_gets_each_transition_once_even_across_a_restart(tmp_path: Path) -> None:
    out = tmp_path / "events.txt"
    cfg = NotifyConfig(command=(sys.executable, "-c", WRITER, str(out)), on=("started", "failed"))
    db = tmp_path / "history.sqlite"
    h = History(db)
    n = Notifier(cfg, h, controller="embedded", user="ana")
    n.attach_jobs()
    h.create("j1", "train", {"hosts": []}, state="pending")
    h.update("j1", state="starting", placement=[{"host": "h2"}])
    h.update("j1", state="running", started=time.time())
    cause = {"rank": 0, "host": "h2", "exit_code": 7}
    h.announce("j1", "failed", {"cause": cause})  # decided; the record follows
    h.update("j1", state="failed", ended=time.time(), cause=cause)
    n.close()
    lines = written_lines(out)
    assert [(ln[1], ln[2], ln[3]) for ln in lines] == [("j1", "started", "True"), ("j1", "failed", "True")]
    failed = json.loads(lines[1][0])
    assert failed["cause"] == cause and failed["host"] == "h2" and failed["user"] == "ana"
    assert failed["hosts"] == ["h2"] and failed["kind"] == "job" and failed["cause_text"] == "rank 0 on h2 exited 7"
    assert list(n.sent) == [("job:j1:started", "command", None), ("job:j1:failed", "command", None)]
    # A second controller on the same history (a restarted server) records the same change again:
    # nothing more is sent.
    h2 = History(db)
    n2 = Notifier(cfg, h2)
    n2.attach_jobs()
    h2.update("j1", state="failed", ended=time.time(), cause=cause)
    n2.close()
    assert len(written_lines(out)) == 2
    # A restart's new attempt is a new transition.
    h2.update("j1", state="running", restarts=1)
    n2.close()
    assert [(ln[1], ln[2]) for ln in written_lines(out)][2:] == [("j1", "started")]


def test_a_failing_command_is_logged_and_later_events_still_go(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    h = History(tmp_path / "h.sqlite")
    n = Notifier(NotifyConfig(command=(sys.executable, "-c", "import sys; sys.exit(4)"), on=("failed",)), h)
    n.attach_jobs()
    h.create("j", "j", {}, state="running")
    with caplog.at_level(logging.WARNING, logger="tui.control.notify"):
        h.update("j", state="failed", cause={"message": "x"})
        n.close()
    assert list(n.sent) == [("job:j:failed", "command", f"{sys.executable} exited 4")]
    assert "exited 4" in caplog.text


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[str]]]:
    out = tmp_path / "received.jsonl"
    proc = subprocess.Popen([sys.executable, str(RECEIVER), "127.0.0.1", "0", str(out)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "RECEIVER_FAIL_FIRST": "0"})
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[1])
    try:
        yield f"http://127.0.0.1:{port}", out, proc
    finally:
        proc.kill()
        proc.wait()


def _received(out: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in out.read_text().splitlines()] if out.exists() else []


def test_the_webhook_posts_json(receiver: tuple[str, Path, Any]) -> None:
    url, out, _ = receiver
    body = json.dumps({"event": "failed"}).encode()
    assert post_webhook(f"{url}/hook?token=abc", body, timeout=5, retries=0) is None
    got = _received(out)
    assert got[0]["body"] == {"event": "failed"} and got[0]["path"] == "/hook?token=abc"
    assert got[0]["content_type"] == "application/json"


def test_retries_with_backoff_then_success(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen([sys.executable, str(RECEIVER), "127.0.0.1", "0", str(out)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "RECEIVER_FAIL_FIRST": "2"})
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        pauses: list[float] = []
        why = post_webhook(f"http://127.0.0.1:{port}/h", b"{}", timeout=5, retries=3, sleep=pauses.append)
        assert why is None and pauses == [0.5, 1.0]  # two 500s, then the third attempt lands
        assert len(_received(out)) == 1
        pauses.clear()
        why = post_webhook(f"http://127.0.0.1:{port}/h", b"{}", timeout=5, retries=0, sleep=pauses.append)
        assert why is None and pauses == []
    finally:
        proc.kill()
        proc.wait()


def test_an_unreachable_webhook_is_logged_without_its_secrets(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    url = f"http://user:PASSWORD@127.0.0.1:{port}/hook/ABCDEFGHIJKLMNOPQRSTUVWX?token=SEKRET"
    h = History(tmp_path / "h.sqlite")
    n = Notifier(NotifyConfig(webhook=url, retries=1, timeout_s=2), h)
    n.attach_jobs()
    h.create("j", "j", {}, state="running")
    with caplog.at_level(logging.DEBUG):
        h.update("j", state="succeeded")
        n.close()
    assert n.sent and n.sent[0][2] is not None
    text = caplog.text + repr(n.sent)
    assert "not reached" in text and "127.0.0.1" in text
    for secret in ("SEKRET", "PASSWORD", "ABCDEFGHIJKLMNOPQRSTUVWX", "token="):
        assert secret not in text, text


# ---------------------------------------------------------------------------------------------
# A real short job, the embedded controller, a webhook on localhost


@pytest.mark.testbed
def test_a_short_job_sends_started_and_succeeded_from_the_embedded_controller(
        testbed: Any, tmp_path: Path, receiver: tuple[str, Path, Any]) -> None:
    from tests.kit import TICKER

    url, out, _ = receiver
    inv = testbed.write_inventory(tmp_path / "hosts.toml", python=sys.executable, connect_timeout=5.0)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[notify]\nwebhook = "{url}/hook?token=s3cret"\non = ["started", "succeeded"]\n')
    spec = tmp_path / "short.toml"
    spec.write_text(f'name = "short"\ncommand = ["{sys.executable}", "{TICKER}", "--steps", "5", "--sleep", "0.1"]\n'
                    f'workdir = "{ROOT}"\nlauncher = "direct"\nnodes = 2\nhosts = ["h1", "h2"]\n')
    env = {**os.environ, "RIGDECK_HOME": str(tmp_path / "home"), "RIGDECK_INVENTORY": str(inv),
           "RIGDECK_CONFIG": str(cfg)}
    env.pop("RIGDECK_SERVER", None)
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "-v", "launch", str(spec), "--wait", "--json"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = json.loads(proc.stdout)
    assert job["state"] == "succeeded"
    got = _received(out)
    assert [g["body"]["event"] for g in got] == ["started", "succeeded"], got
    for g in got:
        b = g["body"]
        assert b["id"] == job["job_id"] and b["kind"] == "job" and b["name"] == "short"
        assert b["hosts"] == ["h1", "h2"] and b["controller"] == "embedded" and g["path"] == "/hook?token=s3cret"
    assert got[0]["received"] <= got[1]["received"]
    assert "s3cret" not in proc.stderr  # -v logs the notices, never the URL's secret
    # Another embedded controller looking at the ended job sends nothing again.
    subprocess.run([sys.executable, "-m", "tui.cli", "jobs", "--json"], capture_output=True, text=True,
                   timeout=120, env=env, cwd=ROOT, check=True)
    assert len(_received(out)) == 2


def test_setup_writes_the_notify_table_for_the_server() -> None:
    from tui.remote.serverhost import server_config

    n = NotifyConfig(webhook="https://h/x?token=t", on=("failed",), retries=1)
    text = server_config(n, "h1")
    assert text.startswith("# The rigdeck server's config on h1")
    assert parse_config(text).notify == n
    # No [notify] (or one that sends nothing): the server's file says nothing, so it sends nothing.
    assert parse_config(server_config(None, "h1")).notify == NotifyConfig()
    assert parse_config(server_config(NotifyConfig(on=("started",)), "h1")).notify == NotifyConfig()


def test_a_bad_config_stops_the_cli_before_anything_starts(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.toml"
    inv.write_text('[[hosts]]\nname = "here"\ntransport = "local"\n')
    cfg = tmp_path / "config.toml"
    cfg.write_text('[notify]\nwebhook = "https://h/x?token=SEKRET"\non = ["done"]\n')
    env = {**os.environ, "RIGDECK_HOME": str(tmp_path / "home"), "RIGDECK_CONFIG": str(cfg)}
    env.pop("RIGDECK_SERVER", None)
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "jobs", "-i", str(inv)], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"rigdeck: {cfg}: field 'notify.on[0]': expected one of 'queued', 'started', "
                                   "'succeeded', 'failed', 'stopped', 'incident', got \"done\" (str)")
    assert not (tmp_path / "home" / "history.sqlite").exists()  # nothing started


@pytest.mark.testbed
def test_a_sweep_sends_started_and_succeeded_to_the_command(testbed: Any, tmp_path: Path) -> None:
    from tests.kit.bedcli import Cli
    from tests.kit.specs import sweep_spec

    cli = Cli(testbed, tmp_path)
    out = tmp_path / "events.txt"
    cfg = tmp_path / "config.toml"
    writer = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')", str(out)]
    cfg.write_text(f'[notify]\ncommand = {json.dumps(writer)}\non = ["started", "succeeded"]\nkinds = ["sweep"]\n')
    cli.env["RIGDECK_CONFIG"] = str(cfg)
    done = cli.json("sweep", str(sweep_spec(cli, "sw-notify", trials=2, parallel=2, steps=3)), "--wait",
                    timeout=300)
    assert done["row"]["state"] == "completed"
    events = [json.loads(ln) for ln in out.read_text().splitlines()]
    # Only the sweep's own changes (kinds = ["sweep"]): its trials' jobs are not told.
    assert [(e["kind"], e["event"], e["state"]) for e in events] == [("sweep", "started", "running"),
                                                                     ("sweep", "succeeded", "completed")]
    assert {e["id"] for e in events} == {done["row"]["sweep_id"]} and events[0]["name"] == "sw-notify"


def test_setup_says_what_the_server_will_send_without_secrets() -> None:
    from tui.cli.server import _notify_line

    line = _notify_line(NotifyConfig(webhook="https://h.example/x?token=SEKRET", command=("notify-send", "x"),
                                     on=("failed",)), "h1")
    assert line == "webhook https://h.example/x?***, command notify-send on failed, sent from h1"
    assert _notify_line(NotifyConfig(), "h1").startswith("nothing")


def test_the_docs_example_parses_and_the_contract_lists_every_key() -> None:
    import re

    page = (ROOT / "docs" / "notifications.md").read_text()
    block = re.search(r"# Notifications\n.*?```toml\n(.*?)```", page, re.S)
    assert block is not None
    n = parse_config(block.group(1)).notify
    assert n.webhook and n.command == ("notify-send", "rigdeck") and n.on == ("failed", "succeeded", "incident")
    contracts = (ROOT / "docs" / "contracts.md").read_text()
    example = re.search(r"## Notification event.*?```json\n(.*?)```", contracts, re.S)
    assert example is not None
    ev = job_event(_rec(), "failed", when=1.0, cause={"rank": 1, "host": "h3", "signal": 9})
    assert ev is not None and set(json.loads(example.group(1))) == set(ev.to_json())


def test_a_failed_ranks_output_goes_out_only_when_the_config_asks() -> None:
    """The rank's last lines can hold anything the job printed (a token): a webhook's body
    carries them only with ``[notify] include_output = true``."""
    cause = {"rank": 0, "host": "h2", "exit_code": 1, "tail": ["export TOKEN=hunter2", "Traceback ..."]}
    plain = job_event(_rec(), "failed", when=1.0, cause=cause)
    assert plain is not None and "tail" not in plain.to_json()["cause"] and "hunter2" not in json.dumps(plain.to_json())
    assert cause["tail"]  # the record's cause is not changed
    told = job_event(_rec(), "failed", when=1.0, cause=cause, include_output=True)
    assert told is not None and told.to_json()["cause"]["tail"] == cause["tail"]
    from tui.model.userconfig import parse_config

    assert parse_config("[notify]\ninclude_output = true\n").notify.include_output is True
    assert parse_config("[notify]\n").notify.include_output is False
    with pytest.raises(ValueError, match="notify.include_output"):
        parse_config('[notify]\ninclude_output = "yes"\n')
