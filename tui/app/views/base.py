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
from textual.markup import escape
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static, TabbedContent, TabPane

from tui.app.widgets.difftable import DiffTable
from tui.app.widgets.listfetch import ListFetch
from tui.app.widgets.statictext import update_static
from tui.app.widgets.tables import Widths
from tui.client import Client
from tui.model.hostviews import HostView
from tui.model.jobview import JobSource, JobsSnapshot
from tui.model.slurm import SlurmReadError

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

    def redraw(self) -> None:
        """What it shows changed outside a refresh (a worker's answer): redrawn now if its tab is
        open, else when it next opens."""
        if self.shell.tabs.active == self.ID:
            self.update(self.shell.clock())
        else:
            self.shell.dirty.add(self.ID)

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


R = TypeVar("R", bound="Listed")
D = TypeVar("D", bound="Detailed")


class Listed(Protocol):
    """A row of a fetched list: it has a state (``running``, ``stopping``, ...)."""

    @property
    def state(self) -> str: ...


class Detailed(Protocol):
    """The selected one's detail: it has its row."""

    @property
    def row(self) -> Any: ...


class FetchedView(View, Generic[R, D]):
    """A view of a list from the controller and the selected one's detail (Sweeps, Pipelines).

    Fetched on a worker thread (the group named after the view) about every ``POLL_S`` while the
    view shows, one fetch at a time: a slow or dead controller leaves the last fetched on screen
    and never holds the UI. A fetch (``fetch_items``, a ``ListFetch``) brings the list, the
    selected one's detail, which one that is, and its error."""

    NOUN: ClassVar[str]  # one of the list ("sweep"): the status line and the head say it
    DETAIL_TABLE: ClassVar[str]  # the selected one's table: its cursor goes to the top on a new selection

    def __init__(self) -> None:
        super().__init__()
        self.item_id: str | None = None
        self.item_list: tuple[R, ...] = ()
        self.item_detail: D | None = None
        self.fetch_error: str | None = None
        self.fetch_count = 0  # fetches done (tests wait on it)
        self.inflight = False
        self._again = False

    def key_of(self, row: R) -> str:
        """The id of a row of the list."""
        raise NotImplementedError

    def fetch_items(self, client: Client, selected: str | None) -> ListFetch[R, D]:
        """On the worker thread: the list and the detail of ``selected``; never raises."""
        raise NotImplementedError

    def rows_fetched(self, ids: set[str]) -> None:
        """A fetch brought the list, of these ids (before the selection follows it)."""

    def shown(self) -> None:
        self.poll(soon=True)

    def acted(self) -> None:
        self.poll(soon=True)

    # -- fetching ---------------------------------------------------------------------------

    def poll(self, soon: bool = False) -> None:
        """Fetch the list (and the selected one's detail) on a worker thread, while the view
        shows and no fetch is under way; ``soon``: one more right after the current one (the
        selection changed, a stop was sent)."""
        shell = self.shell
        if shell.closing or shell.tabs.active != self.ID:
            return
        if self.inflight:
            self._again = self._again or soon
            return
        self.inflight = True
        self.app.run_worker(
            lambda sel=self.item_id: self.fetch_items(shell.client, sel),
            thread=True,
            group=self.ID,
            name=self.ID,
            exit_on_error=False,
        )

    def worker_done(self, result: Any, error: str | None = None) -> None:
        fetch: ListFetch[R, D] | None = result
        self.inflight = False
        self.fetch_count += 1
        if self.shell.closing:
            return
        if fetch is None:
            self.fetch_error = error or f"{self.ID}: the fetch failed"
        else:
            self.fetch_error = fetch.error
            if fetch.rows is not None:
                self.item_list = fetch.rows
                ids = {self.key_of(r) for r in fetch.rows}
                self.rows_fetched(ids)
                if self.item_id not in ids:
                    self.item_id = fetch.selected
                    self.item_detail = None
            if fetch.selected == self.item_id:
                if fetch.detail is not None:
                    self.item_detail = fetch.detail
                elif fetch.error is None:
                    self.item_detail = None
            else:
                self._again = True  # the selection moved while this one was fetched
        if self.shell.tabs.active == self.ID:
            self.update(self.shell.clock())
            self.shell.dirty.discard(self.ID)
        if self._again:
            self._again = False
            self.poll()

    # -- what the subclasses draw and act on -------------------------------------------------

    def shown_detail(self) -> D | None:
        """The detail fetched, when it is of the selected one."""
        d = self.item_detail
        return d if d is not None and self.key_of(d.row) == self.item_id else None

    def selected_row(self) -> R | None:
        """The selected one's row: its detail's, else the list's."""
        d = self.shown_detail()
        if d is not None:
            return cast(R, d.row)
        return next((r for r in self.item_list if self.key_of(r) == self.item_id), None)

    def status_text(self, empty: str, hint: str) -> str:
        """The status line: loading, ``empty`` (none yet), or how many and how many run (and the
        keys, ``hint``); the fetch's error over it."""
        rows = self.item_list
        if not self.fetch_count:
            text = f"loading {self.ID}…"
        elif not rows:
            text = empty
        else:
            running = sum(1 for r in rows if r.state in ("running", "stopping"))
            text = f"{len(rows)} {self.NOUN}(s) · {running} running  [$text-muted]({hint})[/]"
        if self.fetch_error:
            text = f"[$error]{escape(self.fetch_error[:300])}[/]" + (
                "  [$text-muted](showing the last fetched)[/]" if rows else ""
            )
        return text

    def head_text(self, detail: D | None, head: Callable[[], str]) -> str:
        """The selected one's head: none selected, loading, or ``head()``."""
        if not self.item_list:
            return f"no {self.NOUN} selected" if self.fetch_count else ""
        if detail is None and self.item_id is not None:
            return f"[b]{escape(self.item_id)}[/b]  [$text-muted]loading…[/]"
        return head()

    def ask_then_act(self, dialog: Screen[Any], notice: str, name: str, fn: Callable[[], str]) -> None:
        """Ask (``dialog``, a yes or no); on yes, say ``notice`` and run ``fn`` as the action
        ``name`` (``Shell.act``)."""

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.notify(notice, title=self.NOUN)
                self.shell.act(name, fn)

        self.shell.dialog(dialog, confirmed)

    def select_item(self, key: str | None) -> None:
        """A row of the list was highlighted: select it, and fetch its detail soon."""
        if key and key != self.item_id:
            self.item_id = key
            self.item_detail = None
            self.update(self.shell.clock())
            self.query_one(self.DETAIL_TABLE, DiffTable).move_cursor(row=0)
            self.poll(soon=True)


class SlurmRead:
    """A view's read of Slurm on the login host (``[slurm]`` inventories): ``read(exec,
    inventory)`` (tui.model.slurm) on a worker thread of the view's group, one at a time and
    never once the app closes; the view's ``worker_done`` hands what came back to ``ended``."""

    def __init__(self, read: Callable[[Any, Any], Any], name: str) -> None:
        self.read, self.name = read, name
        self.busy = False
        self.reads = 0  # reads ended, answered or not (tests wait on it)

    def start(self, view: View) -> None:
        if self.busy or view.shell.closing:
            return
        self.busy = True
        client = view.shell.client

        def run() -> tuple[Any, str | None]:
            try:
                return self.read(client.exec, client.inventory), None
            except SlurmReadError as e:
                return None, str(e)
        view.app.run_worker(run, thread=True, group=view.ID, name=self.name, exit_on_error=False)

    def ended(self, result: Any, error: str | None) -> tuple[Any, str | None]:
        """Slurm's answer (None when there is none) and what kept it from coming."""
        self.busy = False
        self.reads += 1
        return result if result is not None else (None, error)
