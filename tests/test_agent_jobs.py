"""The agent's job files, written by the real rank wrapper and read back by the daemon's Jobs:
metrics offsets per source, capped and rotated logs, long lines, raw bytes, GPU claims, attempts,
retention."""

from __future__ import annotations

import base64
import collections
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent import claims
from agent.jobhost import TERMINAL
from agent.jobs import Jobs

ROOT = Path(__file__).resolve().parent.parent


def _job(tmp_path: Path, job_id: str = "j1") -> tuple[Jobs, Path]:
    jobs = Jobs(str(tmp_path / "state"), ["agent"])
    d = Path(jobs.job_dir(job_id))
    d.mkdir(parents=True)
    (d / "plan.json").write_text(json.dumps({"job_id": job_id}))
    (d / "state.json").write_text(json.dumps({"job_id": job_id, "state": "succeeded"}))
    return jobs, d


def rank(d: Path, code: str, rank: int = 0, env: dict[str, str] | None = None,
         claim_dir: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -c code`` as rank ``rank`` under the real wrapper (``agent rank``)."""
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if claim_dir is not None:
        e["RIGDECK_CLAIM_DIR"] = str(claim_dir)
    return subprocess.run([sys.executable, "-m", "agent", "rank", "--job-dir", str(d), "--rank", str(rank),
                           "--local-rank", "0", "--", sys.executable, "-c", code],
                          env=e, capture_output=True, timeout=120, check=False)


def _read(jobs: Jobs, offsets: dict[str, int], job_id: str = "j1") -> list[dict[str, Any]]:
    """One reader's pass, keeping offsets the way the controller does."""
    out = []
    while True:
        chunk = jobs.metrics(job_id, offsets, max_bytes=64)
        more = False
        for r, part in chunk.items():  # keys: "R", or "0/defs" and "R/hypertune"
            out += [{**rec, "source": part["source"], "rank": int(r.split("/")[0])} for rec in part["records"]]
            offsets[part["offset_key"]] = part["next_offset"]
            more = more or part["more"]
        if not more:
            return out


def _read_logs(jobs: Jobs, r: int, offset: int, max_bytes: int, binary: bool = False) -> tuple[list[Any], int]:
    """Every chunk a reader gets from ``offset`` on, until the agent says nothing more waits."""
    chunks = []
    while True:
        chunk = jobs.logs("j1", r, offset, max_bytes=max_bytes, binary=binary)
        assert chunk["offset"] == offset
        data = base64.b64decode(chunk["b64"]) if binary else chunk["text"]
        if data:
            chunks.append(data if binary else (data, chunk["partial"]))
        assert chunk["next_offset"] >= offset
        if chunk["next_offset"] == offset and not chunk["more"]:
            return chunks, offset
        assert chunk["next_offset"] > offset, "the reader is stuck"
        offset = chunk["next_offset"]


def test_stdout_loss_then_metrics_file_each_read_from_its_own_offset(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    rank(d, "print('starting'); print('step 1 loss=2.5'); print('step 2 loss: 2.25')")
    offsets: dict[str, int] = {}
    first = _read(jobs, offsets)
    assert [(r["step"], r["loss"], r["source"]) for r in first] == [(1, 2.5, "stdout"), (2, 2.25, "stdout")]
    assert set(offsets) == {"0/stdout"}

    # The rank's runtime starts its metrics file: it is read from its first byte, although the
    # reader's stdout offset is already past that.
    lines = [json.dumps({"step": s, "loss": 3.0 - s / 10, "time": 100.0 + s}) for s in range(3, 9)]
    (d / "metrics" / "rank-0.jsonl").write_text("\n".join(lines) + "\n")
    second = _read(jobs, offsets)
    assert [(r["step"], r["source"]) for r in second] == [(s, "metrics") for s in range(3, 9)]
    assert offsets["0"] == (d / "metrics" / "rank-0.jsonl").stat().st_size
    assert _read(jobs, offsets) == []  # nothing again


def test_each_rank_has_its_own_offsets(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    rank(d, "print('loss=1.0')", rank=0)
    rank(d, "print('noise')", rank=1)
    (d / "metrics" / "rank-1.jsonl").write_text(json.dumps({"step": 0, "loss": 9.0}) + "\n")
    offsets: dict[str, int] = {}
    got = sorted((r["rank"], r["loss"], r["source"]) for r in _read(jobs, offsets))
    assert got == [(0, 1.0, "stdout"), (1, 9.0, "metrics")]
    assert set(offsets) == {"0/stdout", "1"}


def test_a_line_longer_than_a_chunk_comes_in_pieces_marked_partial(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    bar = "".join(f"\r{i:3d}% |{'█' * (i // 5)}é" for i in range(100))  # a redrawn progress bar
    rank(d, f"import sys; sys.stdout.write('start\\n' + {bar!r} + '\\nstep 1 loss=0.5\\n')")
    log = d / "logs" / "rank-0.log"
    chunks, offset = _read_logs(jobs, 0, 0, max_bytes=61)
    assert offset == log.stat().st_size
    assert "".join(t for t, _ in chunks) == log.read_bytes().decode()
    assert len(chunks) > 10 and not any("\ufffd" in t for t, _ in chunks)  # no character was cut
    # Every piece but a line's last says it is part of a line: a reader joins them into one line.
    joined, buf = [], ""
    for text, partial in chunks:
        buf += text
        if not partial:
            joined += buf.split("\n")[:-1]
            buf = ""
    assert joined == ["start", bar, "step 1 loss=0.5"]


def test_an_unterminated_last_line_comes_once_its_rank_has_ended(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    log = d / "logs" / "rank-0.log"
    log.parent.mkdir()
    log.write_text("epoch 1 loss=0.5\nepoch 2 loss=0.4\nfinal loss=0.3")  # no newline at the end
    chunks, offset = _read_logs(jobs, 0, 0, max_bytes=1024)
    assert chunks == [("epoch 1 loss=0.5\nepoch 2 loss=0.4\n", False)]  # the rank may still finish the line
    (d / "ranks").mkdir()
    (d / "ranks" / "rank-0.exit.json").write_text(json.dumps({"rank": 0, "exit_code": 0}))
    rest, end = _read_logs(jobs, 0, offset, max_bytes=1024)
    assert rest == [("final loss=0.3", True)] and end == log.stat().st_size
    assert _read_logs(jobs, 0, end, max_bytes=1024) == ([], end)  # and only once


def test_a_ranks_unterminated_last_loss_line_is_counted(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    rank(d, "import sys; sys.stdout.write('epoch 1 loss=0.5\\nepoch 2 loss=0.4\\nfinal loss=0.3')")
    assert [r["loss"] for r in _read(jobs, {})] == [0.5, 0.4, 0.3]


def test_loss_and_step_are_read_from_coloured_output(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    rank(d, r"print('\x1b[32mstep 7\x1b[0m loss=\x1b[1m0.25\x1b[0m'); "
            r"print('\x1b[2m12:00:01\x1b[0m INFO iter: 8 | \'loss\': 0.125')")
    assert [(r["step"], r["loss"]) for r in _read(jobs, {})] == [(7, 0.25), (8, 0.125)]


def test_tracker_links_a_rank_prints_are_in_its_status_once_each(tmp_path: Path) -> None:
    """The real wrapper: W&B's coloured run line twice (and again by a second attempt), its project
    line, MLflow's lines from another rank: job_status has each run once, with its rank."""
    jobs, d = _job(tmp_path)
    run = "https://wandb.ai/acme/llm/runs/3kx9q2vb"
    wandb = (r"print('\x1b[34m\x1b[1mwandb\x1b[0m: \u2b50 View project at \x1b[34m\x1b[4mhttps://wandb.ai/acme/llm"
             r"\x1b[0m'); print('\x1b[34m\x1b[1mwandb\x1b[0m: \U0001f680 View run at \x1b[34m\x1b[4m" + run
             + r"\x1b[0m', flush=True); print('step 1 loss=0.5'); print('wandb: View run x at: " + run + "')")
    mlflow = "http://10.0.0.5:5000/#/experiments/7/runs/0f1e2d3c"
    assert rank(d, wandb).returncode == 0
    assert rank(d, f"print('\\U0001f3c3 View run y at: {mlflow}'); print('View experiment at: "
                   f"http://10.0.0.5:5000/#/experiments/7')", rank=1).returncode == 0
    assert rank(d, wandb).returncode == 0  # the next attempt prints the same run
    assert [(x["kind"], x["url"], x["rank"]) for x in jobs.status("j1")["links"]] == [
        ("wandb", run, 0), ("mlflow", mlflow, 1)]
    assert [r["loss"] for r in _read(jobs, {})] == [0.5, 0.5]  # the loss parser still reads its lines


def test_loss_lines_without_a_step_are_numbered_in_order_for_every_reader(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    rank(d, "for e in range(10): print(f'epoch={e} loss={1 / (e + 1):.4f}')\nprint('step 50 loss=0.01')\n"
            "print('loss: 0.009'); print('loss: 0.008')")
    first = _read(jobs, {})  # 64-byte chunks: several replies
    assert [r["step"] for r in first] == [*range(10), 50, 11, 12]
    assert all(r.get("counted") for r in first[:10]) and "counted" not in first[10]
    again = Jobs(str(tmp_path / "state"), ["agent"])  # a restarted agent reads the same numbers
    assert [(r["step"], r["loss"]) for r in _read(again, {})] == [(r["step"], r["loss"]) for r in first]


def test_a_custom_loss_pattern_comes_from_the_plan(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    rank(d, "print('it 3 obj 0.75 loss=9'); print('it 4 obj 0.5')",
         env={"RIGDECK_LOSS_PATTERN": r"obj (?P<loss>[0-9.]+)"})
    assert [r["loss"] for r in _read(jobs, {})] == [0.75, 0.5]


def test_a_flood_is_capped_rotated_and_read_back_with_a_dropped_marker(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    cap = 1 << 20
    # 8 MB of output with a loss line every 1000 lines; the last lines are what counts.
    rank(d, "import sys\nw = sys.stdout.write\n"
            "for i in range(80000):\n"
            "    w(f'step {i} loss={1/(i+1):.6f}\\n' if i % 1000 == 0 else f'noise {i:08d} ' + 'x' * 80 + '\\n')\n"
            "w('the end\\n')", env={"RIGDECK_LOG_CAP": str(cap)})
    logs = d / "logs"
    on_disk = sum(p.stat().st_size for p in logs.glob("rank-0.log*") if not p.name.endswith((".seg", ".lock")))
    assert on_disk <= cap
    chunks, end = _read_logs(jobs, 0, 0, max_bytes=65536, binary=True)
    data = b"".join(chunks)
    assert data.startswith(b"[... ") and b" MB dropped ...]\n" in data.split(b"\n", 1)[0] + b"\n"
    kept = data.split(b"\n", 1)[1]
    assert kept.endswith(b"the end\n") and len(kept) <= cap
    expected = b"".join((f"step {i} loss={1/(i+1):.6f}\n" if i % 1000 == 0
                         else f"noise {i:08d} " + "x" * 80 + "\n").encode()
                        for i in range(80000)) + b"the end\n"
    assert expected.endswith(kept)  # the bytes kept are exactly the rank's last bytes
    assert end == len(expected)  # offsets count every byte the rank wrote
    # Every step's loss was parsed on the way, whatever the cap dropped.
    assert [r["step"] for r in _read(jobs, {})] == list(range(0, 80000, 1000))
    # A status reads tails only: the last loss is there.
    assert jobs.status("j1")["last_metrics"]["0"]["step"] == 79000


def test_an_overlong_line_is_cut_once_with_a_marker_and_bytes_pass_through(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    cap = 1 << 20  # a line may take a quarter: 256 KB
    rank(d, "import sys\nb = sys.stdout.buffer\nb.write(b'before\\n' + b'y' * 300000 + b'\\n')\n"
            "b.write(b'bad \\xff\\xfe bytes \\xc3\\n')\nb.write(b'z' * 1000 + b'\\nafter\\n')",
         env={"RIGDECK_LOG_CAP": str(cap)})
    data = b"".join(_read_logs(jobs, 0, 0, max_bytes=65536, binary=True)[0])
    lines = data.split(b"\n")
    assert lines[0] == b"before"
    assert lines[1].startswith(b"y" * 262144) and lines[1].endswith(b"[... 37.0 KB of this line cut ...]")
    assert lines[2] == b"bad \xff\xfe bytes \xc3"  # invalid UTF-8 comes back as it was written
    assert lines[3:] == [b"z" * 1000, b"after", b""]


def test_gpu_claims_are_all_or_none_name_the_holder_and_live_while_any_rank_does(tmp_path: Path) -> None:
    cdir = tmp_path / "claims"
    fds = claims.claim([0, 1], "job-a", str(cdir))
    assert oct((cdir).stat().st_mode & 0o7777) == "0o1777"
    with pytest.raises(claims.ClaimError, match=r"GPU 1 on .* is held by job job-a \(user \w+, pid \d+"):
        claims.claim([1, 2], "job-b", str(cdir))
    assert claims.claim([2], "job-b", str(cdir))  # GPU 2 was not taken by the refused claim
    held = claims.held(str(cdir))
    assert held is not None and {g: h["job_id"] for g, h in held.items()} == {0: "job-a", 1: "job-a", 2: "job-b"}
    # A rank joins the claim and outlives the holder: the claim lasts while the rank lives.
    jd = tmp_path / "jd"
    jd.mkdir()
    code = "import time, sys; print('up', flush=True); time.sleep(3)"
    proc = subprocess.Popen([sys.executable, "-m", "agent", "rank", "--job-dir", str(jd), "--rank", "0", "--local-rank",
                             "0", "--", sys.executable, "-c", code],
                            env={**os.environ, "PYTHONPATH": str(ROOT), "RIGDECK_CLAIM_DIR": str(cdir),
                                 "RIGDECK_GPUS": "0,1"})
    try:
        deadline = time.monotonic() + 20
        while not (jd / "ranks" / "rank-0.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for fd in fds:
            os.close(fd)  # the job host is gone
        with pytest.raises(claims.ClaimError, match="held by job job-a"):
            claims.claim([0], "job-c", str(cdir))
        # The wrapper dies with kill -9: its training process (which holds the claim too) dies with it.
        child = json.loads((jd / "ranks" / "rank-0.json").read_text())["pid"]
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{child}") or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]
    finally:
        proc.kill()
    deadline = time.monotonic() + 5
    while True:
        try:
            fds = claims.claim([0, 1], "job-c", str(cdir))
            break
        except claims.ClaimError:
            assert time.monotonic() < deadline, "the claim outlived every process of its job"
            time.sleep(0.1)
    held = claims.held(str(cdir))
    assert held is not None and held[0]["job_id"] == "job-c"
    for fd in fds:
        os.close(fd)


def test_a_start_refuses_claimed_gpus_and_a_claim_ahead_is_used_then_released(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("RIGDECK_CLAIM_DIR", str(tmp_path / "claims"))
    jobs, _ = _job(tmp_path, "other")
    assert jobs.claim("j2", [0, 1]) == {"claimed": [0, 1]}
    assert jobs.check("j3", [1], 0)["problems"] == [f"GPU 1 on {os.uname().nodename} is held by "
                                                    f"{claims.describe_holder(claims.held()[1])}"]
    assert jobs.check("j2", [0, 1], 0)["problems"] == []  # its own claim is no problem
    assert "min_free_mb" in jobs.check("j3", [], 1e12)["problems"][0]
    with pytest.raises(Exception, match="held by job j2"):
        jobs.claim("j3", [1])
    assert jobs.release("j2") == {"released": True}
    assert jobs.claim("j3", [1]) == {"claimed": [1]}
    jobs.release("j3")


def test_metrics_records_carry_the_attempt_that_wrote_them(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    (d / "metrics").mkdir()
    m = d / "metrics" / "rank-0.jsonl"
    Jobs._mark_attempt(str(d), 0)
    m.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(3)))
    Jobs._mark_attempt(str(d), 1)
    with m.open("a") as f:
        f.write("".join(json.dumps({"step": s, "loss": 0.5}) + "\n" for s in range(2)))
    got = [(r["step"], r["restart"]) for r in _read(jobs, {})]
    assert got == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]


def test_gc_removes_ended_job_dirs_past_retention_and_keeps_running_ones(tmp_path: Path) -> None:
    jobs = Jobs(str(tmp_path / "state"), ["agent"])
    now = time.time()
    for i, (state, ended) in enumerate([("succeeded", now - 10 * 86400), ("failed", now - 3600),
                                        ("stopped", now - 60), ("running", None)]):
        d = Path(jobs.job_dir(f"j{i}"))
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({"state": state, "ended": ended, "started": now - 20 * 86400,
                                                  "jobhost_pid": os.getpid() if state == "running" else None}))
    assert jobs.gc(max_age_s=7 * 86400, max_jobs=None) == {"removed": ["j0"], "running": ["j3"], "kept": 2}
    assert jobs.gc(max_age_s=None, max_jobs=1) == {"removed": ["j1"], "running": ["j3"], "kept": 1}
    assert sorted(p.name for p in Path(jobs.root).iterdir()) == ["j2", "j3"]


def test_any_process_holding_a_shared_lock_keeps_a_gpu_claimed(tmp_path: Path) -> None:
    cdir = tmp_path / "claims"
    for fd in claims.claim([5], "mine", str(cdir)):
        os.close(fd)
    fd = os.open(cdir / "gpu-5.lock", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # another user's rank holds it
    try:
        with pytest.raises(claims.ClaimError, match="GPU 5"):
            claims.claim([5], "theirs", str(cdir))
    finally:
        os.close(fd)


def test_a_double_dash_inside_the_command_reaches_it(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    e = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "agent", "rank", "--job-dir", str(d), "--rank", "0", "--local-rank", "0",
                    "--", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--", "--lr", "1"],
                   env=e, check=True, timeout=60)
    assert (d / "logs" / "rank-0.log").read_text() == "['--', '--lr', '1']\n"


def test_a_rank_that_dies_of_a_full_disk_says_where_in_its_exit_record(tmp_path: Path) -> None:
    _, d = _job(tmp_path)
    code = ("import errno, os\n"
            "raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), '/data/ckpt/step-10.pt')")
    rank(d, code)
    ex = json.loads((d / "ranks" / "rank-0.exit.json").read_text())
    assert ex["exit_code"] == 1
    assert ex["error"].startswith(f"no space left on {os.uname().nodename}:/data/ckpt/step-10.pt")
    assert ex["error"].endswith(" MB free")


# -- a sweep's metrics: metric definitions on rank 0's output, cloudml-hypertune's file ----------

DEFINITIONS = [
    {"name": "val_acc", "regex": r"val_acc=([-0-9.eE+]+)"},
    {"name": "lr", "regex": r"lr: (?P<value>\S+)"},  # the group named value, not the first
    {"name": "broken", "regex": "val_acc=(["},  # no regex: left out, the others go on
    {"name": "no_group", "regex": "val_acc"},  # nothing to capture: never a value
    {"name": "step", "regex": r"step (\d+)"},  # a record's own key: left out
]
PRINTS = ("print('epoch 1 val_acc=0.5 lr: 0.1'); print('step 30 val_acc=0.75 loss=2.0'); "
          "print('lr: fast'); print('lr: 1e-3'); print('\\x1b[32mval_acc=0.875\\x1b[0m')")


def test_metric_definitions_read_rank_0s_output_only_and_skip_what_they_cannot_use(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    env = {"RIGDECK_METRIC_DEFINITIONS": json.dumps(DEFINITIONS)}
    zero = rank(d, PRINTS, rank=0, env=env)
    one = rank(d, PRINTS, rank=1, env=env)
    assert zero.returncode == one.returncode == 0
    assert b"'broken' skipped: bad regex" in zero.stderr and b"'step'" in zero.stderr
    assert not (d / "metrics" / "defs-rank-1.jsonl").exists()  # rank 1 printed the same lines
    offsets: dict[str, int] = {}
    parts = jobs.metrics("j1", offsets)
    assert set(parts) == {"0", "1", "0/defs"}  # rank R's parsed loss, and the definitions' part
    defs = parts["0/defs"]
    assert defs["source"] == "metric_definitions" and defs["offset_key"] == "0/defs"
    assert defs["next_offset"] == (d / "metrics" / "defs-rank-0.jsonl").stat().st_size
    got = [{k: v for k, v in r.items() if k != "time"} for r in defs["records"]]
    # A line's own "step N" is the step; otherwise the definition's matches before it are counted.
    assert got == [
        {"rank": 0, "val_acc": 0.5, "step": 0, "counted": True, "source": "metric_definitions", "restart": 0},
        {"rank": 0, "lr": 0.1, "step": 0, "counted": True, "source": "metric_definitions", "restart": 0},
        {"rank": 0, "val_acc": 0.75, "step": 30, "source": "metric_definitions", "restart": 0},
        {"rank": 0, "lr": 0.001, "step": 1, "counted": True, "source": "metric_definitions", "restart": 0},
        {"rank": 0, "val_acc": 0.875, "step": 2, "counted": True, "source": "metric_definitions", "restart": 0},
    ]
    assert all(isinstance(r["time"], float) for r in defs["records"])
    assert [r["loss"] for r in parts["0"]["records"]] == [2.0]  # the loss parser goes on as before
    offsets.update((p["offset_key"], p["next_offset"]) for p in parts.values())
    assert all(not p["records"] for p in jobs.metrics("j1", offsets).values())  # each record once


def test_metric_definitions_that_are_no_json_leave_the_rank_alone(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    done = rank(d, "print('val_acc=0.5')", env={"RIGDECK_METRIC_DEFINITIONS": "[{name: x"})
    assert done.returncode == 0 and b"not JSON" in done.stderr
    assert (d / "logs" / "rank-0.log").read_text() == "val_acc=0.5\n"
    assert not (d / "metrics" / "defs-rank-0.jsonl").exists()


class HyperTuneLike:
    """Reports the way cloudml-hypertune's ``HyperTune.report_hyperparameter_tuning_metric`` does:
    its last 100 entries kept, the whole file rewritten (mode 'w') on each report, one JSON object
    a line with every value a string but the timestamp."""

    def __init__(self, path: Path, trial: str):
        self.path, self.trial = path, trial
        self.entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=100)

    def report(self, tag: str, value: float, global_step: int) -> None:
        self.entries.append({"timestamp": time.time(), "trial": self.trial, tag: str(float(value)),
                             "global_step": str(int(global_step)), "checkpoint_path": ""})
        with open(self.path, "w") as f:
            for e in self.entries:
                f.write(json.dumps(e, sort_keys=True) + "\n")


def _plan_on_node(d: Path, node_index: int) -> None:
    nodes = [{"host": f"h{i}", "address": f"10.0.0.{i + 1}", "slots": 2, "gpus": []} for i in range(2)]
    (d / "plan.json").write_text(json.dumps({"job_id": "j1", "nodes": nodes, "node_index": node_index}))


def _hypertune(jobs: Jobs, offsets: dict[str, int], key: str) -> list[dict[str, Any]]:
    parts = jobs.metrics("j1", offsets)
    json.dumps(parts)  # it goes over the wire as it is
    part = parts[key]
    assert part["source"] == "hypertune" and part["offset_key"] == key and part["more"] is False
    offsets[key] = part["next_offset"]
    return part["records"]


def test_hypertune_reports_come_once_each_by_timestamp_though_the_file_is_rewritten(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    _plan_on_node(d, 1)  # the second node: its first rank is 2
    (d / "metrics").mkdir()
    Jobs._mark_attempt(str(d), 0)
    path = d / "metrics" / "hypertune.metrics"
    ht = HyperTuneLike(path, "4")
    for step in (100, 200, 300):
        ht.report("accuracy", step / 1000, step)
    offsets: dict[str, int] = {}
    first = _hypertune(jobs, offsets, "2/hypertune")
    assert [{k: v for k, v in r.items() if k != "time"} for r in first] == [
        {"rank": 2, "step": s, "accuracy": s / 1000, "trial": "4", "source": "hypertune", "restart": 0}
        for s in (100, 200, 300)]
    assert offsets["2/hypertune"] == round(ht.entries[-1]["timestamp"] * 1e6)
    ht.report("accuracy", 0.4, 400)
    ht.report("loss", 0.25, 400)
    assert [(r["step"], r.get("accuracy"), r.get("loss")) for r in _hypertune(jobs, offsets, "2/hypertune")] == [
        (400, 0.4, None), (400, None, 0.25)]
    assert _hypertune(jobs, offsets, "2/hypertune") == []  # nothing new: nothing again


def test_a_malformed_or_half_written_hypertune_line_is_skipped_and_a_whole_one_comes_later(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    _plan_on_node(d, 0)
    (d / "metrics").mkdir()
    path = d / "metrics" / "hypertune.metrics"
    ht = HyperTuneLike(path, "1")
    ht.report("accuracy", 0.5, 10)
    ht.report("accuracy", 0.6, 20)
    text = path.read_text()
    whole, torn = text.splitlines()[0], text.splitlines()[1]
    now = time.time()
    path.write_text("\n".join([
        whole,
        "not json at all",
        json.dumps(["a", "list"]),
        json.dumps({"timestamp": "soon", "accuracy": "0.9", "global_step": "5"}),  # no time
        json.dumps({"timestamp": now, "accuracy": "0.9", "global_step": "five"}),  # no step
        json.dumps({"timestamp": now, "trial": "1", "global_step": "5", "checkpoint_path": ""}),  # no metric
        torn[: len(torn) // 2],  # hypertune is rewriting the file as we read
    ]))
    offsets: dict[str, int] = {}
    assert [(r["step"], r["accuracy"]) for r in _hypertune(jobs, offsets, "0/hypertune")] == [(10, 0.5)]
    path.write_text(whole + "\n" + torn + "\n")  # the rewrite is done
    assert [(r["step"], r["accuracy"]) for r in _hypertune(jobs, offsets, "0/hypertune")] == [(20, 0.6)]


def test_a_restarts_hypertune_reports_carry_its_attempt(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    _plan_on_node(d, 0)
    (d / "metrics").mkdir()
    path = d / "metrics" / "hypertune.metrics"
    Jobs._mark_attempt(str(d), 0)
    HyperTuneLike(path, "1").report("accuracy", 0.5, 10)
    offsets: dict[str, int] = {}
    assert [r["restart"] for r in _hypertune(jobs, offsets, "0/hypertune")] == [0]
    time.sleep(0.01)
    Jobs._mark_attempt(str(d), 1)
    again = HyperTuneLike(path, "1")  # the restarted process: its own entries only
    again.report("accuracy", 0.55, 10)
    assert [(r["step"], r["restart"]) for r in _hypertune(jobs, offsets, "0/hypertune")] == [(10, 1)]
    assert [(r["step"], r["restart"]) for r in _hypertune(jobs, {}, "0/hypertune")] == [(10, 1)]


TRIAL_RANK = r"""
import json, os, time
print("trial", os.environ["RIGDECK_TRIAL"], os.environ["CLOUD_ML_TRIAL_ID"], os.environ["RIGDECK_SWEEP_ID"])
print("step 5 val_acc=0.625")
if os.environ["RANK"] == "0":
    entry = {"timestamp": time.time(), "trial": os.environ["CLOUD_ML_TRIAL_ID"],
             "val_acc": "0.625", "global_step": "5", "checkpoint_path": ""}
    with open(os.environ["CLOUD_ML_HP_METRIC_FILE"], "w") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
"""


def test_a_trial_started_by_the_agent_reports_through_both_paths(tmp_path: Path, monkeypatch: Any) -> None:
    """The whole agent side of a trial: job_start's job host puts the trial and the metric
    definitions in the ranks' environment, rank 0's wrapper parses its output, a hypertune file
    lands where CLOUD_ML_HP_METRIC_FILE says, and job_metrics hands both out."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("RIGDECK_CLAIM_DIR", str(tmp_path / "claims"))
    jobs = Jobs(str(tmp_path / "state"), [sys.executable, "-m", "agent"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plan = {"job_id": "trial-1", "name": "t", "launcher": "direct", "command": [sys.executable, "-c", TRIAL_RANK],
            "workdir": str(tmp_path), "env": {}, "restart_count": 0, "max_runtime_s": 120, "grace_s": 5,
            "nodes": [{"host": "local", "address": "127.0.0.1", "slots": 2, "gpus": []}], "node_index": 0,
            "master_addr": "127.0.0.1", "master_port": port,
            "trial": "5", "sweep_id": "sw-1",
            "metric_definitions": [{"name": "val_acc", "regex": r"val_acc=([0-9.]+)"}]}
    jobs.start(plan)
    deadline = time.monotonic() + 60
    while jobs.status("trial-1")["state"] not in TERMINAL:
        assert time.monotonic() < deadline, "the trial did not end"
        time.sleep(0.1)
    jobs.reap()
    d = Path(jobs.job_dir("trial-1"))
    assert jobs.status("trial-1")["state"] == "succeeded", (d / "launcher.log").read_text()
    assert (d / "logs" / "rank-1.log").read_text().splitlines()[0] == "trial 5 5 sw-1"
    parts = jobs.metrics("trial-1", {})
    assert set(parts) == {"0/defs", "0/hypertune"}  # no loss printed; rank 1's output not parsed
    assert [(r["rank"], r["step"], r["val_acc"]) for r in parts["0/defs"]["records"]] == [(0, 5, 0.625)]
    assert [(r["rank"], r["step"], r["val_acc"], r["trial"]) for r in parts["0/hypertune"]["records"]] == [
        (0, 5, 0.625, "5")]


def test_job_hosts_and_rank_wrappers_start_without_site_only_from_the_zipapp(tmp_path: Path) -> None:
    """They need only the standard library; a source tree may be importable only through site."""
    from agent.jobhost import no_site

    assert no_site(["/usr/bin/python3", "/s/agent/ab12/agent.pyz"]) == [
        "/usr/bin/python3", "-S", "/s/agent/ab12/agent.pyz"]
    assert no_site(["/usr/bin/python3", "-m", "agent"]) == ["/usr/bin/python3", "-m", "agent"]
    unpacked = tmp_path / "unpacked"  # the zipapp's byte-compiled copy runs without site too
    (unpacked / "agent").mkdir(parents=True)
    (unpacked / "__main__.py").write_text("")
    assert no_site(["/usr/bin/python3", str(unpacked)]) == ["/usr/bin/python3", str(unpacked)]
    (unpacked / "agent" / "BUILD.json").write_text("{}")
    assert no_site(["/usr/bin/python3", str(unpacked)]) == ["/usr/bin/python3", "-S", str(unpacked)]


def test_a_master_port_is_probed_outside_the_ephemeral_range_and_never_handed_out_twice(tmp_path) -> None:
    """A port in the kernel's range for outgoing connections can be taken by another job's mesh
    between the probe and the rank's bind (seen as gloo's EADDRINUSE on a busy host)."""
    import random

    from agent.jobs import ephemeral_range, port_candidates, probe_port

    rng_file = tmp_path / "range"
    rng_file.write_text("32768\t60999\n")
    assert ephemeral_range(str(rng_file)) == (32768, 60999)
    rng_file.write_text("garbage")
    assert ephemeral_range(str(rng_file)) == (32768, 60999)
    rng_file.write_text("40000 50000")
    assert ephemeral_range(str(rng_file)) == (40000, 50000)

    ports = port_candidates((32768, 60999), count=500, rng=random.Random(1))
    assert all(not 32768 <= p <= 60999 for p in ports) and all(1024 < p <= 65535 for p in ports)
    # a range that leaves no room below uses the ports above it
    assert all(p > 60999 for p in port_candidates((1024, 60999), count=50, rng=random.Random(2)))
    assert port_candidates((1024, 65535)) == []

    lo, hi = ephemeral_range()
    handed = [probe_port("127.0.0.1") for _ in range(40)]
    assert len(set(handed)) == len(handed)
    assert not any(lo <= p <= hi for p in handed)
    # what it hands out is bindable
    with socket.socket() as s:
        s.bind(("127.0.0.1", handed[-1]))


def test_a_restarts_claim_waits_for_its_own_earlier_attempt_and_names_who_holds_anyone_elses(
        tmp_path: Path, monkeypatch: Any) -> None:
    """A restart can come while the earlier attempt's last process is still exiting (seen on the
    bed: a restart after a hang refused by the claim of its own first attempt); the claim waits
    for it. Another job's claim is refused at once, naming the processes that hold it open."""
    cdir = tmp_path / "claims"
    monkeypatch.setenv("RIGDECK_CLAIM_DIR", str(cdir))
    jobs, _ = _job(tmp_path, "j1")
    # An untagged holder (the earlier attempt's job host, which carries no job tag) leaving in 1.5 s
    code = ("import sys, time; from agent import claims; fds = claims.claim([0], sys.argv[1]); "
            "print('held', flush=True); time.sleep(float(sys.argv[2]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    leaving = subprocess.Popen([sys.executable, "-c", code, "j1", "1.5"], stdout=subprocess.PIPE, text=True, env=env)
    staying = None
    try:
        assert leaving.stdout is not None and leaving.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        assert jobs.claim("j1", [0]) == {"claimed": [0]}
        assert 0.5 < time.monotonic() - t0 < 9
        jobs.release("j1")
        staying = subprocess.Popen([sys.executable, "-c", code, "other", "30"], stdout=subprocess.PIPE, text=True,
                                   env=env)
        assert staying.stdout is not None and staying.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        from agent.jobs import JobError

        with pytest.raises(JobError, match=rf"held by job other .*; held open by pid {staying.pid} \(.*claims"):
            jobs.claim("j1", [0])
        assert time.monotonic() - t0 < 2
    finally:
        leaving.kill()
        if staying is not None:
            staying.kill()


def test_the_job_watcher_may_rest_only_while_no_job_is_live(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)  # one ended job
    assert not jobs.quiet()  # nothing looked at yet
    jobs.supervise()
    assert jobs.quiet()
    (d / "state.json").write_text(json.dumps({"job_id": "j1", "state": "running"}))
    jobs.supervise()
    assert not jobs.quiet()  # a live job: looked at every second
    (d / "state.json").write_text(json.dumps({"job_id": "j1", "state": "failed"}))
    jobs.supervise()
    assert jobs.quiet()


HEALING_RANK = """
import os, sys, time
import runtime
attempt, rank = int(os.environ["RIGDECK_RESTART_COUNT"]), int(os.environ["RIGDECK_RANK"])
if os.environ.get("HEAL_TOKEN") != "s3cret":  # its env_from_file value, in every attempt
    sys.exit(7)
saved = os.path.join(os.environ["RIGDECK_JOB_DIR"], "saved")
start = int(open(saved).read()) + 1 if attempt and os.path.exists(saved) else 1
if rank == 0 and start > 1:
    print("resumed from step", start - 1, flush=True)
for step in range(start, 7):
    if attempt == 0 and step == 4:
        while not os.path.exists(saved):  # as in a collective: no rank runs ahead of rank 0's save
            time.sleep(0.05)
        if rank == 1 and sys.argv[1] == "exit":
            os._exit(3)
        while True:  # its peer waits for it, as in a collective; or (a hang) no rank goes on
            time.sleep(0.1)
    runtime.report(step=step, loss=1.0 / step)
    if rank == 0 and step == 2:
        with open(saved + ".tmp", "w") as f:
            f.write("2")
        os.replace(saved + ".tmp", saved)
    time.sleep(0.05)
"""


@pytest.mark.parametrize("fault,restarts_left", [("exit", 1), ("hang", 1), ("exit", 0)],
                         ids=["exit", "hang", "no-restart-left"])
def test_a_job_of_one_host_heals_in_place_with_nobody_watching(
        tmp_path: Path, monkeypatch: Any, fault: str, restarts_left: int) -> None:
    """The plan says its host heals it (``heal``): a rank's failure or a hang, judged by the job
    host, is followed by the next attempt started there, from the rank's checkpoint, with no
    controller at all; the incident is kept in state.json's ``heals`` for the controller that
    looks next. With no restart left it fails as before."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("RIGDECK_CLAIM_DIR", str(tmp_path / "claims"))
    jobs = Jobs(str(tmp_path / "state"), [sys.executable, "-m", "agent"])
    plan = {"job_id": "heal-1", "name": "h", "launcher": "direct",
            "command": [sys.executable, "-c", HEALING_RANK, fault], "workdir": str(tmp_path), "env": {},
            "restart_count": 0, "max_runtime_s": 120, "grace_s": 5,
            "nodes": [{"host": "local", "address": "127.0.0.1", "slots": 2, "gpus": []}], "node_index": 0,
            "master_addr": "127.0.0.1", "master_port": 29400,
            "health": {"hang_timeout": 2.0, "startup_timeout": None, "on_hang": "restart"},
            "heal": {"by": "host", "restarts_left": restarts_left, "on_exit_codes": []},
            "env_file": {"names": ["HEAL_TOKEN"], "values": {"HEAL_TOKEN": "s3cret"}}}
    jobs.start(plan)
    deadline = time.monotonic() + 90
    while jobs.status("heal-1")["state"] not in TERMINAL:
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.2)
    jobs.reap()
    d = Path(jobs.job_dir("heal-1"))
    st = jobs.status("heal-1")
    if not restarts_left:
        assert (st["state"], st["restart_count"], st.get("heals")) == ("failed", 0, None), st
        assert (st["cause"]["rank"], st["cause"]["exit_code"]) == (1, 3)
        return
    assert (st["state"], st["restart_count"]) == ("succeeded", 1), (st, (d / "jobhost.log").read_text())
    (heal,) = st["heals"]
    assert (heal["attempt"], heal["kind"], heal["host"]) == (0, fault, "local")
    if fault == "exit":
        assert (heal["rank"], heal["exit_code"], heal["message"]) == (1, 3, "rank 1 exited 3")
    else:
        assert heal["message"].startswith("hung: no rank reported a step after step 3 for ")
        assert heal["message"].endswith(" s (hang_timeout 2 s)"), heal["message"]
        assert {s["rank"] for s in heal["stacks"]} == {0, 1}
    assert heal["detected_at"] <= heal["stopped_at"] <= heal["started_at"] <= heal["resumed_at"]
    assert json.loads((d / "plan.json").read_text())["restart_count"] == 1
    assert "resumed from step 2" in (d / "logs" / "rank-0.log").read_text()
    records = _read(jobs, {}, "heal-1")
    newest = {(r["rank"], r["step"]): r["restart"] for r in records if r.get("step") is not None}
    assert newest == {(r, s): 0 if s < 3 else 1 for r in (0, 1) for s in range(1, 7)}


WAITING_RANK = """
import os, sys, time
import runtime
go = os.path.join(os.environ["RIGDECK_JOB_DIR"], "go")
for step in range(1, 40):
    if step == 8:
        while not os.path.exists(go):  # waits asleep, as in a collective whose peer is lost
            time.sleep(1.0)  # (a look that finds a rank running, as it wakes, counts it awake)
    runtime.report(step=step, loss=1.0 / step)
    time.sleep(0.05)
"""


def test_a_host_of_a_job_of_several_says_when_its_ranks_wait_asleep_with_their_stacks(
        tmp_path: Path, monkeypatch: Any) -> None:
    """This host runs part of the job: when every rank here has waited asleep with no step for
    part of the quiet timeout, it says so in ``idle`` (for the controller's hang and lost-host
    rules), with the ranks' stacks taken then, and judges no hang itself; each answer counts the
    time since; a step clears it."""
    from agent import hangrule

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("RIGDECK_CLAIM_DIR", str(tmp_path / "claims"))
    jobs = Jobs(str(tmp_path / "state"), [sys.executable, "-m", "agent"])
    plan = {"job_id": "part-1", "name": "p", "launcher": "direct",
            "command": [sys.executable, "-c", WAITING_RANK], "workdir": str(tmp_path), "env": {},
            "restart_count": 0, "max_runtime_s": 120, "grace_s": 5,
            "nodes": [{"host": "local", "address": "127.0.0.1", "slots": 2, "gpus": []},
                      {"host": "other", "address": "10.9.9.9", "slots": 1, "gpus": []}], "node_index": 0,
            "master_addr": "127.0.0.1", "master_port": 29400,
            "health": {"hang_timeout": None, "startup_timeout": None, "on_hang": "restart"}}
    jobs.start(plan)
    d = Path(jobs.job_dir("part-1"))
    try:
        deadline = time.monotonic() + 60
        while not isinstance(jobs.status("part-1").get("idle"), dict):
            assert time.monotonic() < deadline, (d / "jobhost.log").read_text()
            time.sleep(0.1)
        said = json.loads((d / "state.json").read_text())["idle"]
        share = hangrule.QUIET_SAY_SHARE * said["timeout_s"]
        assert said["timeout_s"] == hangrule.QUIET_FLOOR_S and said["last_step"] == 7 and said["basis"] == "quiet"
        assert share <= said["asleep_s"] <= said["stalled_s"] < said["timeout_s"], said
        assert {s["rank"] for s in said["stacks"]} == {0, 1}
        assert all(not s["in_collective"] and "<module>" in s["top"] for s in said["stacks"]), said["stacks"]
        time.sleep(1.0)
        later = jobs.status("part-1")["idle"]  # the agent counts on from when it was said
        assert later["asleep_s"] >= said["asleep_s"] + 0.9 and later["stalled_s"] >= said["stalled_s"] + 0.9
        time.sleep(hangrule.QUIET_FLOOR_S)
        st = jobs.status("part-1")
        assert st["state"] == "running" and st.get("hang") is None  # the others are not seen: not its to judge
        assert isinstance(st.get("idle"), dict) and st["idle"]["stacks"] == said["stacks"]  # said once
        (d / "go").write_text("")
        deadline = time.monotonic() + 30
        while jobs.status("part-1").get("idle") is not None:
            assert time.monotonic() < deadline, "idle not cleared after the steps went on"
            time.sleep(0.1)
        assert "rigdeck: Python stacks of rank 1" in (d / "logs" / "rank-1.log").read_text()
    finally:
        jobs.stop("part-1", grace_s=1.0)
        deadline = time.monotonic() + 30
        while jobs.status("part-1")["state"] not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.2)
        jobs.reap()


def test_a_job_its_host_heals_is_told_its_bad_gpus_and_the_hosts_spares_when_they_change(tmp_path: Path) -> None:
    """gpu-health.json (agent/jobs.py ``tell_gpu_health``): the job's GPUs that are not ok, and
    the host's spare GPUs its job host may move ranks to; written first, then only on a change."""
    jobs = Jobs(str(tmp_path / "state"), [sys.executable, "-m", "agent"])
    path = Path(jobs.job_dir("j1")) / "gpu-health.json"
    path.parent.mkdir(parents=True)
    bad = [{"index": 1, "health": "unhealthy", "reason": "XID 79", "simulated": True},
           {"index": 2, "health": "unhealthy", "reason": "ECC", "simulated": True}]
    jobs.tell_gpu_health({"j1": [0, 1]}, [], [2, 3])
    assert json.loads(path.read_text())["spare"] == [2, 3] and json.loads(path.read_text())["gpus"] == []
    path.write_text(json.dumps({**json.loads(path.read_text()), "mark": 1}))
    jobs.tell_gpu_health({"j1": [0, 1]}, [], [2, 3])
    assert json.loads(path.read_text())["mark"] == 1  # nothing changed: not written
    jobs.tell_gpu_health({"j1": [0, 1]}, bad, [3])
    told = json.loads(path.read_text())
    assert (told["gpus"], told["spare"], "mark" in told) == ([bad[0]], [3], False)
    # a first judgment of nothing wrong and no spare is written too: the job host (and whoever
    # waits on it) knows the daemon has looked
    other = Path(jobs.job_dir("j2")) / "gpu-health.json"
    other.parent.mkdir(parents=True)
    jobs.tell_gpu_health({"j2": [0]}, [], [])
    assert (json.loads(other.read_text())["gpus"], json.loads(other.read_text())["spare"]) == ([], [])


MOVING_RANK = """
import os, sys, time
import runtime
attempt, d = int(os.environ["RIGDECK_RESTART_COUNT"]), os.environ["RIGDECK_JOB_DIR"]
print("attempt", attempt, "on GPU", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
saved = os.path.join(d, "saved")
start = int(open(saved).read()) + 1 if attempt and os.path.exists(saved) else 1
if start > 1:
    print("resumed from step", start - 1, flush=True)
for step in range(start, 6):
    if step == 3 and attempt == 0 or step == 5 and not os.path.exists(os.path.join(d, "go")):
        while not os.path.exists(os.path.join(d, "go" if attempt else "never")):
            time.sleep(0.1)  # attempt 0: until its GPU fails under it; attempt 1: until the test has looked
    runtime.report(step=step, loss=1.0 / step)
    if step == 2:
        with open(saved + ".tmp", "w") as f:
            f.write("2")
        os.replace(saved + ".tmp", saved)
"""


@pytest.mark.parametrize("spare", [True, False], ids=["spare", "no-spare"])
def test_a_gpu_that_fails_under_a_job_its_host_heals_is_swapped_for_a_free_one_in_place(
        tmp_path: Path, monkeypatch: Any, spare: bool) -> None:
    """The daemon says the job's GPU 1 failed (gpu-health.json) and which of the host's GPUs are
    spare. The job host claims one, skipping a GPU another job took meanwhile (its claim is
    refused), one held out here before and one the controller had drained; its ranks restart
    on it from their checkpoint, the failed GPU's claim is given back and the GPU held out; the
    heal says where the ranks went. With no spare it can claim, it stops the job, claiming and
    holding out nothing, for a controller to move."""
    from agent import gpuhealth

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("RIGDECK_CLAIM_DIR", str(tmp_path / "claims"))
    state = tmp_path / "state"
    jobs = Jobs(str(state), [sys.executable, "-m", "agent"])
    gpuhealth.hold_out(str(state), 0, "ECC", "earlier", "local's job host", 1.0)
    other = claims.claim([2], "other")  # another job, racing for the spare: it has it
    plan = {"job_id": "moving", "name": "m", "launcher": "direct", "command": [sys.executable, "-c", MOVING_RANK],
            "workdir": str(tmp_path), "env": {}, "restart_count": 0, "max_runtime_s": 120, "grace_s": 5,
            "nodes": [{"host": "local", "address": "127.0.0.1", "slots": 1, "gpus": [1]}], "node_index": 0,
            "master_addr": "127.0.0.1", "master_port": 29400,
            "health": {"hang_timeout": 60.0, "startup_timeout": None, "on_hang": "restart"},
            "heal": {"by": "host", "restarts_left": 1, "on_exit_codes": [], "drained": [4]}}
    try:
        jobs.start(plan)
        d = Path(jobs.job_dir("moving"))
        log = d / "logs" / "rank-0.log"

        def wait_for(what: str, ok: Any) -> None:
            deadline = time.monotonic() + 60
            while not ok():
                assert time.monotonic() < deadline, (what, (d / "jobhost.log").read_text())
                time.sleep(0.1)

        wait_for("step 2 saved", lambda: (d / "saved").exists())
        (d / "gpu-health.json").write_text(json.dumps({
            "gpus": [{"index": 1, "health": "unhealthy", "reason": "XID 79: GPU has fallen off the bus",
                      "simulated": True}],
            "spare": [0, 2, 3, 4] if spare else [0, 2, 4], "at": time.time()}))
        if spare:
            wait_for("attempt 1 on GPU 3", lambda: log.exists() and "attempt 1 on GPU 3" in log.read_text())
            held = claims.held()
            assert held is not None and {g: h["job_id"] for g, h in held.items()} == {2: "other", 3: "moving"}
            (d / "go").touch()
        wait_for("the end", lambda: jobs.status("moving")["state"] in TERMINAL)
        jobs.reap()
        st = jobs.status("moving")
        out = (d / "jobhost.log").read_text()
        assert "spare GPU 2 not taken: GPU 2 on" in out and "held by job other" in out
        if not spare:
            assert (st["state"], st["restart_count"], st.get("heals")) == ("failed", 0, None), st
            assert (st["cause"]["kind"], st["cause"]["gpu"]) == ("gpu", 1)
            assert st["cause"]["message"].endswith("stopped here, left to a controller to move")
            assert sorted(gpuhealth.read_held_out(str(state))) == [0]
            assert json.loads((d / "plan.json").read_text())["nodes"][0]["gpus"] == [1]
            return
        assert (st["state"], st["restart_count"]) == ("succeeded", 1), (st, out)
        (heal,) = st["heals"]
        assert (heal["kind"], heal["gpu"], heal["moved"], heal["gpus"]) == ("gpu", 1, {"1": 3}, [3])
        assert heal["message"] == ("local GPU 1 (simulated): XID 79: GPU has fallen off the bus; ranks moved to "
                                   "GPU 3 on local, restart in place")
        assert heal["detected_at"] <= heal["stopped_at"] <= heal["started_at"] <= heal["resumed_at"]
        assert json.loads((d / "plan.json").read_text())["nodes"][0]["gpus"] == [3]
        assert "resumed from step 2" in log.read_text()
        rec = gpuhealth.read_held_out(str(state))[1]
        assert (rec["job_id"], rec["by"], rec["reason"]) == (
            "moving", "local's job host", "XID 79: GPU has fallen off the bus (simulated)")
    finally:
        for fd in other:
            os.close(fd)


@pytest.mark.parametrize("agent", ["same", "restarted"])
def test_a_stop_at_the_moment_of_the_start_stops_the_job_before_any_rank_runs(
        tmp_path: Path, monkeypatch: Any, agent: str) -> None:
    """A stop that reaches the agent before the new job host has recorded its pid (the CI saw a
    job left running by a stop sent right after its start): the agent signals the job host it
    started, and the stop it keeps on disk holds a host it cannot signal (an agent started
    again knows no child), so no rank runs and the job ends stopped, not failed."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    marker = tmp_path / "ran"
    jobs = Jobs(str(tmp_path / "state"), [sys.executable, "-m", "agent"])
    plan = {"job_id": "quick", "name": "q", "launcher": "direct",
            "command": [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').close()", str(marker)],
            "workdir": str(tmp_path), "env": {}, "restart_count": 0, "max_runtime_s": 60, "grace_s": 1,
            "nodes": [{"host": "local", "address": "127.0.0.1", "slots": 1, "gpus": []}], "node_index": 0,
            "master_addr": "127.0.0.1", "master_port": 29400}
    jobs.start(plan)
    assert json.loads(Path(jobs.job_dir("quick"), "state.json").read_text())["jobhost_pid"] is None
    stopper = jobs if agent == "same" else Jobs(str(tmp_path / "state"), [sys.executable, "-m", "agent"])
    stopper.stop("quick", grace_s=0.5)
    deadline = time.monotonic() + 30
    while True:
        jobs.reap()
        st = json.loads(Path(jobs.job_dir("quick"), "state.json").read_text())
        if st["state"] in TERMINAL and all(p.poll() is not None for p in jobs._children.values()):
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.1)
    assert st["state"] == "stopped", st
    assert "stopped by request" in st["cause"]["message"]
    assert not marker.exists(), "a rank ran after the stop"
