"""The flat form of a memory snapshot (runtime/flatstate.py): what it keeps exactly, what it leaves
to torch.save, and what it refuses to read."""

from __future__ import annotations

import collections
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime import flatstate
from runtime.checkpoint import Checkpointer, CheckpointError, _dumps, _loads

ROOT = Path(__file__).resolve().parent.parent
torch = pytest.importorskip("torch")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (type(b) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape
                and a.requires_grad == b.requires_grad
                and torch.equal(a.resolve_conj().resolve_neg(), b))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


def _trained_state() -> Any:
    sys.path.insert(0, str(ROOT / "examples" / "ddp"))
    try:
        from train import CharTransformer  # examples/ddp/train.py
    finally:
        sys.path.remove(str(ROOT / "examples" / "ddp"))
    torch.manual_seed(0)
    model = CharTransformer(65, 32)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randint(0, 65, (4, 32))).sum().backward()
    opt.step()
    return model, opt


def test_a_model_and_its_adam_state_come_back_exactly_each_tensor_in_its_own_memory() -> None:
    model, opt = _trained_state()
    odd = {
        1: (1.5, float("nan"), float("inf"), None, True, "s", 2**70),  # int keys, tuples, big ints
        "rng": torch.get_rng_state(),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(3.0),
        "bool": torch.tensor([True, False, True]),
        "bf16_transposed": torch.randn(4, 5).to(torch.bfloat16).t(),  # not contiguous
        "int64_slice": torch.arange(20)[::3],
        "complex_conj": torch.randn(3, dtype=torch.complex64).conj(),  # a conjugate view
        "nested": [[torch.ones(2)], ()],
        "leaf": torch.ones(2, requires_grad=True),
    }
    state = (7, {"model": model.state_dict(), "optimizer": opt.state_dict(), "odd": odd})
    data = _dumps(state)
    assert flatstate.is_flat(data)
    got = _loads(data, "cpu", True)
    assert _same(state, got)
    assert got[1]["model"]._metadata == state[1]["model"]._metadata  # load_state_dict reads it
    for t in [v for v in got[1]["model"].values()] + [got[1]["odd"]["scalar"]]:
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()  # not a view of the file
    again, _ = _trained_state()
    again.load_state_dict(got[1]["model"])
    opt2 = torch.optim.Adam(again.parameters())
    opt2.load_state_dict(got[1]["optimizer"])
    x = torch.randint(0, 65, (2, 32))
    assert torch.equal(model(x), again(x))


@pytest.mark.parametrize("value", [torch.nn.Parameter(torch.ones(2)), {"s": {1, 2}},
                                   torch.ones(3).to_sparse(), collections.Counter(a=1)])
def test_what_the_flat_form_cannot_hold_exactly_goes_through_torch_save(value: Any, tmp_path: Path) -> None:
    assert flatstate.encode({"x": value}) is None
    data = _dumps({"x": value})
    assert data[:2] == b"PK"  # torch.save's zip
    got = _loads(data, "cpu", False)["x"]
    assert type(got) is type(value)


def _env(tmp_path: Path) -> dict[str, str]:
    """One rank of a one-host rigdeck job, its snapshots in tmp_path/shm."""
    return {"RIGDECK_JOB_ID": "job-flat", "RIGDECK_HOSTS": json.dumps(["h1"]), "RIGDECK_CURRENT_HOST": "h1",
            "RIGDECK_NODE_RANK": "0", "RIGDECK_NUM_NODES": "1", "RIGDECK_RANK": "0", "RIGDECK_LOCAL_RANK": "0",
            "RIGDECK_WORLD_SIZE": "1", "RIGDECK_LOCAL_WORLD_SIZE": "1",
            "RIGDECK_METRICS_DIR": str(tmp_path / "metrics"), "SAGEMAKER_BASE_DIR": str(tmp_path / "no-sm"),
            "RIGDECK_MEMORY_DIR": str(tmp_path / "shm")}


def test_a_snapshot_is_written_flat_and_read_back_by_load_latest(tmp_path: Path) -> None:
    model, opt = _trained_state()
    c = Checkpointer(str(tmp_path / "ckpt"), environ=_env(tmp_path))
    assert c.snapshot(3, {"model": model.state_dict(), "optimizer": opt.state_dict()}, every=1)
    snap = tmp_path / "shm" / "step-00000003.snap"
    assert snap.read_bytes().startswith(flatstate.MAGIC)
    step, state = c.load_latest()
    assert step == 3 and c.restored_from["source"] == "memory"
    assert _same(model.state_dict(), state["model"])
    # a state with a Parameter in it still snapshots (torch.save's form) and comes back
    assert c.snapshot(4, {"p": torch.nn.Parameter(torch.ones(2))}, every=1)
    assert (tmp_path / "shm" / "step-00000004.snap").read_bytes()[:2] == b"PK"
    step, state = c.load_latest(weights_only=False)
    assert step == 4 and isinstance(state["p"], torch.nn.Parameter)


def test_a_short_or_long_snapshot_is_refused_with_what_is_wrong(tmp_path: Path) -> None:
    c = Checkpointer(str(tmp_path / "ckpt"), environ=_env(tmp_path))
    assert c.snapshot(5, {"w": torch.arange(1000, dtype=torch.float32)}, every=1)
    snap = tmp_path / "shm" / "step-00000005.snap"
    whole = snap.read_bytes()
    snap.write_bytes(whole[:-1])
    with pytest.raises(CheckpointError, match="3999 bytes of tensors, the header says 4000"):
        c.load_latest()
    snap.write_bytes(whole + b"x")
    with pytest.raises(CheckpointError, match="4001 bytes of tensors"):
        c.load_latest()
    snap.write_bytes(whole[:20])
    with pytest.raises(CheckpointError, match="header of"):
        c.load_latest()


def _forged(header: dict, payload: bytes = b"") -> bytes:
    import json

    h = json.dumps(header).encode()
    return flatstate.MAGIC + len(h).to_bytes(8, "little") + h + payload


@pytest.mark.parametrize("header,problem", [
    ({"tree": ["T", 0], "tensors": [["load", [1], 4, "cpu"]], "bytes": 4}, "unknown dtype 'load'"),
    ({"tree": ["T", 0], "tensors": [["float32", [2], 4, "cpu"]], "bytes": 4}, "4 bytes do not fit float32"),
    ({"tree": ["T", 1], "tensors": [["float32", [1], 4, "cpu"]], "bytes": 4}, "malformed tree node"),
    ({"tree": ["X", []], "tensors": [], "bytes": 0}, "malformed tree node"),
    ({"tree": ["D", [[["L", []], 1]]], "tensors": [], "bytes": 0}, "malformed tree"),  # a list as a key
    ({"tree": ["T", 0], "tensors": [["float32", [-1], 4, "cpu"]], "bytes": 4}, "malformed"),
    ({"tensors": [], "bytes": 0}, "unreadable header"),
    ({"tree": ["T", 0], "tensors": [["int32", [1], 4, "cpu", 1]], "bytes": 4}, "cannot require grad"),
    ({"tree": ["T", 0], "tensors": [["float32", [1], 4, "cpu", 2]], "bytes": 4}, "malformed"),
])
def test_a_forged_header_is_refused_and_runs_nothing(header: dict, problem: str) -> None:
    payload = b"\0" * int(header.get("bytes", 0))
    with pytest.raises(flatstate.FormatError, match=problem):
        flatstate.decode(_forged(header, payload))


def test_map_location_as_torch_load_takes_it() -> None:
    data = _dumps({"w": torch.ones(2)})
    assert flatstate.decode(data, {"cpu": "meta"})["w"].device.type == "meta"
    assert flatstate.decode(data, "meta")["w"].device.type == "meta"
    seen = []

    def where(storage: Any, location: str) -> Any:
        seen.append(location)
        return storage
    got = flatstate.decode(data, where)["w"]
    assert seen == ["cpu"] and torch.equal(got, torch.ones(2))
