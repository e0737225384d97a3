"""The cluster map: every GPU of every host at once, one coloured cell each, hosts packed many
to a line (512 hosts x 8 GPUs fit a 200x60 terminal), with the GPU under the cursor and a
per-user summary beside it.

One widget draws the whole map through the Line API: each host's block (label and cells) is
rendered to segments when its view, its holders or the cursor on it change, lines are joined
from the blocks, and ``render_line`` hands out the joined lines. 4,096 GPUs are 512 cached
blocks and ~50 strips, not 4,096 widgets. What the cells mean (holders, job colours, the
per-user counts, the cursor's moves) comes from ``tui.model.gpumap``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.geometry import Region, Size
from textual.markup import escape
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

from tui.app.widgets.format import (
    MEM_THRESHOLDS,
    PLAIN,
    SPARK,
    level,
    power_cell,
    size_mb,
    state_markup,
    util_level,
)
from tui.app.widgets.release import release_after_frame
from tui.app.widgets.statictext import update_static
from tui.model.gpumap import (
    FREE,
    MODE_LABELS,
    MODES,
    Grid,
    Holder,
    Summary,
    assign_slots,
    grid_for,
    holders,
    host_label,
    live_placements,
    move,
    user_summary,
)
from tui.model.hostviews import BUSY_UTIL_PCT, GpuView, HostView
from tui.model.jobview import JobsSnapshot

JOB_SLOTS = 12  # distinct job colours (theme variables, see DEFAULT_CSS)
FREE_GLYPH = "·"
FOREIGN_GLYPH = "▒"
SLURM_GLYPH = "▚"  # a GPU Slurm allocated to a job (someone else's, not rigdeck's)
JOB_GLYPH = "█"
UNHEALTHY_GLYPH = "✗"  # a GPU its agent calls unhealthy (agent/gpuhealth.py)
DRAINED_GLYPH = "⊘"  # a GPU kept out of placement (rigdeck drain, or after a fault)
DOWN_GLYPH = "×"
CURSOR_BLOCK = "▓"
_LEVELS = ("ok", "warn", "crit", "muted", "dim", "down", "label", "stale", "cursor", "here", "foreign",
           "slurm")
# A theme has about six colours and a map of many jobs needs a dozen it can tell apart: these
# (Okabe and Ito's colour-blind-safe set, then more of the same lightness) read on dark and
# light backgrounds alike. Everything else on the map takes the theme's variables.
_JOB_COLOURS = (
    "#E69F00",
    "#56B4E9",
    "#009E73",
    "#F0E442",
    "#0072B2",
    "#D55E00",
    "#CC79A7",
    "#9467BD",
    "#17BECF",
    "#BCBD22",
    "#8C564B",
    "#AEC7E8",
)


def _spark(fraction: float) -> str:
    return SPARK[min(len(SPARK) - 1, max(0, round(fraction * (len(SPARK) - 1))))]


def _util_look(pct: int) -> tuple[str, str]:
    lvl = util_level(pct)
    return _spark(pct / 100.0), "ok" if lvl == "muted" else lvl


# (glyph, style name) by whole percent: a cell costs a lookup, not a computation.
_UTIL_LOOK = tuple(_util_look(p) for p in range(101))
_MEM_LOOK = tuple((_spark(p / 100.0), level(p, MEM_THRESHOLDS)) for p in range(101))
_FREE_LOOK = (FREE_GLYPH, "dim")
_SLURM_LOOK = (SLURM_GLYPH, "slurm")


def cell_look(g: GpuView, who: Holder, mode: str, slot: int | None, stale: bool) -> tuple[str, str]:
    """(glyph, style name) of one GPU's cell in ``mode``; style names are the component
    classes' (``ok``, ``warn``, ``job-3``, ...). Free GPUs are a dim dot in every mode; a failing
    GPU is a red cross and a drained one a barred circle in every mode (they take no work). A GPU
    Slurm allocated to a job is its own glyph in every mode: in the job colours its job's colour,
    in the others Slurm's (it is that job's, however busy)."""
    if g.health == "unhealthy":
        return UNHEALTHY_GLYPH, "stale" if stale else "crit"
    if g.health == "drained":
        return DRAINED_GLYPH, "stale" if stale else "warn"
    if who.slurm:
        if stale:
            return SLURM_GLYPH, "stale"
        return (SLURM_GLYPH, f"job-{slot or 0}") if mode == "job" else _SLURM_LOOK
    if mode == "job":
        if who.job_id is not None:
            return JOB_GLYPH, "stale" if stale else f"job-{slot or 0}"
        if who.foreign:
            return FOREIGN_GLYPH, "stale" if stale else "foreign"
        return FREE_GLYPH, "dim"
    if mode == "memory":
        used, total = g.memory_used_mb, g.memory_total_mb
        if used is None or not total:
            return "?", "muted"
        pct = 100.0 * used / total
        if pct < 1.0 and who.free:
            return FREE_GLYPH, "dim"
        glyph, name = _MEM_LOOK[min(100, max(0, int(pct + 0.5)))]
        return glyph, "stale" if stale else name
    util = g.utilization_pct
    if util is None:
        return "?", "muted"
    if util < BUSY_UTIL_PCT and who.free:
        return FREE_GLYPH, "dim"
    glyph, name = _UTIL_LOOK[min(100, max(0, int(util + 0.5)))]
    return glyph, "stale" if stale else name


def _plain_space(style: Style, ground: Style) -> bool:
    """Whether a space drawn in ``style`` looks as one drawn in ``ground``: the same background,
    nothing that marks a blank cell (a colour, boldness or italics of its own do not)."""
    return style.bgcolor == ground.bgcolor and not (
        style.reverse or style.underline or style.underline2 or style.strike or style.overline
        or style.frame or style.encircle or style.link
    )


class ClusterMap(ScrollView, can_focus=True):
    """Every GPU as a cell; arrows move the cursor, enter selects, ``m`` changes the colours."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("m", "mode", "Colour: util/mem/job", id="map.mode"),
        Binding("enter", "select", "Select", id="map.select", show=False),
        Binding("up", "move('up')", "Up", show=False),
        Binding("down", "move('down')", "Down", show=False),
        Binding("left", "move('left')", "Left", show=False),
        Binding("right", "move('right')", "Right", show=False),
        Binding("home", "move('home')", "First", show=False),
        Binding("end", "move('end')", "Last", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {f"map--{lvl}" for lvl in _LEVELS} | {
        f"map--job-{i}" for i in range(JOB_SLOTS)
    }
    DEFAULT_CSS = (
        """
    ClusterMap { background: $surface; scrollbar-size-vertical: 1; }
    ClusterMap > .map--ok { color: $success; }
    ClusterMap > .map--warn { color: $warning; }
    ClusterMap > .map--crit { color: $error; text-style: bold; }
    ClusterMap > .map--muted { color: $text-muted; }
    ClusterMap > .map--dim { color: $text-disabled; }
    ClusterMap > .map--stale { color: $text-disabled; }
    ClusterMap > .map--down { color: $error; }
    ClusterMap > .map--label { color: $text-muted; }
    ClusterMap > .map--foreign { color: $warning; }
    ClusterMap > .map--slurm { color: $secondary; text-style: bold; }
    ClusterMap > .map--cursor { background: $foreground; text-style: bold; }
    ClusterMap > .map--here { text-style: bold underline; }
    """
        + "".join(f"ClusterMap > .map--job-{i} {{ color: {v}; }}\n" for i, v in enumerate(_JOB_COLOURS))
    )

    class Selected(Message):
        """A cell was selected (enter or a click): its host, GPU index and job, if any."""

        def __init__(self, host: str, index: int | None, job_id: str | None) -> None:
            super().__init__()
            self.host = host
            self.index = index
            self.job_id = job_id

    class Moved(Message):
        """The cursor moved (the detail panel follows it)."""

    class LaidOut(Message):
        """The map was laid out for a new size (the legend follows: whether it all fits)."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.mode = "util"
        self.hosts: Sequence[HostView] = ()
        self.held: list[tuple[Holder, ...]] = []
        self.slurm_gpus = 0  # GPUs Slurm allocated to its jobs (the legend counts them)
        self.slots: dict[str, int] = {}
        self.summary = Summary((), 0, 0, 0, 0)
        self.cursor = (0, 0)
        self.grid = Grid(0, 1, 1, 4, 1)
        self.builds = 0  # map builds (a new snapshot, mode or size)
        self.renders = 0  # host blocks rendered (tests read both)
        self._blocks: list[tuple[Any, list[Segment]]] = []  # per host: (its key, segments)
        self._lines: list[Strip] = []
        self._styles: dict[str, Style] | None = None
        # (glyph, style name) -> (a cell's text, its style, whether a space in it looks plain)
        self._bodies: dict[tuple[str, str], tuple[str, Style, bool]] = {}
        self._bodies_for: tuple[int, int] | None = None  # for (the styles, glyphs a cell)
        self._names: tuple[str, ...] = ()
        self._line_width = 0
        self._before: tuple[Sequence[HostView], list[tuple[Holder, ...]]] | None = None
        self._placed: dict[tuple[str, int], str] = {}
        self._up: tuple[bool, ...] = ()
        self._ascii_names = False  # every host name one cell a character (lines not measured)

    # -- data -------------------------------------------------------------------------------

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._theme_changed)

    def _theme_changed(self, _theme: object) -> None:
        self._styles = None
        self._blocks = []
        self._build()

    def show(self, snapshot: Sequence[HostView], jobs: JobsSnapshot) -> None:
        """The cluster as ``snapshot`` (hosts with their GPUs) and ``jobs`` have it."""
        placed = live_placements(jobs.rows)
        held = holders(snapshot, placed, self._before if self._placed == placed else None)
        # The last second's snapshot goes once this frame is drawn, not in it.
        release_after_frame(self, self.hosts)
        self._before, self._placed = (snapshot, held), placed
        self.hosts = snapshot
        # The colours and the users' counts follow the holders (and which hosts are up): a
        # second in which no GPU changed hands costs a comparison, not a walk over every GPU.
        up = tuple(h.status == "up" for h in snapshot)
        if held != self.held or up != self._up:
            self.slots = assign_slots(
                self.slots, (w.job_id for hs in held for w in hs if w.job_id is not None), JOB_SLOTS
            )
            self.summary = user_summary(snapshot, held)
            self.slurm_gpus = sum(w.slurm for hs in held for w in hs)
        self.held, self._up = held, up
        self._build()

    def cycle_mode(self) -> None:
        self.mode = MODES[(MODES.index(self.mode) + 1) % len(MODES)]
        self._build()

    # -- the cursor -------------------------------------------------------------------------

    def current(self) -> tuple[HostView, GpuView | None, Holder] | None:
        """The host, GPU (None on a host with none) and holder under the cursor."""
        if not self.hosts:
            return None
        hi, gi = self.cursor
        hi = min(hi, len(self.hosts) - 1)
        h = self.hosts[hi]
        gpus = h.gpus or ()
        if gi < len(gpus):
            held = self.held[hi] if hi < len(self.held) else ()
            return h, gpus[gi], held[gi] if gi < len(held) else FREE
        return h, None, FREE

    @property
    def cursor_host(self) -> str | None:
        cur = self.current()
        return cur[0].name if cur else None

    def move_to(self, host_pos: int, gpu_pos: int) -> None:
        counts = [len(h.gpus or ()) for h in self.hosts]
        if not counts:
            return
        host_pos = min(max(0, host_pos), len(counts) - 1)
        gpu_pos = min(max(0, gpu_pos), max(0, counts[host_pos] - 1))
        if (host_pos, gpu_pos) != self.cursor:
            old = self.cursor
            self.cursor = (host_pos, gpu_pos)
            self._rebuild_hosts({old[0], host_pos})
            self.post_message(self.Moved())
        self._scroll_to_cursor()

    def action_move(self, key: str) -> None:
        counts = [len(h.gpus or ()) for h in self.hosts]
        self.move_to(*move(self.cursor, key, counts, self.grid.per_line))

    def action_mode(self) -> None:
        self.cycle_mode()
        self.post_message(self.Moved())

    def action_select(self) -> None:
        cur = self.current()
        if cur is not None:
            h, g, who = cur
            self.post_message(self.Selected(h.name, None if g is None else g.index, who.job_id))

    def on_click(self, event: events.Click) -> None:
        off = event.get_content_offset(self)
        if off is None:
            return
        hit = self.grid.at(off.x + int(self.scroll_x), off.y + int(self.scroll_y))
        if hit is not None:
            self.move_to(hit[0], hit[1] or 0)
            self.action_select()

    def _scroll_to_cursor(self) -> None:
        line, _ = self.grid.place(self.cursor[0])
        self.scroll_to_region(Region(0, line, 1, 1), animate=False, immediate=True)

    # -- rendering --------------------------------------------------------------------------

    def on_resize(self) -> None:
        self._build()
        # The pane's own resize may have drawn the legend before this one: it says again.
        self.post_message(self.LaidOut())

    @property
    def styles_by_name(self) -> dict[str, Style]:
        """Each component class's style over the map's background, translucent colours (the
        theme's muted and disabled text) blended into it: a cell's segment carries the colour
        the terminal shows."""
        if self._styles is None:
            base = self.rich_style
            bg = self.background_colors[1]
            out = {"": base}
            for name in self.COMPONENT_CLASSES:
                cs = self.get_component_styles(name)
                color = cs.color
                if color.a < 1.0:
                    color = bg.blend(color.with_alpha(1.0), color.a)
                ts = cs.text_style
                back = cs.background
                look = Style(
                    color=color.rich_color if cs.has_rule("color") else None,
                    bgcolor=bg.blend(back.with_alpha(1.0), back.a).rich_color
                    if cs.has_rule("background")
                    else None,
                    bold=True if ts.bold else None,
                    reverse=True if ts.reverse else None,
                    underline=True if ts.underline else None,
                )
                # The cursor only adds to the cell's own look.
                out[name[len("map--"):]] = look if name in ("map--cursor", "map--here") else base + look
            self._styles = out
        return self._styles

    def _build(self) -> None:
        """Lay the hosts out for the current size and (re)render what changed."""
        if not self.is_mounted:
            return
        names = tuple(h.name for h in self.hosts)
        slots = max((len(h.gpus or ()) for h in self.hosts), default=0)
        width = max(1, self.scrollable_content_region.width or self.size.width)
        height = max(1, self.size.height)
        grid = grid_for(names, slots, width, height)
        if grid != self.grid or names != self._names:
            self.grid = grid
            self._names = names
            self._ascii_names = all(n.isascii() and n.isprintable() for n in names)
            self._blocks = []
        self.builds += 1
        self._rebuild_hosts(None)
        self.virtual_size = Size(grid.per_line * grid.block, grid.lines)

    def _host_key(self, pos: int) -> Any:
        """What a host's block shows: its name, status, the cursor on it and each cell's look.
        A block is rendered again only when this changed, not on every sample: a second in
        which a host's numbers moved but none of its cells' glyphs or colours did costs a
        comparison."""
        h = self.hosts[pos]
        cur = self.cursor[1] if self.cursor[0] == pos else -1
        return (h.name, h.status or "connecting", cur, self._looks(pos))

    def _looks(self, pos: int) -> tuple[tuple[str, str], ...]:
        """(glyph, style name) of each of a host's cells (as many as the grid has slots)."""
        h = self.hosts[pos]
        gpus = (h.gpus or ())[: self.grid.slots]
        if h.status == "down":
            return ((DOWN_GLYPH, "down"),) * len(gpus)
        stale = h.status != "up"
        held = self.held[pos] if pos < len(self.held) else ()
        mode, slots = self.mode, self.slots
        if mode == "util" and not stale and len(held) >= len(gpus):
            return tuple(self._util_looks(gpus, held))
        looks = []
        for i, g in enumerate(gpus):
            who = held[i] if i < len(held) else FREE
            looks.append(cell_look(g, who, mode, slots.get(who.job_id) if who.job_id else None, stale))
        return tuple(looks)

    @staticmethod
    def _util_looks(gpus: Sequence[GpuView], held: Sequence[Holder]) -> list[tuple[str, str]]:
        """``cell_look`` in util mode for a host that is up, one GPU after another without a
        call each (4,096 cells a second at 512 x 8)."""
        looks = []
        for g, who in zip(gpus, held, strict=False):
            util = g.utilization_pct
            if g.health in ("unhealthy", "drained") or util is None:
                looks.append(cell_look(g, who, "util", None, False))
            elif who.slurm:
                looks.append(_SLURM_LOOK)
            elif util < BUSY_UTIL_PCT and who.job_id is None and not who.foreign:
                looks.append(_FREE_LOOK)
            else:
                looks.append(_UTIL_LOOK[min(100, max(0, int(util + 0.5)))])
        return looks

    def _render_host(self, pos: int, looks: tuple[tuple[str, str], ...]) -> list[Segment]:
        g_ = self.grid
        st = self.styles_by_name
        h = self.hosts[pos]
        status = h.status or "connecting"
        label_style = st[{"up": "label", "stale": "warn", "down": "down"}.get(status, "muted")]
        cur = self.cursor[1] if self.cursor[0] == pos else -1
        label = host_label(h.name, g_.label)
        if cur >= 0:
            segs = [
                Segment(label, label_style + st["here"]),
                Segment(" " * (g_.label - len(label) + 1), st[""]),
            ]
        else:
            segs = [Segment(label.ljust(g_.label + 1), label_style)]
        width = g_.slots * g_.cell
        if not looks:
            text = {"down": "down", "connecting": "…"}.get(status, "-")
            style = st["down" if status == "down" else "muted"]
            if cur >= 0:
                style = style + st["cursor"]
            segs.append(Segment(text[:width], style))
            segs.append(Segment(" " * (width - len(text[:width])) + " ", st[""]))
            return segs
        pad = width - len(looks) * g_.cell + (1 if g_.cell > 1 else 0)
        segs += self._cell_segments(looks, cur, pad + 1)
        return segs

    def _cell_segments(self, looks: tuple[tuple[str, str], ...], cur: int, tail: int) -> list[Segment]:
        """A host's cells (``cur``: the one under the cursor, or -1) and ``tail`` spaces after
        them, one segment a run of one style. Cells are a space apart (wider than one
        character); a space after a run is drawn in its style when a space looks the same in it
        as on the map's ground (a colour or boldness of its own is no change for a space): a
        segment fewer each for every later step of the frame."""
        st = self.styles_by_name
        reps = max(1, self.grid.cell - 1)
        sep = self.grid.cell > 1
        if self._bodies_for != (id(st), reps):
            self._bodies_for, self._bodies = (id(st), reps), {}
        bodies = self._bodies
        segs: list[Segment] = []
        run_text: list[str] = []
        run_style: Style | None = None
        run_plain = False  # a space in the run's style draws as one in the ground's
        for i, look in enumerate(looks):
            hit = bodies.get(look)
            if hit is None:
                glyph, name = look
                style = st[name]
                hit = bodies[look] = (glyph * reps if reps > 1 else glyph, style, _plain_space(style, st[""]))
            body, style, plain = hit
            if i == cur:  # the cell's colour on a light ground (a full block would hide it)
                style = style + st["cursor"]
                body = body.replace(JOB_GLYPH, CURSOR_BLOCK)
                plain = False
            if run_text and style is not run_style:
                if sep and run_plain:
                    run_text.append(" ")
                segs.append(Segment("".join(run_text), run_style))
                if sep and not run_plain:
                    segs.append(Segment(" ", st[""]))
                run_text = []
            elif sep and run_text:
                run_text.append(" ")
            run_text.append(body)
            run_style, run_plain = style, plain
        if run_plain:
            run_text.append(" " * tail)
        if run_text:
            segs.append(Segment("".join(run_text), run_style))
        if not run_plain:
            segs.append(Segment(" " * tail, st[""]))
        return segs

    def _rebuild_hosts(self, which: set[int] | None) -> None:
        """Render the blocks of the hosts ``which`` (None: every host whose key changed) and
        join the lines they are on again."""
        n = len(self.hosts)
        if len(self._blocks) != n:
            self._blocks = [(None, []) for _ in range(n)]
            which = None
        positions = range(n) if which is None else sorted(p for p in which if 0 <= p < n)
        dirty_lines = set()
        for pos in positions:
            key = self._host_key(pos)
            if self._blocks[pos][0] == key:
                continue
            self._blocks[pos] = (key, self._render_host(pos, key[-1]))
            self.renders += 1
            dirty_lines.add(pos // self.grid.per_line)
        lines = self.grid.lines
        width = self.size.width
        if len(self._lines) != lines or width != self._line_width:
            self._line_width = width
            self._lines = [Strip.blank(0)] * lines
            dirty_lines = set(range(lines))
        for line in dirty_lines:
            self._lines[line] = self._join_line(line, width)
        if dirty_lines:
            self.refresh()

    def _join_line(self, line: int, width: int) -> Strip:
        """A map line from its hosts' blocks, at least ``width`` wide."""
        grid = self.grid
        per = grid.per_line
        blocks = self._blocks[line * per : (line + 1) * per]
        segs: list[Segment] = []
        for _, block in blocks:
            segs.extend(block)
        # Every block is ``grid.block`` cells (its label cut to fit, one cell a glyph): the
        # line's length is known without measuring each segment again. A block's runs are
        # joined already, and one block's last run and the next one's label never share a
        # style: the line is its blocks' segments as they are.
        length = len(blocks) * grid.block if self._ascii_names else None
        strip = Strip(segs, length)
        if strip.cell_length < width:
            strip = strip.adjust_cell_length(width, self.styles_by_name[""])
        return strip

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        base = self.styles_by_name[""]
        pos = scroll_y + y
        if not self.hosts:
            if y == 0:
                return Strip([Segment("no hosts", base)]).adjust_cell_length(width, base)
            return Strip.blank(width, base)
        if pos >= len(self._lines):
            return Strip.blank(width, base)
        strip = self._lines[pos]
        if scroll_x == 0 and strip.cell_length == width:
            return strip  # joined at this width: as it is
        return strip.crop_extend(scroll_x, scroll_x + width, base)

    # -- for tests and the panels -----------------------------------------------------------

    def line_text(self, line: int) -> str:
        """A map line as plain text."""
        return self._lines[line].text if 0 <= line < len(self._lines) else ""

    def cell_at(self, host_pos: int, gpu_pos: int) -> tuple[str, Style | None]:
        """(glyph, style) of a GPU's cell as drawn."""
        x = self.grid.cell_x(host_pos, gpu_pos)
        line = self.grid.place(host_pos)[0]
        strip = self._lines[line]
        cut = list(strip.crop(x, x + 1))
        return (cut[0].text, cut[0].style) if cut else ("", None)


# ---------------------------------------------------------------------------------------------
# The panels beside the map


def legend(mode: str, simulated: int, gpus: int, hosts: int, fits: bool, unhealthy: int = 0,
           drained: int = 0, slurm: int = 0) -> str:
    """The line above the map: what it shows (simulated GPUs said so), what the colours mean,
    and the glyphs of unhealthy and drained GPUs and of those Slurm gave to its jobs, with
    their counts, when there are any."""
    sim = ""
    if simulated:
        sim = " [b]simulated[/b]" if simulated == gpus else f" ({simulated} simulated)"
    keys = {
        "util": f"{FREE_GLYPH} idle  {SPARK[1]}{SPARK[4]}{SPARK[7]} [$success]busy[/] [$warning]≥75%[/]",
        "memory": f"{FREE_GLYPH} empty  {SPARK[1]}{SPARK[4]}{SPARK[7]} [$success]<10%[/] [$warning]≥10%[/] "
                  "[$error]≥80%[/]",
        "job": f"{JOB_GLYPH} a job, one colour each  [$warning]{FOREIGN_GLYPH}[/] no job  {FREE_GLYPH} free",
    }[mode]
    return (
        f"[b]{hosts}[/b] hosts · [b]{gpus}[/b]{sim} GPUs · [b]{MODE_LABELS[mode]}[/b]: "
        f"{keys}  [$error]{DOWN_GLYPH} down[/]"
        + (f"  [$error]{UNHEALTHY_GLYPH} {unhealthy} unhealthy[/]" if unhealthy else "")
        + (f"  [$warning]{DRAINED_GLYPH} {drained} drained[/]" if drained else "")
        + (f"  [$secondary]{SLURM_GLYPH} {slurm} Slurm's jobs[/]" if slurm else "")
        + ("" if fits else "  [$text-muted](scrolls)[/]")
        + "  [$text-muted](m colour · enter select)[/]"
    )


def gpu_detail(h: HostView, g: GpuView | None, who: Holder, jobs: JobsSnapshot) -> str:
    """The GPU under the cursor in full, and its job."""
    status = h.status or "connecting"
    lvl = state_markup(status)
    head = f"[b]{escape(h.name)}[/b] [{lvl}]{status}[/]"
    if g is None:
        lines = [head, "no GPU known"]
        if h.reason:
            lines.append(f"[$error]{escape(str(h.reason))}[/]")
        return "\n".join(lines)
    sim = " [$text-muted](simulated)[/]" if g.simulated else ""
    lines = [f"{head} · GPU [b]{g.index}[/b]{sim}", escape(g.name or "-")]
    if g.health != "ok":
        look = {"unhealthy": "$error", "drained": "$warning", "warn": "$warning"}.get(g.health, "$text-muted")
        why = f": {escape(g.health_reason)}" if g.health_reason else ""
        lines.append(f"[{look}]{escape(g.health)}{why}[/]")
    util = "-" if g.utilization_pct is None else f"{g.utilization_pct:.0f}%"
    used, total = g.memory_used_mb, g.memory_total_mb
    mem = "-" if used is None or not total else f"{size_mb(used)}/{size_mb(total)} ({100.0 * used / total:.0f}%)"
    lines.append(f"util [b]{util}[/b] · mem [b]{mem}[/b]")
    temp = "-" if g.temperature_c is None else f"{g.temperature_c:.0f}°C"
    lines.append(f"temp {temp} · power {escape(power_cell(g.power_w, g.power_limit_w, PLAIN).plain)}")
    if status != "up":
        lines.append("[$warning]last known values: the host is not up[/]")
    if who.slurm:
        lines.append(f"[$secondary]{escape(who.job_id or 'slurm job ?')}, user {escape(who.user or '?')}[/]")
        lines.append("[$text-muted]allocated by Slurm: rigdeck never places on it[/]")
    elif who.job_id is not None:
        row = jobs.row(who.job_id)
        name = f" ({escape(row.name)}, {escape(row.state)})" if row is not None else ""
        lines.append(f"job [b]{escape(who.job_id)}[/b]{name}")
        ranks = sorted({p.rank for p in g.processes if p.job_id == who.job_id and p.rank is not None})
        user = escape(who.user or "?")
        lines.append(f"user [b]{user}[/b]" + (f" · rank {','.join(map(str, ranks))}" if ranks else ""))
    elif who.foreign:
        pids = ",".join(str(p.pid) for p in g.processes if not p.job_id)
        lines.append(f"[$warning]no job: {escape(who.user or '?')}'s process (pid {pids})[/]")
    else:
        lines.append("[$text-muted]free[/]")
    return "\n".join(lines)


def users_text(summary: Summary, jobs: JobsSnapshot, max_jobs: int = 4) -> str:
    """Who holds how many GPUs, in which jobs."""
    s = summary
    lines = [
        f"[b]GPUs by user[/b]  {s.held} held · {s.free} free"
        + (f" · [$error]{s.unreachable} unreachable[/]" if s.unreachable else "")
    ]
    if not s.users:
        lines.append("[$text-muted]nobody holds a GPU[/]")
    for u in s.users:
        lines.append(f"[b]{escape(u.user)}[/b] {u.gpus} GPU{'s' if u.gpus != 1 else ''}")
        for job_id, n in u.jobs[:max_jobs]:
            row = jobs.row(job_id)
            name = f" {escape(row.name)}" if row is not None else ""
            lines.append(f"  {n:>4} {escape(job_id)}[$text-muted]{name}[/]")
        if len(u.jobs) > max_jobs:
            rest = sum(n for _, n in u.jobs[max_jobs:])
            lines.append(f"  {rest:>4} [$text-muted]in {len(u.jobs) - max_jobs} more job(s)[/]")
        if u.other:
            lines.append(f"  {u.other:>4} [$warning]outside any job[/]")
    return "\n".join(lines)


class MapPane(Vertical):
    """The Map view: a legend line, the map, and beside it the selected GPU and the users."""

    DEFAULT_CSS = """
    MapPane #map-legend { height: auto; max-height: 2; padding: 0 1; color: $text-muted; }
    MapPane #map-body { height: 1fr; }
    MapPane #cluster-map { width: 1fr; height: 1fr; }
    MapPane #map-side { width: 38; height: 1fr; border-left: solid $primary 40%; }
    MapPane #map-detail { height: auto; padding: 0 1; border-bottom: solid $primary 40%; }
    MapPane #map-users-box { height: 1fr; }
    MapPane #map-users { padding: 0 1; }
    """

    def compose(self) -> Any:
        yield Static("", id="map-legend")
        with Horizontal(id="map-body"):
            yield ClusterMap(id="cluster-map")
            with Vertical(id="map-side"):
                yield Static("", id="map-detail")
                with VerticalScroll(id="map-users-box"):
                    yield Static("", id="map-users")

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._seen: tuple[Any, ...] | None = None
        self.jobs = JobsSnapshot((), -1)
        self._texts: dict[str, str] = {}

    @property
    def map(self) -> ClusterMap:
        return self.query_one("#cluster-map", ClusterMap)

    def apply(self, state: Any, jobs: JobsSnapshot) -> None:
        """Show the cluster of ``state`` (a ClusterState: its full snapshot is taken only when
        its version or the jobs changed) and ``jobs``."""
        key = (state.version, jobs.version, jobs.rows)
        if key != self._seen:
            self._seen = key
            self.jobs = jobs
            self.map.show(state.snapshot(), jobs)
        self.update_panels()

    def _set(self, sel: str, text: str) -> None:
        if self._texts.get(sel) != text:
            self._texts[sel] = text
            update_static(self.query_one(sel, Static), text)

    def update_panels(self) -> None:
        m = self.map
        hosts = m.hosts
        gpus = sum(h.gpu_count for h in hosts)
        sim = sum(sum(1 for g in h.gpus or () if g.simulated) for h in hosts if h.gpus_simulated)
        fits = m.grid.lines <= m.size.height
        unhealthy = sum(h.gpus_unhealthy for h in hosts)
        drained = sum(h.gpus_drained for h in hosts)
        self._set("#map-legend", legend(m.mode, sim, gpus, len(hosts), fits, unhealthy, drained, m.slurm_gpus))
        cur = m.current()
        self._set("#map-detail", gpu_detail(*cur, self.jobs) if cur else "no hosts")
        self._set("#map-users", users_text(m.summary, self.jobs))

    def on_cluster_map_moved(self, event: ClusterMap.Moved) -> None:
        self.update_panels()

    def on_cluster_map_laid_out(self, event: ClusterMap.LaidOut) -> None:
        self.update_panels()

    def on_resize(self) -> None:
        side = self.query_one("#map-side")
        width = 38 if self.size.width >= 140 else 30
        if side.styles.width is None or side.styles.width.value != width:
            side.styles.width = width
        self.call_after_refresh(self.update_panels)
