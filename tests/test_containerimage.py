"""The test image's builder (tests/containerimage.py): builders of one recipe take turns, so the
suite's container modules, in different xdist workers on a fresh machine, build it once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests import containerimage


def test_builders_of_one_recipe_at_once_build_it_once_and_all_get_the_archive(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containerimage, "CACHE", tmp_path / "images")
    builds: list[float] = []

    def slow_build(target: Path) -> Path:  # the real one takes minutes: here half a second
        builds.append(time.monotonic())
        time.sleep(0.5)
        target.write_bytes(b"image")
        return target

    monkeypatch.setattr(containerimage, "_build", slow_build)
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(containerimage.build())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(builds) == 1, builds
    assert got == [containerimage.archive()] * 3 and containerimage.archive().read_bytes() == b"image"
    # cached: a later builder neither builds nor waits
    assert containerimage.build() == containerimage.archive() and len(builds) == 1


def test_a_builder_that_failed_leaves_no_archive_and_the_next_one_builds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containerimage, "CACHE", tmp_path / "images")
    calls: list[int] = []

    def fails_once(target: Path) -> Path:
        calls.append(1)
        if len(calls) == 1:
            raise SystemExit("mmdebstrap failed")
        target.write_bytes(b"image")
        return target

    monkeypatch.setattr(containerimage, "_build", fails_once)
    with pytest.raises(SystemExit):
        containerimage.build()
    assert not containerimage.archive().exists()
    assert containerimage.build() == containerimage.archive() and len(calls) == 2
