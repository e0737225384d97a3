"""The agent's job files, read back: metrics offsets per source (metrics file vs. parsed stdout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.jobs import Jobs


def _job(tmp_path: Path) -> tuple[Jobs, Path]:
    jobs = Jobs(str(tmp_path / "state"), ["agent"])
    d = Path(jobs.job_dir("j1"))
    (d / "logs").mkdir(parents=True)
    (d / "metrics").mkdir()
    (d / "plan.json").write_text(json.dumps({"job_id": "j1"}))
    return jobs, d


def _read(jobs: Jobs, offsets: dict[str, int]) -> list[dict[str, Any]]:
    """One reader's pass, keeping offsets the way the controller does."""
    out = []
    while True:
        chunk = jobs.metrics("j1", offsets, max_bytes=64)
        more = False
        for rank, part in chunk.items():
            out += [{**r, "source": part["source"], "rank": int(rank)} for r in part["records"]]
            offsets[part["offset_key"]] = part["next_offset"]
            more = more or part["more"]
        if not more:
            return out


def test_stdout_loss_then_metrics_file_each_read_from_its_own_offset(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    log = d / "logs" / "rank-0.log"
    log.write_text("starting\nstep 1 loss=2.5\nstep 2 loss: 2.25\n")
    offsets: dict[str, int] = {}
    first = _read(jobs, offsets)
    assert [(r["step"], r["loss"], r["source"]) for r in first] == [
        (1, 2.5, "stdout"),
        (2, 2.25, "stdout"),
    ]
    assert set(offsets) == {"0/stdout"}
    assert offsets["0/stdout"] == log.stat().st_size

    # The rank's runtime starts its metrics file: it is read from its first byte, although the
    # reader's stdout offset is already far past that.
    lines = [json.dumps({"step": s, "loss": 3.0 - s / 10, "time": 100.0 + s}) for s in range(3, 9)]
    (d / "metrics" / "rank-0.jsonl").write_text("\n".join(lines) + "\n")
    with log.open("a") as f:
        f.write("step 3 loss=2.7\n")
    second = _read(jobs, offsets)
    assert [(r["step"], r["source"]) for r in second] == [(s, "metrics") for s in range(3, 9)]
    assert offsets["0"] == (d / "metrics" / "rank-0.jsonl").stat().st_size
    assert _read(jobs, offsets) == []  # nothing again


def test_each_rank_has_its_own_offsets(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    (d / "logs" / "rank-0.log").write_text("loss=1.0\n")
    (d / "logs" / "rank-1.log").write_text("noise\n")
    (d / "metrics" / "rank-1.jsonl").write_text(json.dumps({"step": 0, "loss": 9.0}) + "\n")
    offsets: dict[str, int] = {}
    got = sorted((r["rank"], r["loss"], r["source"]) for r in _read(jobs, offsets))
    assert got == [(0, 1.0, "stdout"), (1, 9.0, "metrics")]
    assert set(offsets) == {"0/stdout", "1"}


def _read_logs(jobs: Jobs, rank: int, offset: int, max_bytes: int) -> tuple[list[str], int]:
    """Every chunk a reader gets from ``offset`` on, until the agent says nothing more waits."""
    texts = []
    while True:
        chunk = jobs.logs("j1", rank, offset, max_bytes=max_bytes)
        assert chunk["offset"] == offset
        if chunk["text"]:
            texts.append(chunk["text"])
        assert chunk["next_offset"] >= offset
        if chunk["next_offset"] == offset and not chunk["more"]:
            return texts, offset
        assert chunk["next_offset"] > offset, "the reader is stuck"
        offset = chunk["next_offset"]


def test_a_line_longer_than_a_chunk_comes_in_pieces_cut_between_characters(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    log = d / "logs" / "rank-0.log"
    bar = "".join(f"\r{i:3d}% |{'█' * (i // 5)}é" for i in range(100))  # a redrawn progress bar
    log.write_bytes(("start\n" + bar + "\nstep 1 loss=0.5\n").encode())
    texts, offset = _read_logs(jobs, 0, 0, max_bytes=61)
    assert offset == log.stat().st_size
    assert "".join(texts) == log.read_bytes().decode()
    assert len(texts) > 10 and not any("\ufffd" in t for t in texts)  # no character was cut


def test_an_unterminated_last_line_comes_once_its_rank_has_ended(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    log = d / "logs" / "rank-0.log"
    log.write_text("epoch 1 loss=0.5\nepoch 2 loss=0.4\nfinal loss=0.3")  # no newline at the end
    texts, offset = _read_logs(jobs, 0, 0, max_bytes=1024)
    assert texts == ["epoch 1 loss=0.5\nepoch 2 loss=0.4\n"]  # the rank may still finish the line
    before = _read(jobs, {})
    assert [r["loss"] for r in before] == [0.5, 0.4]

    (d / "ranks").mkdir()
    (d / "ranks" / "rank-0.exit.json").write_text(json.dumps({"rank": 0, "exit_code": 0}))
    rest, end = _read_logs(jobs, 0, offset, max_bytes=1024)
    assert rest == ["final loss=0.3"] and end == log.stat().st_size
    whole, _ = _read_logs(jobs, 0, 0, max_bytes=1024)
    assert whole == [log.read_text()]  # an ended rank's log comes whole, in one chunk
    assert _read_logs(jobs, 0, end, max_bytes=1024) == ([], end)  # and only once
    assert [r["loss"] for r in _read(jobs, {})] == [0.5, 0.4, 0.3]


def test_loss_and_step_are_read_from_coloured_output(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    (d / "logs" / "rank-0.log").write_text(
        "\x1b[32mstep 7\x1b[0m loss=\x1b[1m0.25\x1b[0m\n"
        "\x1b[2m12:00:01\x1b[0m INFO iter: 8 | 'loss': 0.125\n"
    )
    assert [(r["step"], r["loss"]) for r in _read(jobs, {})] == [(7, 0.25), (8, 0.125)]


def test_loss_lines_without_a_step_are_numbered_in_order_for_every_reader(tmp_path: Path) -> None:
    jobs, d = _job(tmp_path)
    log = d / "logs" / "rank-0.log"
    log.write_text("".join(f"epoch={e} loss={1 / (e + 1):.4f}\n" for e in range(10)) + "step 50 loss=0.01\n")
    offsets: dict[str, int] = {}
    first = _read(jobs, offsets)  # 64-byte chunks: several replies
    assert [r["step"] for r in first] == [*range(10), 50]
    assert all(r.get("counted") for r in first[:10]) and "counted" not in first[10]

    # More output, read by a reader that kept its offset, from a restarted agent (no memory of
    # the offsets it handed out): the count goes on where it was.
    with log.open("a") as f:
        f.write("loss: 0.009\nloss: 0.008\n")
    again = Jobs(str(tmp_path / "state"), ["agent"])
    more = []
    while True:
        chunk = again.metrics("j1", offsets, max_bytes=64)["0"]
        more += chunk["records"]
        offsets[chunk["offset_key"]] = chunk["next_offset"]
        if not chunk["more"]:
            break
    assert [(r["step"], r["loss"]) for r in more] == [(11, 0.009), (12, 0.008)]
    assert [r["step"] for r in _read(jobs, {})] == [*range(10), 50, 11, 12]  # a new reader: the same
