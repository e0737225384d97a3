"""Map (8): every GPU of the cluster as one cell, coloured by use, memory or job (the map and its
keys are ``widgets/clustermap.py``'s)."""

from __future__ import annotations

from collections.abc import Sequence

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType

from tui.app.views.base import HOSTS, JOBS, View
from tui.app.widgets.clustermap import ClusterMap, MapPane


class MapView(View):
    ID, KEY, TITLE = "map", "8", "Map"
    HELP_GROUP = "Map view"
    FOLLOWS = frozenset({HOSTS, JOBS})
    FOCUS = "#cluster-map"

    @classmethod
    def help_bindings(cls) -> Sequence[BindingType]:
        return ClusterMap.BINDINGS

    def compose(self) -> ComposeResult:
        yield MapPane(id="map-pane")

    def update(self, now: float) -> None:
        self.query_one("#map-pane", MapPane).apply(self.shell.client.state, self.shell.jobs_snapshot)

    def cursor_host(self) -> str | None:
        return self.query_one("#cluster-map", ClusterMap).cursor_host

    @on(ClusterMap.Selected)
    def _map_selected(self, event: ClusterMap.Selected) -> None:
        """A GPU chosen on the map: its job becomes the open one (Job 4 shows it)."""
        if event.job_id:
            self.shell.select_job(event.job_id)
            self.notify(f"{event.job_id} is the open job: 4 shows it", title="map")


VIEW = MapView
