"""Where a memory snapshot's time goes: ``runtime.Checkpointer.snapshot``'s form against
``torch.save``'s and other ways to put the same state into a host's tmpfs.

One process, one thread, the ddp example's state (``examples/ddp/train.py``'s ``CharTransformer``
with its Adam state, about 1 MB in about 120 tensors), each way timed ``--repeat`` times, medians:

- ``rigdeck``: what the snapshot does per host: the flat form (``runtime.flatstate``: one JSON
  header with each tensor as an index, every tensor's bytes in one ``torch.cat`` copy), written
  into ``/dev/shm`` buffer by buffer; read back and compared tensor by tensor first.
- ``torch_save`` (the baseline, and rigdeck's form until this commit): ``torch.save`` of the
  same ``(step, state)`` into a buffer (no CRC32), then one write of the buffer;
- its two parts: ``torch.save`` alone, the tmpfs write alone;
- ``torch.save`` in its legacy (non-zip) format;
- ``pickle_flat``: the structure pickled with each tensor as a persistent id, then the tensors'
  bytes in one copy (read back and compared too): a flat form with pickle's reader, which runs
  code from the file; rigdeck's reads JSON.
- ``state_build``: building the state itself (the example's ``state_of``: ``model.state_dict()``,
  ``opt.state_dict()``), which a script that passes ``snapshot`` the state, not a function
  returning it, pays on every rank at every step, snapshot or not.

Usage: .venv/bin/python bench/snapshot_cost.py [--repeat 200]. Writes bench/results/snapshot_cost.json.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "ddp"))

from bench._meta import run_meta, write_result  # noqa: E402


def example_model() -> tuple[Any, Any]:
    """The ddp example's model and its Adam optimizer after one step (its state exists)."""
    import torch
    from train import CharTransformer  # examples/ddp/train.py

    torch.manual_seed(0)
    model = CharTransformer(65, 32)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randint(0, 65, (4, 32))).sum().backward()
    opt.step()
    return model, opt


def check_flat(path: str, state: Any) -> None:
    """Read the ``flat`` form back (the structure's pickle, then the tensors' bytes in order) and
    require every tensor equal to the state's: the cheaper way is timed only if it is whole."""
    import torch

    raw = Path(path).read_bytes()
    buf = io.BytesIO(raw)
    spans: list[tuple[int, str, tuple[int, ...]]] = []

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            spans.append(pid)
            return pid

    skeleton = Unpickler(buf).load()
    blob, off, got = memoryview(raw)[buf.tell():], 0, []
    for _i, dtype, shape in spans:
        dt = getattr(torch, dtype.removeprefix("torch."))
        n = torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size()
        got.append(torch.frombuffer(bytearray(blob[off:off + n]), dtype=torch.uint8).view(dt).reshape(shape))
        off += n
    if off != len(blob):
        raise SystemExit(f"flat form: {len(blob) - off} bytes left over")
    want = tensors_of(state)
    same = len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    if skeleton[0] != state[0] or not same:
        raise SystemExit("flat form: the state read back differs")


def tensors_of(x: Any) -> list[Any]:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors_of(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in tensors_of(v)]
    return []


def median_ms(fn: Callable[[], None], repeat: int) -> float:
    fn()  # warm
    xs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "snapshot_cost.json"))
    args = ap.parse_args()
    meta = run_meta()
    import torch

    from runtime.checkpoint import _loads, _snapshot_parts, _torch_save

    torch.set_num_threads(1)
    from train import state_of  # examples/ddp/train.py

    model, opt = example_model()
    # what the example passes ``snapshot`` under the default ``rank0`` policy: its own state_of
    build = functools.partial(state_of, model, opt, 1, "rank0")
    state = (1, build())
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        path = os.path.join(d, "snap.bin")

        def write(*parts: Any) -> None:
            with open(path, "wb") as f:
                for p in parts:
                    f.write(p)

        def rigdeck() -> None:
            parts, _keep = _snapshot_parts(state)
            write(*parts)

        def torch_save() -> None:
            buf = io.BytesIO()
            _torch_save(state, buf)
            write(buf.getvalue())

        def save_only() -> None:
            _torch_save(state, io.BytesIO())

        saved = io.BytesIO()
        _torch_save(state, saved)
        data = saved.getvalue()

        def legacy() -> None:
            buf = io.BytesIO()
            torch.save(state, buf, _use_new_zipfile_serialization=False)
            write(buf.getvalue())

        def flat() -> None:
            tensors: list[Any] = []

            class Pickler(pickle.Pickler):
                def persistent_id(self, obj: Any) -> Any:
                    if isinstance(obj, torch.Tensor):
                        tensors.append(obj)
                        return (len(tensors) - 1, str(obj.dtype), tuple(obj.shape))
                    return None

            buf = io.BytesIO()
            Pickler(buf, protocol=5).dump(state)
            blob = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors])
            write(buf.getvalue(), memoryview(blob.numpy()))

        flat()  # the pickled flat form holds the same state: read it back and compare every tensor
        check_flat(path, state)
        rigdeck()  # and so does rigdeck's, read by its own reader
        back = _loads(Path(path).read_bytes(), "cpu", True)
        if back[0] != state[0] or not all(torch.equal(a, b) for a, b in zip(
                tensors_of(back), tensors_of(state), strict=True)):
            raise SystemExit("rigdeck's snapshot: the state read back differs")
        ways = {"rigdeck": rigdeck, "torch_save": torch_save, "torch_save_only": save_only,
                "tmpfs_write_only": lambda: write(data), "torch_save_legacy": legacy, "pickle_flat": flat,
                "state_build": build}
        ms = {name: median_ms(fn, args.repeat) for name, fn in ways.items()}
    print(f"the ddp example's state, {len(data) / 1e6:.2f} MB; median of {args.repeat}, one thread")
    for name, v in ms.items():
        print(f"  {name:18} {v:6.2f} ms   {v / ms['torch_save']:.2f}x torch.save's")
    print(f"rigdeck's snapshot costs {ms['rigdeck'] / ms['torch_save']:.2f}x the torch.save way")
    print(f"building the state (model.state_dict(), opt.state_dict()) costs {ms['state_build']:.3f} ms: what a "
          "snapshot call given the state itself pays on every rank and every step; given a function, only "
          "where it writes")
    write_result(args.out, {"state_mb": len(data) / 1e6, "repeat": args.repeat, "median_ms": ms,
                            "ratio_rigdeck_to_torch_save": ms["rigdeck"] / ms["torch_save"]}, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
