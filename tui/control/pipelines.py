"""Pipelines: a DAG of steps (jobs or sweeps), advanced by the controller.

A pipeline spec (tui.model.pipelinespec) names steps with their dependencies, retries,
conditions and artifacts. The controller that runs (the server, or the app / ``rigdeck pipeline
--wait`` embedded) advances every pipeline each poller round (``tick``):

- a **pending** step whose needs all succeeded (or were cached) has its ``when`` evaluated over
  the earlier steps' final metrics and states; false: it is ``skipped``, and so are the steps
  that need it. Then its **cache key** (its spec, its code, its inputs' trees and the keys of the
  steps it needs) is looked up: an earlier successful run whose artifacts are still on its hosts
  is reused (``cached``), and the step does not run.
- otherwise its job (or sweep) is submitted through the queue like any job, with its
  ``inputs`` (artifacts of earlier steps) and ``continue_from`` (an earlier step's checkpoints) in
  its spec: the job manager stages them on whatever hosts the job is placed on, before it starts
  (tui.remote.artifacts): moved from the producing hosts to the consuming ones through the
  controller when they do not share storage, each content checked against its SHA-256.
- a step whose job **succeeded** has its artifacts packed on its hosts (``model/``,
  ``output/data/``, and its checkpoints when a later step continues from it) into the hosts'
  content stores, and its final metrics read; then it is ``succeeded`` and its cache entry kept.
- a step whose job **failed** runs again after its backoff, while attempts remain and the cause
  is one ``retries.on`` names ("failed": an exit of its own; "host_lost": a host that went, a
  rank killed by a signal); else it is ``failed``, the steps that need it are ``skipped``, and
  the pipeline ends ``failed`` (naming the step and cause) once nothing more can run.
  ``retry`` runs a failed step again, and then the steps skipped because of it.

State lives in the controller's SQLite (the job history's file): ``pipelines``,
``pipeline_steps`` and ``pipeline_cache``. A step's job id is written before its job is
submitted, so a controller killed at any point resumes with no step lost and none run twice; a
step packed but not recorded is packed again (the same tree). Of several controllers on one
history, one holds a pipeline's lease and advances it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
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
    describe_cause,
)
from tui.model.metrics import final_metrics
from tui.model.pipelineview import (
    PIPELINE_FINAL,
    STEP_DONE,
    STEP_FINAL,
    PipelineDetail,
    PipelineRow,
    StepRow,
)
from tui.model.sweepview import SWEEP_FINAL

log = logging.getLogger(__name__)

PACK_TIMEOUT_S = 3600.0
SCHEMA = records_table("pipelines", "pipeline_id") + """
CREATE TABLE IF NOT EXISTS pipeline_steps (
    pipeline_id TEXT NOT NULL,
    name        TEXT NOT NULL,
    position    INTEGER NOT NULL,
    state       TEXT NOT NULL,
    attempt     INTEGER NOT NULL DEFAULT 0,
    job_id      TEXT,
    sweep_id    TEXT,
    started     REAL,
    ended       REAL,
    reason      TEXT,
    retry_at    REAL,
    hosts       TEXT,
    metrics     TEXT,
    artifacts   TEXT,
    code_key    TEXT,
    cache_key   TEXT,
    cached_from TEXT,
    PRIMARY KEY (pipeline_id, name)
);
CREATE TABLE IF NOT EXISTS pipeline_cache (
    cache_key   TEXT PRIMARY KEY,
    pipeline_id TEXT NOT NULL,
    step        TEXT NOT NULL,
    job_id      TEXT,
    metrics     TEXT NOT NULL,
    artifacts   TEXT NOT NULL,
    hosts       TEXT NOT NULL,
    created     REAL NOT NULL
);
"""
PENDING_JOB = "pending-job"
RUNNING_STATES = ("staging", "submitting", QUEUED, PENDING_JOB, STARTING, RUNNING, STOPPING,
                  "finishing")


def step_state(job_state: str) -> str:
    """A submitted step's state from its job's: the job's own, but a job recorded ``pending``
    (Slurm queued it and its nodes start it, docs/slurm.md) is ``pending-job``: a step
    ``pending`` is one not started yet, which the next round would start again."""
    return PENDING_JOB if job_state == PENDING else job_state


class PipelineError(ValueError):
    """A pipeline that cannot be made, found or changed; the message says why."""


def new_pipeline_id(name: str) -> str:
    return f"{name[:40]}-pl{secrets.token_hex(3)}"


def cause_class(cause: Mapping[str, Any] | None) -> str:
    """"host_lost" for a failure of where the job ran, else "failed" (tui.control.sweeps)."""
    from tui.control.sweeps import infrastructure_failure

    return "host_lost" if infrastructure_failure(cause) else "failed"


def spec_files(spec: Any) -> set[str]:
    """The pipeline's own spec files (the pipeline file, its steps' spec files), as absolute
    paths: a step's code key leaves them out, since its parsed spec is in its key already (an
    edit to one step's spec must not look like a change of every step's code)."""
    out = set()
    if getattr(spec, "path", None):
        out.add(os.path.abspath(str(spec.path)))
    for s in spec.steps:
        for p in (s.spec_path, s.job.path):
            if p:
                out.add(os.path.abspath(str(p)))
    return out


def _rows_key(rows: list[tuple[str, str, bool]]) -> str:
    h = hashlib.sha256(b"rigdeck-code-key-1\n")
    for rel, sha, exe in sorted(rows):
        h.update(f"{sha} {'x' if exe else '-'} {rel}\n".encode())
    return h.hexdigest()


def workdir_key(job: JobSpec, store: Any = None, skip: set[str] | frozenset[str] = frozenset()) -> str | None:
    """What the step's code is, for its cache key: its files' paths and content hashes, from the
    ``[code] sync`` snapshot (in ``store``, the controller's code store) or else read from its
    workdir as this machine sees it, leaving out ``skip`` (absolute paths: the pipeline's spec
    files). None when they cannot be read here, or are beyond code sync's limits: such a step
    is never taken from the cache."""
    if job.code is not None and job.code.tree is not None:
        if store is None:
            return "tree:" + job.code.tree
        try:
            manifest = store.manifest(job.code.tree)
        except Exception as e:
            log.info("code snapshot %s: %s", job.code.tree[:12], e)
            return None
        root = job.code.sync
        return "code:" + _rows_key([(e.path, e.sha256, e.executable) for e in manifest.entries
                                    if os.path.join(root, e.path) not in skip])
    root_dir = Path(job.workdir)
    if not root_dir.is_dir():
        return None
    from tui.model.codesync import DEFAULT_MAX_FILES, DEFAULT_MAX_MB
    from tui.remote.codesync import list_files

    try:
        files, _how = list_files(root_dir, follow_links=True)  # hashed here, sent nowhere
    except Exception as e:  # not readable here: no caching for it
        log.info("workdir %s: %s", root_dir, e)
        return None
    if len(files) > DEFAULT_MAX_FILES or sum(f[2] for f in files) > DEFAULT_MAX_MB << 20:
        return None
    rows = []
    for rel, full, _size, exe, _st in files:
        if os.path.abspath(str(full)) in skip:
            continue
        fh = hashlib.sha256()
        try:
            with open(full, "rb") as f:
                while chunk := f.read(1 << 20):
                    fh.update(chunk)
        except OSError:
            return None
        rows.append((rel, fh.hexdigest(), exe))
    return "dir:" + _rows_key(rows)


def _job_key_dict(job: JobSpec) -> dict[str, Any]:
    """The parts of a step's job spec that decide what it does (not where the spec file was, nor
    the staged inputs' host lists, nor the synced files: those are its code key)."""
    d = job.to_dict()
    for k in ("path", "pipeline_id", "step", "inputs", "seed_checkpoint", "sweep_id", "trial"):
        d.pop(k, None)
    if d.get("code"):
        d["code"] = True  # its files are the step's code key (without the pipeline's spec files)
        d.pop("workdir", None)  # the hosts' copy, wherever the snapshot came from
    return d


class PipelineStore(RowStore):
    """The pipelines' rows in the controller's SQLite (the history file)."""

    noun = "pipeline"
    table = "pipelines"
    error = PipelineError

    def __init__(self, path: Path):
        super().__init__(path, SCHEMA)

    def create(self, pipeline_id: str, name: str, spec: dict[str, Any],
               steps: list[tuple[str, str | None]], user: str | None = None) -> None:
        """The pipeline and its steps (name, code key), in one transaction; ``user``: its owner."""
        now = time.time()
        with self._lock, self._db:
            self._db.execute("INSERT INTO pipelines (pipeline_id, name, spec, state, created, user) "
                             "VALUES (?, ?, ?, ?, ?, ?)", (pipeline_id, name, json.dumps(spec), RUNNING, now, user))
            self._db.executemany(
                "INSERT INTO pipeline_steps (pipeline_id, name, position, state, code_key) "
                "VALUES (?, ?, ?, ?, ?)",
                [(pipeline_id, n, i, PENDING, code_key) for i, (n, code_key) in enumerate(steps)])
        self._announce(pipeline_id, RUNNING)

    def steps(self, pipeline_id: str) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM pipeline_steps WHERE pipeline_id = ? ORDER BY position", (pipeline_id,))
        for r in rows:
            for k in ("hosts", "metrics", "artifacts"):
                r[k] = json.loads(r[k]) if r.get(k) else None
        return rows

    def update_step(self, pipeline_id: str, name: str, **fields: Any) -> None:
        for k in ("hosts", "metrics", "artifacts"):
            if k in fields and fields[k] is not None and not isinstance(fields[k], str):
                fields[k] = json.dumps(fields[k])
        cols = ", ".join(f"{k} = ?" for k in fields)
        self._exec(f"UPDATE pipeline_steps SET {cols} WHERE pipeline_id = ? AND name = ?",
                   (*fields.values(), pipeline_id, name))

    def cache_get(self, key: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM pipeline_cache WHERE cache_key = ?", (key,))
        if not rows:
            return None
        r = rows[0]
        for k in ("hosts", "metrics", "artifacts"):
            r[k] = json.loads(r[k])
        return r

    def cache_put(self, key: str, pipeline_id: str, step: str, job_id: str | None, metrics: dict[str, Any],
                  artifacts: dict[str, Any], hosts: list[str]) -> None:
        self._exec("INSERT OR REPLACE INTO pipeline_cache (cache_key, pipeline_id, step, job_id, metrics, "
                   "artifacts, hosts, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (key, pipeline_id, step, job_id, json.dumps(metrics), json.dumps(artifacts),
                    json.dumps(hosts), time.time()))

    def cache_drop(self, key: str) -> None:
        self._exec("DELETE FROM pipeline_cache WHERE cache_key = ?", (key,))


class PipelineRunner:
    """The pipelines of one controller: made, advanced each poller round (``tick``), shown,
    stopped, retried."""

    def __init__(self, manager: Any, queue: Any, sweeps: Any):
        self.jm = manager  # tui.control.jobs.JobManager
        self.queue = queue  # tui.control.queue.JobQueue
        self.sweeps = sweeps  # tui.control.sweeps.SweepRunner
        self.store = PipelineStore(manager.history.path)
        self.owner = f"{manager.owner}/pipelines" if getattr(manager, "owner", None) else f"pipelines-{os.getpid()}"
        self._lock = threading.RLock()
        self._pool: ThreadPoolExecutor | None = None
        self._packing: dict[tuple[str, str], Future[Any]] = {}  # (pipeline, step) -> its pack
        self.changed = 0  # steps the last tick moved on

    # -- making one --------------------------------------------------------------------------

    def create(self, spec: Any, pipeline_id: str | None = None,
               code_keys: Mapping[str, str | None] | None = None, user: str | None = None) -> PipelineDetail:
        """Record a pipeline (its steps' code as submitted: ``code_keys``, step -> ``workdir_key``,
        computed here when not given) and start the steps that need none. ``user``: its owner
        (default: the local account), and so its steps'."""
        pipeline_id = pipeline_id or new_pipeline_id(spec.name)
        if code_keys is None:
            skip = spec_files(spec)
            code_keys = {s.name: workdir_key(s.job, self.jm.code_store, skip) for s in spec.steps}
        keys = dict(code_keys)
        steps = [(s.name, keys.get(s.name)) for s in spec.steps]
        self.store.create(pipeline_id, spec.name, spec.to_dict(), steps, user=user or local_user())
        self.tick()
        return self.detail(pipeline_id)

    # -- the poller's side -------------------------------------------------------------------

    def tick(self) -> bool:
        """Advance every pipeline this controller may. True while one is still running here."""
        busy = False
        self.changed = 0
        with self._lock:
            for p in self.store.active():
                if not self.store.try_lease(p["pipeline_id"], self.owner):
                    continue
                busy = True
                try:
                    self._advance(p)
                except Exception:
                    log.exception("pipeline %s: a round failed", p["pipeline_id"])
        return busy

    def _spec(self, p: dict[str, Any]) -> Any:
        from tui.model.pipelinespec import PipelineSpec

        return PipelineSpec.from_dict(p["spec"])

    def _advance(self, p: dict[str, Any]) -> None:
        pid = p["pipeline_id"]
        spec = self._spec(p)
        stopping = p["state"] == STOPPING
        rows = {r["name"]: r for r in self.store.steps(pid)}
        for step in spec.steps:
            row = rows[step.name]
            if row["state"] in STEP_FINAL:
                continue
            before = row["state"]
            try:
                self._follow(pid, spec, step, row, rows, stopping)
            except Exception as e:
                log.exception("pipeline %s step %s", pid, step.name)
                self._end_step(pid, step.name, FAILED, reason=f"rigdeck could not run it: {type(e).__name__}: {e}")
            rows[step.name] = self._row(pid, step.name)
            if rows[step.name]["state"] != before:
                self.changed += 1
        if all(r["state"] in STEP_FINAL for r in rows.values()):
            failed = [r for r in rows.values() if r["state"] == FAILED]
            if stopping:
                self.store.update(pid, state=STOPPED, ended=time.time(), reason=p.get("reason") or "stopped")
            elif failed:
                first = failed[0]
                self.store.update(pid, state=FAILED, ended=time.time(),
                                  reason=f"step {first['name']} failed: {first['reason'] or 'its job failed'}")
            else:
                self.store.update(pid, state=SUCCEEDED, ended=time.time(), reason=None)

    def _row(self, pid: str, name: str) -> dict[str, Any]:
        for r in self.store.steps(pid):
            if r["name"] == name:
                return r
        raise PipelineError(f"pipeline {pid} has no step {name!r}")

    def _end_step(self, pid: str, name: str, state: str, **fields: Any) -> None:
        self.store.update_step(pid, name, state=state, ended=time.time(), **fields)

    def _follow(self, pid: str, spec: Any, step: Any, row: dict[str, Any], rows: dict[str, dict[str, Any]],
                stopping: bool) -> None:
        state = row["state"]
        if state == PENDING:
            if stopping:
                self._end_step(pid, step.name, STOPPED, reason="the pipeline was stopped")
                return
            needs = [rows[d] for d in step.depends_on]
            bad = [n for n in needs if n["state"] in (FAILED, "skipped", STOPPED)]
            if bad:
                what = {FAILED: "failed", "skipped": "was skipped", STOPPED: "was stopped"}
                self._end_step(pid, step.name, "skipped",
                               reason=f"needs {bad[0]['name']}, which {what[bad[0]['state']]}")
                return
            if any(n["state"] not in STEP_DONE for n in needs):
                return
            if step.when is not None:
                from tui.model.pexpr import EvalError

                try:
                    go = step.when.evaluate(lambda ref: self._lookup(ref, rows))
                except EvalError as e:
                    self._end_step(pid, step.name, FAILED, reason=f"its condition ({step.when.text}) "
                                   f"could not be evaluated: {e}")
                    return
                if not go:
                    self._end_step(pid, step.name, "skipped", reason=f"condition false: {step.when.text}")
                    return
            key = self._cache_key(step, row, rows)
            if key is not None:
                self.store.update_step(pid, step.name, cache_key=key)
                if self._from_cache(pid, step, key):
                    return
            self._run(pid, spec, step, rows)
        elif state == "waiting":
            if stopping:
                self._end_step(pid, step.name, STOPPED, reason="the pipeline was stopped")
            elif time.time() >= float(row["retry_at"] or 0):
                self._run(pid, spec, step, rows)
        elif state == "finishing":
            self._finish(pid, spec, step, row, stopping)
        else:  # its job or sweep runs
            self._watch(pid, spec, step, row, stopping)

    def _lookup(self, ref: Any, rows: dict[str, dict[str, Any]]) -> Any:
        from tui.model.pexpr import EvalError

        row = rows.get(ref.step)
        if row is None:
            raise EvalError(f"{ref.text}: no step {ref.step}")
        if ref.kind == "state":
            return SUCCEEDED if row["state"] == "cached" else row["state"]
        metrics = row.get("metrics") or {}
        if ref.kind == "params":
            found = metrics.get("params")
            params: dict[str, Any] = found if isinstance(found, dict) else {}
            if ref.key not in params:
                raise EvalError(f"{ref.text}: step {ref.step} has no parameter {ref.key!r}")
            return params[ref.key]
        values = {k: v for k, v in metrics.items() if k != "params"}
        if ref.key not in values:
            known = ", ".join(sorted(values)) or "none"
            raise EvalError(f"{ref.text}: step {ref.step} reported no metric {ref.key!r} (it reported: {known})")
        return values[ref.key]

    # -- caching -----------------------------------------------------------------------------

    def _cache_key(self, step: Any, row: dict[str, Any], rows: dict[str, dict[str, Any]]) -> str | None:
        """The step's spec, its code as submitted, its inputs' trees and the keys of the steps it
        needs (so a changed step reruns everything after it); None: never cached."""
        if not row.get("code_key"):
            return None
        upstream = {}
        for d in step.depends_on:
            k = rows[d].get("cache_key")
            if not k:
                return None  # a step that cannot be cached makes everything after it uncacheable
            upstream[d] = k
        inputs = {}
        for ref in step.inputs:
            art = (rows[ref.step].get("artifacts") or {}).get(ref.artifact)
            inputs[ref.channel] = art["tree"] if art else None
        seed = None
        if step.continue_from:
            art = (rows[step.continue_from].get("artifacts") or {}).get("checkpoints")
            seed = art["tree"] if art else None
        body = {"job": _job_key_dict(step.job), "code": row["code_key"], "upstream": upstream,
                "inputs": inputs, "continue_from": seed, "when": step.when.text if step.when else None}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def _from_cache(self, pid: str, step: Any, key: str) -> bool:
        hit = self.store.cache_get(key)
        if hit is None:
            return False
        # The cached run's artifacts are in the code store of the account its job ran as: asked
        # through that owner's links, and used only by a pipeline whose steps run as the same
        # account (a joined person's store is not another's: their steps would not find them).
        ran_as = self.jm.ctl_for((self.jm.history.get(hit["job_id"]) or {}).get("user"))
        if ran_as is not self.jm.ctl_for((self.store.get(pid) or {}).get("user")):
            return False
        if not self._artifacts_present(hit["artifacts"], ran_as):
            log.info("pipeline %s step %s: cached run's artifacts are gone; running it", pid, step.name)
            self.store.cache_drop(key)
            return False
        now = time.time()
        self.store.update_step(pid, step.name, state="cached", job_id=hit["job_id"], started=now, ended=now,
                               metrics=hit["metrics"], artifacts=hit["artifacts"], hosts=hit["hosts"],
                               cached_from=hit["pipeline_id"], reason=None)
        return True

    def _artifacts_present(self, artifacts: Mapping[str, Any], ctl: Any) -> bool:
        """Whether every content of every artifact is still on a host that had it (asked through
        ``ctl``: the links to the account that made them)."""
        for art in artifacts.values():
            for host, shas in (art.get("sources") or {}).items():
                if not shas:
                    continue
                sizes = {f[1]: f[2] for f in art.get("files") or []}
                try:
                    have = ctl.agent(host).code_have(tree=art["tree"], blobs=[[s, sizes.get(s, 0)] for s in shas],
                                                     timeout=30)
                except Exception as e:
                    log.info("artifact check on %s: %s", host, e)
                    return False
                if have.get("missing"):
                    return False
        return True

    # -- running a step ----------------------------------------------------------------------

    def _step_job(self, pid: str, step: Any, rows: dict[str, dict[str, Any]], attempt: int) -> JobSpec:
        """The step's job spec for this attempt: its inputs and seed checkpoint, and its place."""
        job: JobSpec = step.job
        inputs = []
        for ref in step.inputs:
            art = (rows[ref.step].get("artifacts") or {}).get(ref.artifact)
            if art is None:
                raise PipelineError(f"step {ref.step} has no {ref.artifact} artifact")
            inputs.append((ref.channel, {**art, "from": ref.text}))
        seed = None
        if step.continue_from:
            seed = (rows[step.continue_from].get("artifacts") or {}).get("checkpoints")
            if seed is not None:
                seed = {**seed, "from": f"steps.{step.continue_from}.checkpoints"}
        env = dict(job.env)
        env.update({"RIGDECK_PIPELINE_ID": pid, "RIGDECK_PIPELINE_STEP": step.name,
                    "RIGDECK_STEP_ATTEMPT": str(attempt)})
        return dataclasses.replace(job, inputs=tuple(inputs), seed_checkpoint=seed, pipeline_id=pid,
                                   step=step.name, env=tuple(env.items()))

    def _run(self, pid: str, spec: Any, step: Any, rows: dict[str, dict[str, Any]]) -> None:
        """Start the step's next attempt: its job (or sweep) id recorded, then submitted."""
        from tui.control.jobs import new_job_id

        row = rows[step.name]
        attempt = int(row["attempt"] or 0) + 1
        job = self._step_job(pid, step, rows, attempt)
        if step.kind == "sweep":
            from tui.control.sweeps import SweepError, new_sweep_id

            sweep_id = new_sweep_id(job.name)
            self.store.update_step(pid, step.name, state="submitting", attempt=attempt, sweep_id=sweep_id,
                                   job_id=None, started=time.time(), ended=None, retry_at=None, reason=None)
            try:
                self.sweeps.create(job, sweep_id=sweep_id, user=(self.store.get(pid) or {}).get("user"))
            except SweepError as e:
                self._end_step(pid, step.name, FAILED, reason=f"its sweep could not start: {e}")
                return
            self.store.update_step(pid, step.name, state=RUNNING)
            return
        job_id = new_job_id(job.name)
        self.store.update_step(pid, step.name, state="submitting", attempt=attempt, job_id=job_id, sweep_id=None,
                               started=time.time(), ended=None, retry_at=None, reason=None)
        self._submit(pid, step, job, job_id)

    def _submit(self, pid: str, step: Any, job: JobSpec, job_id: str) -> None:
        from tui.control.jobs import JobError
        from tui.model.scheduler import PlacementError

        if self.jm.history.get(job_id) is None:
            try:
                owner = (self.store.get(pid) or {}).get("user")
                self.queue.submit(job, queue=True, job_id=job_id, look=False, user=owner)
            except (PlacementError, JobError) as e:
                self._attempt_failed(pid, step, {"message": f"could not start: {e}"}, self._row(pid, step.name))
                return
        rec = self.jm.history.get(job_id) or {}
        self.store.update_step(pid, step.name, state=step_state(rec.get("state") or QUEUED))

    def _watch(self, pid: str, spec: Any, step: Any, row: dict[str, Any], stopping: bool) -> None:
        """A step whose job or sweep was submitted: follow it to its end."""
        if row.get("sweep_id"):
            self._watch_sweep(pid, step, row, stopping)
            return
        job_id = row["job_id"]
        rec = self.jm.history.get(job_id) if job_id else None
        if rec is None:  # recorded, never submitted (a controller died in between)
            if stopping:
                self._end_step(pid, step.name, STOPPED, reason="the pipeline was stopped")
                return
            rows = {r["name"]: r for r in self.store.steps(pid)}
            self._submit(pid, step, self._step_job(pid, step, rows, int(row["attempt"] or 1)), job_id)
            return
        state = rec["state"]
        hosts = [n["host"] for n in rec.get("placement") or []]
        if state not in TERMINAL:
            fields: dict[str, Any] = {}
            if step_state(state) != row["state"]:
                fields["state"] = step_state(state)
            if hosts and hosts != (row.get("hosts") or []):
                fields["hosts"] = hosts
            if fields:
                self.store.update_step(pid, step.name, **fields)
            if stopping and state != STOPPING:
                try:
                    self.jm.stop(job_id, wait=False)
                except Exception as e:
                    log.info("pipeline %s: stopping %s: %s", pid, job_id, e)
            return
        if state == SUCCEEDED:
            self.store.update_step(pid, step.name, state="finishing", hosts=hosts)
            self._finish(pid, spec, step, {**row, "state": "finishing", "hosts": hosts}, stopping)
        elif state == STOPPED or stopping:
            self._end_step(pid, step.name, STOPPED,
                           reason="the pipeline was stopped" if stopping else "its job was stopped")
        else:
            self._attempt_failed(pid, step, rec.get("cause") or {"message": f"its job {state}"}, row)

    def _watch_sweep(self, pid: str, step: Any, row: dict[str, Any], stopping: bool) -> None:
        from tui.control.sweeps import SweepError

        try:
            detail = self.sweeps.detail(row["sweep_id"])
        except SweepError:  # recorded, never made: make it now
            if stopping:
                self._end_step(pid, step.name, STOPPED, reason="the pipeline was stopped")
                return
            rows = {r["name"]: r for r in self.store.steps(pid)}
            self.sweeps.create(self._step_job(pid, step, rows, int(row["attempt"] or 1)), sweep_id=row["sweep_id"])
            return
        st = detail.row.state
        if st not in SWEEP_FINAL:
            if stopping and st == RUNNING:
                self.sweeps.stop(row["sweep_id"])
            if row["state"] != RUNNING:
                self.store.update_step(pid, step.name, state=RUNNING)
            return
        best = detail.best()
        if st == "completed" and best is not None:
            self.store.update_step(pid, step.name, state="finishing", job_id=best.job_id)
            self._finish(pid, None, step, {**row, "state": "finishing", "job_id": best.job_id}, stopping)
        elif st == STOPPED or stopping:
            self._end_step(pid, step.name, STOPPED, reason="its sweep was stopped")
        else:
            self._attempt_failed(pid, step, {"message": f"its sweep {detail.row.sweep_id} {st} with no "
                                             f"completed trial"
                                             + (f" ({detail.row.reason})" if detail.row.reason else "")},
                                 row)

    def _attempt_failed(self, pid: str, step: Any, cause: Mapping[str, Any], row: dict[str, Any]) -> None:
        """Retry after the backoff when attempts remain and the cause is one to retry on; else the
        step failed."""
        why = describe_cause(cause) if cause else "its job failed"
        attempt = int(row.get("attempt") or 1)
        kind = cause_class(cause)
        if attempt < step.retries.max_attempts and kind in step.retries.on:
            delay = step.retries.delay(attempt)
            self.store.update_step(pid, step.name, state="waiting", retry_at=time.time() + delay,
                                   reason=f"attempt {attempt} failed ({why}); retrying in {delay:g}s")
            return
        if attempt < step.retries.max_attempts:
            why += f" (not retried: a {kind.replace('_', ' ')} failure is not in retries.on)"
        elif step.retries.max_attempts > 1:
            why += f" (attempt {attempt} of {step.retries.max_attempts})"
        self._end_step(pid, step.name, FAILED, reason=why)

    # -- a succeeded step: artifacts and metrics ------------------------------------------------

    def _kinds(self, spec: Any, step: Any) -> list[str]:
        """Which artifacts to pack: output and model always; checkpoints when a later step
        continues from this one or takes them as an input."""
        kinds = ["output", "model"]
        if spec is None:
            return kinds
        for s in spec.steps:
            if s.continue_from == step.name or any(r.step == step.name and r.artifact == "checkpoints"
                                                   for r in s.inputs):
                kinds.append("checkpoints")
                break
        return kinds

    def _finish(self, pid: str, spec: Any, step: Any, row: dict[str, Any], stopping: bool) -> None:
        """Pack the step's artifacts on its hosts (in the background), then record it."""
        key = (pid, step.name)
        fut = self._packing.get(key)
        if fut is None:
            if spec is None:
                spec = self._spec(self.store.get(pid) or {})
            rec = self.jm.history.get(row["job_id"]) or {}
            hosts = [n["host"] for n in rec.get("placement") or []] or list(row.get("hosts") or [])
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pipeline")
            self._packing[key] = self._pool.submit(self._pack, row["job_id"], hosts, self._kinds(spec, step))
            return
        if not fut.done():
            return
        self._packing.pop(key, None)
        try:
            artifacts, metrics, hosts = fut.result()
        except Exception as e:
            self._end_step(pid, step.name, FAILED, reason=f"its artifacts could not be packed: {e}")
            return
        if row.get("sweep_id"):
            detail = self.sweeps.detail(row["sweep_id"])
            best = detail.best()
            if best is not None:
                metrics = {**metrics, detail.row.metric: best.value, "params": dict(best.params)}
        self._end_step(pid, step.name, SUCCEEDED, artifacts=artifacts, metrics=metrics, hosts=hosts, reason=None)
        current = self._row(pid, step.name)
        if current.get("cache_key"):
            self.store.cache_put(current["cache_key"], pid, step.name, row["job_id"], metrics, artifacts, hosts)

    def _pack(self, job_id: str, hosts: list[str],
              kinds: list[str]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        """Every host of the job packs each kind; the packs of one kind merge into one artifact."""
        from tui.remote.artifacts import merge

        # Through the agents of the account the step's job ran as (its owner's, where they joined).
        ctl = self.jm.ctl_for((self.jm.history.get(job_id) or {}).get("user"))

        def one(h: str, kind: str) -> Any:
            return ctl.agent(h).artifact_pack(job_id=job_id, kind=kind, timeout=PACK_TIMEOUT_S)

        with ThreadPoolExecutor(max_workers=max(1, len(hosts) * len(kinds))) as pool:
            futs = {(h, k): pool.submit(one, h, k) for h in hosts for k in kinds}
            packs = {hk: f.result() for hk, f in futs.items()}
        artifacts = {k: merge({h: packs[(h, k)] for h in hosts}) for k in kinds}
        try:
            metrics: dict[str, Any] = final_metrics(self.jm.metrics(job_id))
        except Exception as e:
            log.info("final metrics of %s: %s", job_id, e)
            metrics = {}
        return artifacts, metrics, hosts

    # -- commands ----------------------------------------------------------------------------

    def stop(self, ref: str, user: str | None = None) -> PipelineDetail:
        """Stop the pipeline; ``user``: who stops it (default: the local account), in its reason."""
        with self._lock:
            p = self.store.find(ref)
            if p["state"] in PIPELINE_FINAL:
                return self.detail(p["pipeline_id"])
            by = user or local_user() or "the user"
            self.store.update(p["pipeline_id"], state=STOPPING, reason=f"stopped by {by}")
            for r in self.store.steps(p["pipeline_id"]):
                if r["state"] in STEP_FINAL:
                    continue
                if r.get("sweep_id"):
                    try:
                        self.sweeps.stop(r["sweep_id"], user=by)
                    except Exception as e:
                        log.info("stopping sweep %s: %s", r["sweep_id"], e)
                elif r.get("job_id"):
                    rec = self.jm.history.get(r["job_id"])
                    if rec is not None and rec["state"] not in TERMINAL:
                        try:
                            self.jm.stop(r["job_id"], wait=False, user=by)
                        except Exception as e:
                            log.info("stopping %s: %s", r["job_id"], e)
        self.tick()
        return self.detail(p["pipeline_id"])

    def retry(self, ref: str, name: str) -> PipelineDetail:
        """Run a failed or stopped step again (a fresh set of attempts), and then the steps that
        were skipped because of it. Steps that succeeded are not run again."""
        with self._lock:
            p = self.store.find(ref)
            pid = p["pipeline_id"]
            spec = self._spec(p)
            rows = {r["name"]: r for r in self.store.steps(pid)}
            if name not in rows:
                raise PipelineError(f"pipeline {pid} has no step {name!r} (its steps: {', '.join(rows)})")
            row = rows[name]
            if row["state"] not in (FAILED, STOPPED):
                raise PipelineError(f"step {name} is {row['state']}: only a failed or stopped step can be retried")
            if p["state"] == STOPPING:
                raise PipelineError(f"pipeline {pid} is stopping; retry it once it has stopped")
            again = {name}
            for s in spec.steps:  # in dependency order: a skip caused by a step run again goes too
                r = rows[s.name]
                if s.name in again:
                    continue
                if r["state"] in ("skipped", STOPPED) and any(d in again for d in s.depends_on) \
                        and (r["state"] == STOPPED or (r["reason"] or "").startswith("needs ")):
                    again.add(s.name)
            for n in again:
                self.store.update_step(pid, n, state=PENDING, attempt=0, job_id=None,
                                       sweep_id=None, started=None, ended=None, reason=None, retry_at=None)
            self.store.update(pid, state=RUNNING, ended=None, reason=None)
        self.tick()
        return self.detail(pid)

    # -- views -------------------------------------------------------------------------------

    def rows(self) -> list[PipelineRow]:
        return [self._pipeline_row(p, self.store.steps(p["pipeline_id"])) for p in self.store.all()]

    def detail(self, ref: str) -> PipelineDetail:
        p = self.store.find(ref)
        rows = self.store.steps(p["pipeline_id"])
        spec = self._spec(p)
        by_name = {s.name: s for s in spec.steps}
        depth: dict[str, int] = {}
        for s in spec.steps:
            depth[s.name] = 1 + max((depth[d] for d in s.depends_on), default=-1)
        steps = []
        for r in rows:
            s = by_name[r["name"]]
            metrics = r.get("metrics") or {}
            steps.append(StepRow(
                name=r["name"], state=r["state"], kind=s.kind, depends_on=tuple(s.depends_on),
                depth=depth.get(r["name"], 0), job_id=r.get("job_id"), sweep_id=r.get("sweep_id"),
                attempt=int(r.get("attempt") or 0), max_attempts=s.retries.max_attempts,
                started=r.get("started"), ended=r.get("ended"), reason=r.get("reason"),
                when=s.when.text if s.when is not None else None, retry_at=r.get("retry_at"),
                hosts=tuple(r.get("hosts") or ()),
                metrics=tuple((k, float(v)) for k, v in metrics.items()
                              if isinstance(v, (int, float)) and not isinstance(v, bool)),
                artifacts=tuple((k, len(a.get("files") or ()), int(a.get("bytes") or 0))
                                for k, a in (r.get("artifacts") or {}).items()),
                inputs=tuple((i.channel, i.text) for i in s.inputs),
                continue_from=s.continue_from, cache_key=r.get("cache_key"), cached_from=r.get("cached_from")))
        return PipelineDetail(row=self._pipeline_row(p, rows), steps=tuple(steps))

    @staticmethod
    def _pipeline_row(p: dict[str, Any], rows: list[dict[str, Any]]) -> PipelineRow:
        count = {k: sum(1 for r in rows if r["state"] == k) for k in (SUCCEEDED, "cached", FAILED, "skipped")}
        spec_path = (p.get("spec") or {}).get("path")
        return PipelineRow(
            pipeline_id=p["pipeline_id"], name=p["name"], state=p["state"], created=p["created"],
            ended=p.get("ended"), reason=p.get("reason"), steps=len(rows), succeeded=count[SUCCEEDED],
            cached=count["cached"], failed=count[FAILED], skipped=count["skipped"],
            running=sum(1 for r in rows if r["state"] not in STEP_FINAL and r["state"] != PENDING),
            path=spec_path, user=p.get("user"))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self.store.release(self.owner)
        self.store.close()
