"""Hyperparameter sweeps: Optuna's ask/tell loop, run by the controller; every trial a job.

A sweep is a job spec with a ``[sweep]`` table (tui.model.sweepspec). The controller that runs
(the server, or the app / ``rigdeck sweep --wait`` embedded) turns it into trials:

- **ask**: Optuna's sampler (``RandomSampler``, ``GridSampler``, ``TPESampler`` with
  ``constant_liar`` for trials that run side by side) proposes a trial's parameters; the trial
  becomes an ordinary job through the queue (``JobQueue.submit``), on whatever GPUs are free,
  with its number in every cloud contract (``JobSpec.for_trial``). With no ``max_parallel`` the
  sweep keeps one trial waiting in the queue at most, so it runs as many as fit.
- **report**: the objective's intermediate values come from the job's metrics records (the
  poller reads them for every live job: ``runtime.report()``, the metric definitions applied to
  rank 0's output, the hypertune file) and go to the trial; Optuna's pruner (``MedianPruner``,
  ``HyperbandPruner``) says when to stop one, and the trial's job is stopped like any job and
  recorded as ``pruned`` at its step.
- **tell**: a trial whose job ended is told its objective (the last value it reported), or
  failure: "metric val_loss never reported", or the job's own failure. A trial that failed
  because its host did (a rank killed by a signal, not an exit of its own) runs again, up to
  ``retries`` times, as a new job under the same trial number.

State lives in the controller's SQLite (the job history's file): the sweep and its trials in
``sweeps`` and ``sweep_trials``, Optuna's study in its own tables (``RDBStorage``). The trial row,
with its job id, is written before the job is submitted, and Optuna's trial is asked before
that, so a controller killed at any point resumes the sweep with no trial lost and none run
twice: a trial asked but not recorded is recorded; one recorded but not submitted is submitted;
a job that ran on is read when its controller comes back. Of several controllers on one history
(the app and ``sweep --wait`` embedded) one holds a sweep's lease and advances it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tui.control.rowstore import RowStore, records_table
from tui.model.identity import local_user
from tui.model.jobspec import JobSpec
from tui.model.jobstate import (
    FAILED,
    PENDING,
    QUEUED,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
    SUCCEEDED,
    TERMINAL,
)
from tui.model.metrics import merge_objective_values, objective_values
from tui.model.sweepspec import SweepSpec, grid_points
from tui.model.sweepview import (
    SWEEP_FINAL,
    TRIAL_FINAL,
    SweepDetail,
    SweepRow,
    TrialRow,
    sorted_trials,
)

log = logging.getLogger(__name__)

# Trials started side by side: a wave of ended trials (all of a host's GPUs) starts at once;
# each start waits on its hosts' answers, not on this machine's CPU.
SUBMIT_WORKERS = 16
READY = "ready"  # a trial asked ahead of its slot (random and grid sweeps); not yet a job
INDEPENDENT = ("random", "grid")  # strategies whose proposals do not depend on any result
ADOPT_EVERY_S = 30.0
SCHEMA = records_table("sweeps", "sweep_id") + """
CREATE TABLE IF NOT EXISTS sweep_trials (
    sweep_id    TEXT NOT NULL,
    number      INTEGER NOT NULL,
    trial_id    INTEGER NOT NULL,
    job_id      TEXT NOT NULL,
    attempt     INTEGER NOT NULL DEFAULT 1,
    params      TEXT NOT NULL,
    state       TEXT NOT NULL,
    value       REAL,
    best_step   INTEGER,
    best_value  REAL,
    last_step   INTEGER,
    pruned_step INTEGER,
    started     REAL,
    ended       REAL,
    error       TEXT,
    curve       TEXT,
    PRIMARY KEY (sweep_id, number)
);
"""


class SweepError(ValueError):
    """A sweep that cannot be made or found; the message says why."""


def new_sweep_id(name: str) -> str:
    return f"{name[:40]}-sw{uuid.uuid4().hex[:6]}"


def _optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def distributions(spec: SweepSpec) -> dict[str, Any]:
    """Each parameter as Optuna's distribution."""
    d = _optuna().distributions
    out: dict[str, Any] = {}
    for p in spec.parameters:
        if p.type == "float":
            out[p.name] = d.FloatDistribution(p.low, p.high, log=p.log, step=p.step)
        elif p.type == "int":
            out[p.name] = d.IntDistribution(int(p.low or 0), int(p.high or 0), log=p.log, step=int(p.step or 1))
        else:
            out[p.name] = d.CategoricalDistribution(list(p.choices))
    return out


def sampler_for(spec: SweepSpec, number: int) -> Any:
    """The sampler that proposes trial ``number``. Seeded per trial (from the seed and the number),
    so a sweep's proposals do not depend on how many times its controller restarted."""
    samplers = _optuna().samplers
    # Mixed, not added: seed 1's trial 1 must not be seed 0's trial 2.
    seed = None if spec.seed is None else (spec.seed * 1_000_003 + number * 7919) % (2 ** 32)
    if spec.strategy == "random":
        return samplers.RandomSampler(seed=seed)
    if spec.strategy == "grid":
        space = {p.name: p.grid_values() for p in spec.parameters}
        return samplers.GridSampler(space, seed=spec.seed)
    # "bayesian", and "hyperband" (whose trials are proposed by TPE and cut short by the pruner).
    return samplers.TPESampler(seed=seed, constant_liar=True, multivariate=True,
                               n_startup_trials=min(10, max(3, spec.max_trials // 4)))


def pruner_for(spec: SweepSpec, total_steps: int | None) -> Any:
    pruners = _optuna().pruners
    if spec.pruner == "median":
        return pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=max(1, (total_steps or 0) // 10))
    if spec.pruner == "hyperband":
        return pruners.HyperbandPruner(min_resource=1, max_resource=total_steps or "auto", reduction_factor=3)
    return pruners.NopPruner()


def infrastructure_failure(cause: Mapping[str, Any] | None) -> bool:
    """Whether a failed job failed because of where it ran, not what it ran: a rank killed by a
    signal (a host that went down, the OOM killer, a reboot) or a host lost, rather than an exit
    of the script's own."""
    if not cause:
        return False
    if cause.get("signal") is not None:
        return True
    text = str(cause.get("message") or "").lower()
    return cause.get("exit_code") is None and any(w in text for w in ("lost", "unreachable", "job host", "vanished"))


class SweepStore(RowStore):
    """The sweeps' rows in the controller's SQLite (the history file)."""

    noun = "sweep"
    table = "sweeps"
    error = SweepError

    def __init__(self, path: Path):
        super().__init__(path, SCHEMA)

    def create(self, sweep_id: str, name: str, spec: dict[str, Any], user: str | None = None) -> None:
        self._exec("INSERT INTO sweeps (sweep_id, name, spec, state, created, user) VALUES (?, ?, ?, ?, ?, ?)",
                   (sweep_id, name, json.dumps(spec), RUNNING, time.time(), user))
        self._announce(sweep_id, RUNNING)

    def trials(self, sweep_id: str) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM sweep_trials WHERE sweep_id = ? ORDER BY number", (sweep_id,))
        for r in rows:
            r["params"] = json.loads(r["params"])
        return rows

    def add_trial(self, sweep_id: str, number: int, trial_id: int, job_id: str, params: dict[str, Any],
                  state: str = "submitting") -> None:
        self._exec("INSERT INTO sweep_trials (sweep_id, number, trial_id, job_id, params, state) "
                   "VALUES (?, ?, ?, ?, ?, ?)", (sweep_id, number, trial_id, job_id, json.dumps(params), state))

    def update_trial(self, sweep_id: str, number: int, **fields: Any) -> None:
        cols = ", ".join(f"{k} = ?" for k in fields)
        self._exec(f"UPDATE sweep_trials SET {cols} WHERE sweep_id = ? AND number = ?",
                   (*fields.values(), sweep_id, number))


class SweepRunner:
    """The sweeps of one controller: made, advanced each poller round (``tick``), shown, stopped."""

    def __init__(self, manager: Any, queue: Any):
        self.jm = manager  # tui.control.jobs.JobManager
        self.queue = queue  # tui.control.queue.JobQueue
        self.store = SweepStore(manager.history.path)
        self.owner = f"{manager.owner}/sweeps" if getattr(manager, "owner", None) else f"sweeps-{os.getpid()}"
        self._storage: Any = None
        self._studies: dict[str, Any] = {}
        self._values: dict[str, dict[int, tuple[int, int, float]]] = {}  # job id -> objective by step
        self._reported: dict[str, set[int]] = {}  # job id -> steps told to its trial
        self._handles: dict[int, Any] = {}  # Optuna trial id -> its Trial
        self._told: set[int] = set()  # Optuna trial ids told how they ended
        self._metric_cache: dict[str, str | None] = {}  # job id -> its sweep's objective metric
        self._lock = threading.RLock()
        self.started = 0  # trials the last tick started
        self._adopted: dict[str, float] = {}  # sweep id -> when its orphans were last looked for

    # -- Optuna ------------------------------------------------------------------------------

    @property
    def storage(self) -> Any:
        if self._storage is None:
            self._storage = _optuna().storages.RDBStorage(
                f"sqlite:///{self.store.path}", engine_kwargs={"connect_args": {"timeout": 20}})
        return self._storage

    def _study(self, sweep_id: str, spec: JobSpec) -> Any:
        study = self._studies.get(sweep_id)
        if study is None:
            assert spec.sweep is not None
            study = _optuna().load_study(study_name=sweep_id, storage=self.storage,
                                         pruner=pruner_for(spec.sweep, spec.total_steps))
            self._studies[sweep_id] = study
        return study

    # -- making one --------------------------------------------------------------------------

    def create(self, spec: JobSpec, sweep_id: str | None = None, user: str | None = None) -> SweepDetail:
        """Record a new sweep and start its first trials (when this controller may). ``user``:
        its owner (default: the local account), and so its trials' owner."""
        if spec.sweep is None:
            raise SweepError(f"{spec.path or 'the job spec'}: no [sweep] table: a sweep needs one "
                             "(rigdeck launch runs a single job)")
        sw = spec.sweep
        sweep_id = sweep_id or new_sweep_id(spec.name)
        optuna = _optuna()
        direction = "minimize" if sw.goal == "minimize" else "maximize"
        warm: list[Any] = []
        if sw.warm_start:
            warm = self._warm_trials(sw.warm_start, spec)
        study = optuna.create_study(study_name=sweep_id, storage=self.storage, direction=direction,
                                    pruner=pruner_for(sw, spec.total_steps))
        for t in warm:
            study.add_trial(t)
        self.store.create(sweep_id, spec.name, spec.to_dict(), user=user or local_user())
        self._studies[sweep_id] = study
        self.tick()
        return self.detail(sweep_id)

    def _warm_trials(self, ref: str, spec: JobSpec) -> list[Any]:
        """The completed trials of an earlier sweep whose parameters fit this one's space."""
        optuna = _optuna()
        assert spec.sweep is not None
        earlier = self.store.find(ref)
        dists = distributions(spec.sweep)
        out = []
        for t in self.store.trials(earlier["sweep_id"]):
            if t["state"] != "completed" or t["value"] is None:
                continue
            params = t["params"]
            if set(params) != set(dists) or not all(dists[k]._contains(dists[k].to_internal_repr(v))
                                                    for k, v in params.items()):
                continue
            out.append(optuna.trial.create_trial(params=params, distributions=dists, value=t["value"],
                                                 user_attrs={"warm_start": earlier["sweep_id"]}))
        if not out:
            raise SweepError(f"warm_start: sweep {earlier['sweep_id']} has no completed trial that fits this "
                             "sweep's parameters")
        return out

    # -- the poller's side -------------------------------------------------------------------

    def feed(self, job_id: str, records: list[dict[str, Any]]) -> None:
        """Metrics records the poller read for a job (any job: a trial's are kept)."""
        if not records:
            return
        with self._lock:
            metric = self._metric_of(job_id)
            if metric is None:
                return
            have = self._values.get(job_id, {})
            self._values[job_id] = merge_objective_values(have, objective_values(records, metric))

    def _metric_of(self, job_id: str) -> str | None:
        if job_id not in self._metric_cache:
            rec = self.jm.history.get(job_id) or {}
            spec = rec.get("spec") or {}
            metric = None
            if spec.get("sweep_id"):
                sweep = self.store.get(spec["sweep_id"])
                if sweep is not None:
                    metric = ((sweep["spec"].get("sweep") or {}).get("objective") or {}).get("metric")
            self._metric_cache[job_id] = metric
        return self._metric_cache[job_id]

    def tick(self) -> bool:
        """Advance every sweep this controller may: tell ended trials, prune, ask new ones.
        True while some sweep is still running here."""
        busy = False
        self.started = 0
        with self._lock:
            for sweep in self.store.active():
                if not self.store.try_lease(sweep["sweep_id"], self.owner):
                    self._adopted.pop(sweep["sweep_id"], None)  # another controller has it now
                    continue
                busy = True
                try:
                    self._advance(sweep)
                except Exception:
                    log.exception("sweep %s: a round failed", sweep["sweep_id"])
        return busy

    def _advance(self, sweep: dict[str, Any]) -> None:
        sweep_id = sweep["sweep_id"]
        spec = JobSpec.from_dict(sweep["spec"])
        sw = spec.sweep
        assert sw is not None
        study = self._study(sweep_id, spec)
        trials = self.store.trials(sweep_id)
        # Orphans come from a controller that died between an ask and its record: looked for
        # when this controller takes the sweep on, and now and then after (a query of every
        # running trial, too dear for each round).
        if time.monotonic() - self._adopted.get(sweep_id, -ADOPT_EVERY_S) >= ADOPT_EVERY_S:
            self._adopt_orphans(sweep_id, spec, study, trials)
            self._adopted[sweep_id] = time.monotonic()
            trials = self.store.trials(sweep_id)
        stopping = sweep["state"] == STOPPING
        over_time = sw.max_runtime_s is not None and time.time() - sweep["created"] > sw.max_runtime_s
        if over_time and not stopping:
            self._stop_all(sweep_id, trials, f"max_runtime of {sw.max_runtime_s}s reached")
            stopping = True
            trials = self.store.trials(sweep_id)
        for t in trials:
            if t["state"] not in TRIAL_FINAL:
                self._follow(sweep_id, spec, study, t, stopping)
        trials = self.store.trials(sweep_id)
        if sw.strategy in ("bayesian", "hyperband"):
            # A model-based sampler's next proposal should know what just ended; random and grid
            # proposals do not depend on it, so there the new trials start first.
            self._tell(study, trials)
        started = 0
        if not stopping:
            started = self._ask(sweep_id, spec, study, trials)
            self.started += started
            trials = self.store.trials(sweep_id)
        if not started or stopping or sw.strategy in ("bayesian", "hyperband"):
            # A round that started trials leaves its tells to the next one: while a wave of trials
            # ends, each round must come back soon to notice the next that ends.
            self._tell(study, trials)
        open_trials = [t for t in trials if t["state"] not in TRIAL_FINAL]
        if open_trials:
            return
        if stopping:
            self.store.update(sweep_id, state=STOPPED, ended=time.time())
        elif len(trials) >= sw.max_trials:
            self.store.update(sweep_id, state="completed", ended=time.time(), reason=None)

    def _adopt_orphans(self, sweep_id: str, spec: JobSpec, study: Any, trials: list[dict[str, Any]]) -> None:
        """Optuna trials asked but never recorded (the controller died in between): record them."""
        known = {t["trial_id"] for t in trials}
        state = _optuna().trial.TrialState
        assert spec.sweep is not None
        wanted = set(distributions(spec.sweep))
        for ft in study.get_trials(deepcopy=False, states=(state.RUNNING, state.WAITING)):
            if ft._trial_id in known or ft.user_attrs.get("warm_start"):
                continue
            if set(ft.params) != wanted:
                # Died inside the ask, before every parameter was written: no job can be made
                # from it. Optuna is told it failed; the next ask makes this trial number anew.
                log.info("sweep %s: Optuna trial %s was asked but never got its parameters (%s): "
                         "told failed", sweep_id, ft.number, sorted(ft.params))
                study.tell(ft.number, state=state.FAIL, skip_if_finished=True)
                continue
            number = self._next_number(trials)
            job_id = f"{spec.name[:48]}-t{number}-{uuid.uuid4().hex[:6]}"
            self.store.add_trial(sweep_id, number, ft._trial_id, job_id, dict(ft.params))
            trials.append({"number": number, "trial_id": ft._trial_id})

    @staticmethod
    def _next_number(trials: list[dict[str, Any]]) -> int:
        return max((int(t["number"]) for t in trials), default=0) + 1

    def _ask(self, sweep_id: str, spec: JobSpec, study: Any, trials: list[dict[str, Any]]) -> int:
        """Start the trials that fit now (asked ahead ones first, then newly asked); in a round
        that started none, ask one trial ahead. Returns how many were started."""
        sw = spec.sweep
        assert sw is not None
        dists = distributions(sw)
        grid = grid_points(sw) if sw.strategy == "grid" else None
        # With a known max_parallel, each trial starts the moment it is asked, side by side with
        # the others: a launch waits on its hosts' answers, and a wave of trials that ended
        # together must not start one after another.
        from concurrent.futures import Future, ThreadPoolExecutor

        pool: ThreadPoolExecutor | None = None
        started: list[Future[None]] = []

        def start(row: dict[str, Any]) -> None:
            nonlocal pool
            if pool is None:
                pool = ThreadPoolExecutor(max_workers=SUBMIT_WORKERS, thread_name_prefix="sweep-submit")
            started.append(pool.submit(self._submit, sweep_id, spec, row))

        def new_trial(state: str) -> dict[str, Any] | None:
            return self._new_trial(sweep_id, spec, study, trials, state, dists, grid)

        submitted = 0  # started one at a time (no max_parallel)
        try:
            if sw.max_parallel is not None:
                for t in trials:
                    if t["state"] == "submitting":
                        start(t)
            while True:
                live = [t for t in trials if t["state"] not in TRIAL_FINAL and t["state"] != READY]
                if sw.max_parallel is not None and len(live) >= sw.max_parallel:
                    break
                # The rows carry their jobs' states as this round's look found them.
                if any(t["state"] == QUEUED for t in live):
                    break  # one waits in the queue already: as many run as fit
                ready = sorted((t for t in trials if t["state"] == READY), key=lambda t: int(t["number"]))
                if ready:
                    row = ready[0]
                    self.store.update_trial(sweep_id, int(row["number"]), state="submitting")
                    row["state"] = "submitting"
                elif len(trials) >= sw.max_trials:
                    break
                else:
                    made = new_trial("submitting")
                    if made is None:
                        break
                    row = made
                if sw.max_parallel is None:
                    # As many as fit: one at a time, until one has to wait in the queue.
                    self._submit(sweep_id, spec, row)
                    row["state"] = self._job_state(row) or "submitting"
                    submitted += 1
                else:
                    start(row)
            count = len(started) + submitted
            if not count and sw.strategy in INDEPENDENT and len(trials) < sw.max_trials:
                # Random and grid proposals do not depend on any result, so a quiet round asks
                # the next trial ahead of time: when a GPU frees, its trial starts without an ask
                # (tens of ms of CPU each, paid by every trial of a wave that ends together).
                live = [t for t in trials if t["state"] not in TRIAL_FINAL and t["state"] != READY]
                ahead = sum(1 for t in trials if t["state"] == READY)
                if ahead < max(1, sw.max_parallel or len(live)):
                    new_trial(READY)
        finally:
            for f in started:
                f.result()
            if pool is not None:
                pool.shutdown()
        return count

    def _new_trial(self, sweep_id: str, spec: JobSpec, study: Any, trials: list[dict[str, Any]], state: str,
                   dists: dict[str, Any], grid: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        """Ask the study for the next trial and record it, in ``state``, in the store and in
        ``trials``; None when a grid has no point left."""
        sw = spec.sweep
        assert sw is not None
        number = self._next_number(trials)
        if grid is not None and number > len(grid):
            return None
        study.sampler = sampler_for(sw, number)
        ft = study.ask(dists)
        job_id = f"{spec.name[:48]}-t{number}-{uuid.uuid4().hex[:6]}"
        self.store.add_trial(sweep_id, number, ft._trial_id, job_id, dict(ft.params), state=state)
        row = {"number": number, "trial_id": ft._trial_id, "job_id": job_id, "params": dict(ft.params),
               "state": state, "attempt": 1}
        trials.append(row)
        return row

    def _submit(self, sweep_id: str, spec: JobSpec, t: dict[str, Any]) -> None:
        """Queue (or start) the trial's job, under the id its row already names."""
        from tui.control.jobs import JobError
        from tui.model.scheduler import PlacementError

        trial_spec = spec.for_trial(int(t["number"]), t["params"], sweep_id)
        if self.jm.history.get(t["job_id"]) is None:
            try:
                owner = (self.store.get(sweep_id) or {}).get("user")
                self.queue.submit(trial_spec, queue=True, job_id=t["job_id"], look=False, user=owner)
            except (PlacementError, JobError) as e:
                self._finish(sweep_id, t, FAILED, error=f"could not start: {e}")
                return
        rec = self.jm.history.get(t["job_id"]) or {}
        self.store.update_trial(sweep_id, int(t["number"]), state=rec.get("state") or QUEUED,
                                started=rec.get("started") or rec.get("created") or time.time())

    def _job_state(self, t: dict[str, Any]) -> str | None:
        rec = self.jm.history.get(t["job_id"])
        return rec["state"] if rec else None

    def _follow(self, sweep_id: str, spec: JobSpec, study: Any, t: dict[str, Any], stopping: bool) -> None:
        """One open trial: submit it if its job was never made, pass on its new objective values,
        prune it, or tell Optuna how it ended."""
        sw = spec.sweep
        assert sw is not None
        if t["state"] == READY:  # asked ahead: it waits for a free slot (``_ask``)
            if stopping:
                self._finish(sweep_id, t, STOPPED, study=study, error="the sweep was stopped")
            return
        rec = self.jm.history.get(t["job_id"])
        number = int(t["number"])
        if rec is None:
            if stopping:
                self._finish(sweep_id, t, STOPPED, study=study, error="the sweep was stopped")
            else:
                self._submit(sweep_id, spec, t)
            return
        state = rec["state"]
        values = self._values.get(t["job_id"], {})
        pruning = sw.pruner != "off"
        if pruning:
            self._report(study, t, values)
        curve = sorted(values.items())
        fields = self._curve_fields(t, curve, sw.goal)
        if rec.get("started") and not t.get("started"):
            fields["started"] = rec["started"]
        if state not in TERMINAL:
            if state != t["state"] and t["state"] != "pruning":
                fields["state"] = state
            if fields:
                self.store.update_trial(sweep_id, number, **fields)
            if pruning and t["state"] != "pruning" and state in (RUNNING, STARTING) and curve and not stopping:
                if self._trial(study, t).should_prune():
                    step = curve[-1][0]
                    self.store.update_trial(sweep_id, number, state="pruning", pruned_step=step)
                    self.jm.history.add_event(t["job_id"], {"event": "pruned", "step": step})
                    self.jm.stop(t["job_id"], wait=False)
            return
        if fields:
            self.store.update_trial(sweep_id, number, **fields)
        # The job ended. The poller read its records once more after it did; a controller that
        # started after it ended (or one whose trial stopped short of its last step) reads them all.
        if not curve or (spec.total_steps is not None and curve[-1][0] < spec.total_steps):
            try:
                self.feed(t["job_id"], self.jm.metrics(t["job_id"]))
            except Exception as e:  # a host that cannot be reached now: its last values are lost
                log.info("sweep %s trial %s: final metrics: %s", sweep_id, number, e)
        values = self._values.get(t["job_id"], {})
        if pruning:
            self._report(study, t, values)
        curve = sorted(values.items())
        fields = self._curve_fields({**t, **fields}, curve, sw.goal)
        if fields:
            self.store.update_trial(sweep_id, number, **fields)
        if t["state"] == "pruning":
            self._finish(sweep_id, t, "pruned", study=study)
        elif state == SUCCEEDED:
            if not curve:
                self._finish(sweep_id, t, FAILED, study=study, error=f"metric {sw.metric} never reported")
            else:
                self._finish(sweep_id, t, "completed", study=study, value=curve[-1][1][2])
        elif state == FAILED and infrastructure_failure(rec.get("cause")) \
                and int(t.get("attempt") or 1) <= sw.retries and not stopping:
            job_id = f"{spec.name[:48]}-t{number}-{uuid.uuid4().hex[:6]}"
            attempt = int(t.get("attempt") or 1) + 1
            self.store.update_trial(sweep_id, number, job_id=job_id, attempt=attempt, state="submitting",
                                    started=None)
            self._values.pop(t["job_id"], None)
            self._reported.pop(t["job_id"], None)
            self._submit(sweep_id, spec, {**t, "job_id": job_id, "attempt": attempt})
        else:
            from tui.model.jobstate import describe_cause

            why = describe_cause(rec["cause"]) if rec.get("cause") else f"its job {state}"
            self._finish(sweep_id, t, FAILED if state == FAILED else STOPPED, study=study, error=why)

    def _curve_fields(self, t: dict[str, Any], curve: list[tuple[int, tuple[int, int, float]]],
                      goal: str) -> dict[str, Any]:
        """The trial row's fields its objective values give (those that changed)."""
        if not curve:
            return {}
        best = self._best(curve, goal)
        text = json.dumps([[s, x[2]] for s, x in curve])
        fields = {"last_step": curve[-1][0], "best_step": best[0] if best else None,
                  "best_value": best[1][2] if best else None, "curve": text}
        return {k: v for k, v in fields.items() if t.get(k) != v}

    def _trial(self, study: Any, t: dict[str, Any]) -> Any:
        """Optuna's handle on the trial (made once: making one reads the storage)."""
        trial = self._handles.get(int(t["trial_id"]))
        if trial is None:
            trial = self._handles[int(t["trial_id"])] = _optuna().trial.Trial(study, int(t["trial_id"]))
        return trial

    @staticmethod
    def _best(curve: list[tuple[int, tuple[int, int, float]]], goal: str) -> tuple[int, tuple[int, int, float]] | None:
        finite = [c for c in curve if math.isfinite(c[1][2])]
        if not finite:
            return None
        pick = min if goal == "minimize" else max
        return pick(finite, key=lambda c: c[1][2])

    def _report(self, study: Any, t: dict[str, Any], values: dict[int, tuple[int, int, float]]) -> None:
        """Pass the trial's new intermediate values to Optuna (each step once)."""
        job_id = t["job_id"]
        told = self._reported.get(job_id)
        if told is None:
            ft = study._storage.get_trial(int(t["trial_id"]))
            told = self._reported[job_id] = set(ft.intermediate_values)
        new = [(s, x[2]) for s, x in sorted(values.items()) if s not in told and math.isfinite(x[2])]
        if not new:
            return
        trial = self._trial(study, t)
        for step, v in new:
            try:
                trial.report(v, step)
            except Exception as e:  # a finished trial (told before a restart) takes no more
                log.debug("report to trial %s: %s", t["number"], e)
                break
            told.add(step)

    def _finish(self, sweep_id: str, t: dict[str, Any], state: str, *, study: Any = None,
                value: float | None = None, error: str | None = None) -> None:
        """Record how a trial ended. Optuna hears of it at the end of the round (``_tell``),
        after the round's new trials started: a finished trial must not hold up the next."""
        fields: dict[str, Any] = {"state": state, "ended": time.time()}
        if value is not None:
            fields["value"] = value
        if error is not None:
            fields["error"] = error
        self.store.update_trial(sweep_id, int(t["number"]), **fields)

    def _tell(self, study: Any, trials: list[dict[str, Any]]) -> None:
        """Tell Optuna every ended trial it has not heard of (once per trial per controller; a
        controller that died between recording a trial and telling it tells it on its return)."""
        ts = _optuna().trial.TrialState
        for t in trials:
            tid = int(t["trial_id"])
            if t["state"] not in TRIAL_FINAL or tid in self._told:
                continue
            try:
                ft = study._storage.get_trial(tid)
                if not ft.state.is_finished():
                    if t["state"] == "completed" and t.get("value") is not None:
                        study.tell(ft.number, float(t["value"]))
                    else:
                        study.tell(ft.number, state=ts.PRUNED if t["state"] == "pruned" else ts.FAIL)
                self._told.add(tid)
                self._handles.pop(tid, None)
            except Exception:
                log.exception("telling trial %s", t["number"])

    # -- commands ----------------------------------------------------------------------------

    def stop(self, ref: str, user: str | None = None) -> SweepDetail:
        """Stop a sweep: its queued trials leave the queue, its running ones are stopped.
        ``user``: who stops it (default: the local account), named in its reason."""
        with self._lock:
            sweep = self.store.find(ref)
            if sweep["state"] in SWEEP_FINAL:
                return self.detail(sweep["sweep_id"])
            by = user or local_user() or "the user"
            self._stop_all(sweep["sweep_id"], self.store.trials(sweep["sweep_id"]), f"stopped by {by}", user=by)
        self.tick()
        return self.detail(sweep["sweep_id"])

    def _stop_all(self, sweep_id: str, trials: list[dict[str, Any]], reason: str, user: str | None = None) -> None:
        self.store.update(sweep_id, state=STOPPING, reason=reason)
        for t in trials:
            if t["state"] in TRIAL_FINAL:
                continue
            rec = self.jm.history.get(t["job_id"])
            if rec is not None and rec["state"] not in TERMINAL:
                try:
                    self.jm.stop(t["job_id"], wait=False, user=user)
                except Exception as e:
                    log.info("sweep %s: stopping trial %s: %s", sweep_id, t["number"], e)

    def stop_trial(self, ref: str, number: int, user: str | None = None) -> SweepDetail:
        """Stop one trial; ``user``: who stops it (recorded in its job's stop)."""
        sweep = self.store.find(ref)
        for t in self.store.trials(sweep["sweep_id"]):
            if int(t["number"]) == number:
                if t["state"] == READY:  # asked ahead, never started: it ends here
                    with self._lock:
                        self._finish(sweep["sweep_id"], t, STOPPED, error="stopped by the user")
                elif t["state"] not in TRIAL_FINAL:
                    self.jm.stop(t["job_id"], wait=False, user=user)
                return self.detail(sweep["sweep_id"])
        raise SweepError(f"sweep {sweep['sweep_id']} has no trial {number}")

    # -- views -------------------------------------------------------------------------------

    def rows(self) -> list[SweepRow]:
        return [self._row(s, self.store.trials(s["sweep_id"])) for s in self.store.all()]

    def detail(self, ref: str) -> SweepDetail:
        sweep = self.store.find(ref)
        trials = self.store.trials(sweep["sweep_id"])
        sw = SweepSpec.from_dict(sweep["spec"]["sweep"])
        rows = [self._trial_row(t, json.loads(t["curve"]) if t.get("curve") else ()) for t in trials]
        return SweepDetail(
            row=self._row(sweep, trials), parameters=tuple(p.to_dict() for p in sw.parameters),
            trials=tuple(sorted_trials(rows, sw.goal)), max_parallel=sw.max_parallel, seed=sw.seed)

    def _row(self, s: dict[str, Any], trials: list[dict[str, Any]]) -> SweepRow:
        sw = SweepSpec.from_dict(s["spec"]["sweep"])
        done = [t for t in trials if t["state"] == "completed" and t["value"] is not None]
        best = sorted_trials([self._trial_row(t, ()) for t in done], sw.goal)
        count = {k: sum(1 for t in trials if t["state"] == k) for k in ("completed", "pruned", FAILED)}
        return SweepRow(
            sweep_id=s["sweep_id"], name=s["name"], state=s["state"], strategy=sw.strategy, pruner=sw.pruner,
            metric=sw.metric, goal=sw.goal, max_trials=sw.max_trials, created=s["created"], ended=s["ended"],
            reason=s["reason"], trials=len(trials),
            running=sum(1 for t in trials if t["state"] in (STARTING, RUNNING, PENDING, "pruning",
                                                            STOPPING)),
            queued=sum(1 for t in trials if t["state"] in (QUEUED, "submitting", READY)),
            completed=count["completed"], pruned=count["pruned"], failed=count[FAILED] + sum(
                1 for t in trials if t["state"] == STOPPED),
            best_trial=best[0].number if best else None, best_value=best[0].value if best else None,
            user=s.get("user"),
        )

    @staticmethod
    def _trial_row(t: dict[str, Any], curve: tuple[tuple[int, float], ...]) -> TrialRow:
        return TrialRow(
            number=int(t["number"]), job_id=t["job_id"], state=t["state"], params=tuple(t["params"].items()),
            value=t.get("value"), best_step=t.get("best_step"), best_value=t.get("best_value"),
            last_step=t.get("last_step"), pruned_step=t.get("pruned_step"), started=t.get("started"),
            ended=t.get("ended"), attempt=int(t.get("attempt") or 1), error=t.get("error"),
            curve=tuple((int(s), float(v)) for s, v in curve))

    def close(self) -> None:
        self.store.release(self.owner)
        self.store.close()

