"""Links to experiment trackers in the app's Job view (issue 34): a "links" panel under the job's
head, one line a link (its tracker, the URL as a hyperlink the terminal opens, the rank and host
that printed it), shown only when there is one. Pilot tests over recorded data
(tests/ui_fixtures.py ``tracker_jobs``), in the app's process and through a server the app
attaches to; then a snapshot. Expected values come from the fixture's constants."""

from __future__ import annotations

from typing import Any

import pytest
from textual.content import Content
from textual.style import Style
from textual.widgets import Static

from tests.ui_fixtures import JOB, MLFLOW_RUN, WANDB_RUN, recorded_app, settle, stop_servers, tracker_jobs
from tui.app.shell import RigdeckApp
from tui.app.views.job import LINKS_SHOWN

SIZE = (120, 36)


@pytest.fixture(params=["embedded", "server"])
def kind(request: pytest.FixtureRequest) -> Any:
    """Each test twice: the controller in the app's process, and a server the app attaches to
    (the links then cross the server's API)."""
    yield request.param
    stop_servers()


async def open_links(app: RigdeckApp, pilot: Any) -> Static:
    """The Job view opened, once its head shows the job: its links panel."""
    await pilot.press("4")
    for _ in range(200):
        await pilot.pause(0.05)
        if JOB in str(app.query_one("#job-head", Static).render()):
            break
    await pilot.pause()
    return app.query_one("#job-links", Static)


def hyperlinks(box: Static) -> list[tuple[str, str]]:
    """(text, link) of each span of the panel that is a hyperlink."""
    content = box.render()
    assert isinstance(content, Content)
    return [(content.plain[s.start:s.end], s.style.link) for s in content.spans
            if isinstance(s.style, Style) and s.style.link]


async def test_job_view_shows_each_tracker_link_once_with_its_rank_and_host(kind: str) -> None:
    app = recorded_app(kind=kind, jobs=tracker_jobs())
    async with app.run_test(size=SIZE) as pilot:
        box = await open_links(app, pilot)
        assert box.display
        lines = [" ".join(ln.split()) for ln in str(box.render()).splitlines()]
        # h2's second MLflow line (rank 3 printed the same run) is not shown again.
        assert lines == [f"wandb {WANDB_RUN} rank 0 on h1", f"mlflow {MLFLOW_RUN} rank 2 on h2"]
        assert hyperlinks(box) == [(WANDB_RUN, WANDB_RUN), (MLFLOW_RUN, MLFLOW_RUN)]


async def test_job_view_shows_no_links_panel_without_links_and_counts_what_it_leaves_out() -> None:
    app = recorded_app(jobs=tracker_jobs(extra=4))
    async with app.run_test(size=SIZE) as pilot:
        box = await open_links(app, pilot)
        text = str(box.render())
        assert len(hyperlinks(box)) == LINKS_SHOWN
        assert text.splitlines()[-1] == f"{2 + 4 - LINKS_SHOWN} more: rigdeck status --json shows every one"
    app = recorded_app()  # the same jobs, no host reporting a link
    async with app.run_test(size=SIZE) as pilot:
        box = await open_links(app, pilot)
        assert not box.display


def test_snapshot_job_view_with_tracker_links(snap_compare: Any) -> None:
    assert snap_compare(recorded_app(jobs=tracker_jobs()), terminal_size=SIZE, run_before=settle("4"))
