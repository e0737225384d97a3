"""What a view of the app is: one tab, everything of it in one module.

A view is the ``TabPane`` of its tab. Its class says how the shell shows it (id, key, title, the
help screen's group, the tables whose columns follow the terminal's width, what to focus when
the tab opens, what state it follows); its instance holds its own state, lays out its pane, and
handles its own keys and events. The shell keeps one list of views (``tui/app/shell.py``) and
derives the tabs, the view keys, the help groups and the refresh from it; a view reaches the
app only through ``Shell``, the part of the app it may use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from textual.app import SystemCommand
from textual.binding import BindingType
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static, TabbedContent, TabPane

from tui.app.widgets.difftable import DiffTable
from tui.app.widgets.statictext import update_static
from tui.app.widgets.tables import Widths
from tui.client import Client
from tui.model.hostviews import HostView
from tui.model.jobview import JobSource, JobsSnapshot

# What a view follows (``FOLLOWS``): when it changes, the view is redrawn the next time it shows.
HOSTS = "hosts"  # the controller's host and GPU state
JOBS = "jobs"  # the jobs snapshot (and the clock's second: runtimes and ages tick)
OPEN_JOB = "job"  # which job is the open one

V = TypeVar("V", bound="View")
T = TypeVar("T")


def set_text(widget: Static, text: str) -> None:
    """Update a Static only when its text changes, and lay the screen out again only when its
    height did (``update_static``)."""
    update_static(widget, text)


class Shell(Protocol):
    """The app as its views see it: what they read and the few things they ask of it."""

    client: Client
    jobwatch: JobSource
    clock: Callable[[], float]
    widths: Widths
    hosts_snapshot: Sequence[HostView]
    jobs_snapshot: JobsSnapshot
    job_id: str | None
    dirty: set[str]  # ids of views to redraw when next shown

    @property
    def tabs(self) -> TabbedContent: ...

    @property
    def closing(self) -> bool: ...

    def refresh_views(self, force: bool = False) -> None: ...

    def select_job(self, job_id: str | None) -> None: ...

    def host_entry(self, name: str) -> HostView | None: ...

    def dialog(self, screen: Screen[Any], then: Callable[[Any], None] | None = None) -> None: ...

    def act(self, name: str, fn: Callable[[], str]) -> None: ...

    def view(self, cls: type[V]) -> V: ...


class View(TabPane):
    """One tab of the app. Subclasses set the class constants and override what they need."""

    ID: ClassVar[str]  # the tab's id; its key binding's id is ``view.ID``
    KEY: ClassVar[str]  # the key that shows it (and the digit in its tab's label)
    TITLE: ClassVar[str]
    HELP_GROUP: ClassVar[str] = ""  # its group on the help screen ("" when it has no keys of its own)
    FOLLOWS: ClassVar[frozenset[str]] = frozenset()  # HOSTS, JOBS, OPEN_JOB
    TABLES: ClassVar[tuple[str, ...]] = ()  # its tables (selectors) whose columns follow the width
    FOCUS: ClassVar[str] = ""  # what gets the focus when its tab opens
    POLL_S: ClassVar[float] = 0.0  # > 0: ``poll`` runs this often (on the app's timer named ID)

    def __init__(self) -> None:
        super().__init__(f"{self.TITLE} {self.KEY}", id=self.ID)

    @property
    def shell(self) -> Shell:
        return cast(Shell, self.app)

    @classmethod
    def help_bindings(cls) -> Sequence[BindingType]:
        """The keys the help screen lists for this view: its own, unless a widget of it holds them."""
        return cls.BINDINGS

    def setup(self) -> None:
        """Once, when the app has mounted (hide what starts hidden, title the borders)."""

    def update(self, now: float) -> None:
        """Redraw from the app's state: the view shows and something it follows changed."""

    def sample(self) -> None:
        """On every refresh while the view shows, whether or not it is due for an update."""

    def shown(self) -> None:
        """Its tab has just been opened (after the refresh and the focus)."""

    def poll(self) -> None:
        """Every ``POLL_S`` seconds, shown or not."""

    def worker_done(self, result: Any, error: str | None = None) -> None:
        """A worker of the group named after the view ended: its result, or what went wrong."""

    def acted(self) -> None:
        """An action (stop, retry, deploy, ...) succeeded: what it changed may show here."""

    def on_escape(self, focused: Widget | None) -> bool:
        """Escape with the focus on ``focused`` (one of this view's boxes): True when handled."""
        return False

    def cursor_host(self) -> str | None:
        """The host under the cursor, where the view has one (deploy, trust, reconnect act on it)."""
        return None

    def cursor_job(self) -> str | None:
        """The job under the cursor, where the view has one (stop acts on it)."""
        return None

    def commands(self) -> Iterable[SystemCommand]:
        """The view's entries in the command palette."""
        return ()

    def set_widths(self, widths: Widths) -> bool:
        """Columns for the terminal's width; True when any table's columns changed."""
        changed = False
        for sel in self.TABLES:
            table = self.query_one(sel, DiffTable)
            if table.set_columns(table.columns_for(widths)):
                changed = True
        return changed


class ViewState(Generic[T]):
    """A view's attribute read (and set) as the app's own (``gpu_sort = ViewState("gpus")`` in
    the app's class): tests and scripts read ``app.sweep_id``, ``app.doctor_runs``, ... from
    before the views had modules of their own."""

    def __init__(self, view: str, attr: str = "") -> None:
        self.view, self.attr = view, attr

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = self.attr or name

    def __get__(self, app: Any, owner: type | None = None) -> T:
        return self if app is None else getattr(app.views[self.view], self.attr)  # type: ignore[return-value]

    def __set__(self, app: Any, value: T) -> None:
        setattr(app.views[self.view], self.attr, value)
