"""Where a rank's step time goes: waiting for data (``timed``) and in all-reduce (``comm_timer``).

Both add seconds to the rank's next ``report(step=...)`` line (``data_time``, ``comm_time``),
next to the ``step_time`` that ``report`` measures itself; rigdeck's job view reads the shares
from them (input-bound, communication-bound, stragglers).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Iterator, Optional, TypeVar

from runtime.metrics import add_time

T = TypeVar("T")


def timed(iterable: Iterable[T], field: str = "data_time") -> Iterator[T]:
    """Yield ``iterable``'s items unchanged, adding the seconds spent waiting for each to the
    next step report's ``field`` (``data_time``). Wrap a DataLoader, a generator, any iterable::

        for batch in runtime.timed(loader):
            ...
            runtime.report(step=step, loss=loss)
    """
    it = iter(iterable)
    while True:
        t0 = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            add_time(field, time.perf_counter() - t0)
            return
        add_time(field, time.perf_counter() - t0)
        yield item


class CommTimer:
    """Wall time during which at least one all-reduce is in flight (overlapping buckets are
    counted once), added to the next step report's ``comm_time``."""

    def __init__(self, field: str = "comm_time") -> None:
        self.field = field
        self._lock = threading.Lock()
        self._in_flight = 0
        self._since = 0.0
        self.total = 0.0  # seconds since this timer was made

    def started(self) -> None:
        with self._lock:
            if self._in_flight == 0:
                self._since = time.perf_counter()
            self._in_flight += 1

    def finished(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                seconds = time.perf_counter() - self._since
                self.total += seconds
                add_time(self.field, seconds)


def comm_timer(ddp_model: Any, process_group: Optional[Any] = None) -> CommTimer:
    """Register a DDP communication hook on ``ddp_model`` that does DDP's own all-reduce
    (``allreduce_hook``: sum, then divide by the world size) and times it. Returns the timer.

    Works with any backend (NCCL, gloo on CPU). A model that is not a
    DistributedDataParallel (``runtime.ddp`` without a process group) gets no hook; the timer
    then stays at zero.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    timer = CommTimer()
    if not isinstance(ddp_model, DistributedDataParallel):
        return timer

    # No annotations: DDP checks a hook's and refuses any other than its own types.
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        timer.started()
        fut = allreduce_hook(state, bucket)

        def done(f):  # type: ignore[no-untyped-def]
            timer.finished()
            return f.value()

        return fut.then(done)

    ddp_model.register_comm_hook(process_group, hook)
    return timer
