"""A training state as one JSON header and the bytes of its tensors, back to back: the form of a
memory snapshot (``Checkpointer.snapshot``), cheaper to write than ``torch.save``'s.

``torch.save`` writes a zip record per tensor (about 100 for a small model with its Adam state):
most of a snapshot's time went there (``bench/snapshot_cost.py``). Here the structure (dicts, lists,
tuples, scalars) is one JSON document in which each tensor is an index, and every tensor's bytes
are one ``torch.cat`` copy per device (one device-to-host copy for a GPU's tensors), written as
they are::

    RDFLAT1\\n | header length (8 bytes, little-endian) | header (JSON) | the tensors' bytes

The header holds the tree, each tensor's dtype, shape, byte count, device (and whether it requires
grad), and the bytes' total:
a short or long file is refused. Reading runs no pickle: nothing in a snapshot (a peer's included)
can run code, whatever ``weights_only`` says. A state this form cannot hold exactly (a tensor
subclass such as ``nn.Parameter``, a sparse or quantized tensor, a numpy array, any other object)
is not encoded (``encode`` returns None) and the caller uses ``torch.save``.
"""

from __future__ import annotations

import collections
import ctypes
import json
import warnings
from typing import Any, List, Optional, Tuple

MAGIC = b"RDFLAT1\n"
_LEN = 8


class NotFlat(Exception):
    """The state holds something this form cannot keep exactly."""


def _tree(x: Any, tensors: List[Any], torch: Any) -> Any:
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is torch.Tensor:
        if x.layout != torch.strided or x.is_quantized or x.device.type == "meta":
            raise NotFlat(f"a {x.layout} tensor")
        tensors.append(x)
        return ["T", len(tensors) - 1]
    if t is list or t is tuple:
        return ["L" if t is list else "U", [_tree(v, tensors, torch) for v in x]]
    if t is dict or t is collections.OrderedDict:
        items = [[_tree(k, tensors, torch), _tree(v, tensors, torch)] for k, v in x.items()]
        if t is dict:
            return ["D", items]
        meta = getattr(x, "_metadata", None)  # a module's state_dict versions (load_state_dict reads them)
        return ["O", items, None if meta is None else _tree(meta, tensors, torch)]
    raise NotFlat(f"a {t.__module__}.{t.__qualname__}")


def _view(ctypes_addr: int, n: int) -> memoryview:
    return memoryview((ctypes.c_ubyte * n).from_address(ctypes_addr)).cast("B")


def encode(obj: Any) -> Optional[Tuple[List[Any], List[Any]]]:
    """``(parts, keep)``: the buffers to write one after the other, and what must stay alive
    until they are written (the tensors they view); None where ``obj`` holds something this form
    cannot keep (write it with ``torch.save``)."""
    import torch

    tensors: List[Any] = []
    try:
        tree = _tree(obj, tensors, torch)
    except NotFlat:
        return None
    groups: "collections.OrderedDict[Any, List[int]]" = collections.OrderedDict()
    for i, t in enumerate(tensors):
        groups.setdefault(t.device, []).append(i)
    meta: List[Any] = [None] * len(tensors)
    blobs: List[Any] = []
    offset = 0
    with torch.no_grad():
        for device, idx in groups.items():
            views = []
            for i in idx:
                t = tensors[i].detach()
                if t.is_conj():
                    t = t.resolve_conj()
                if t.is_neg():
                    t = t.resolve_neg()
                n = t.numel() * t.element_size()
                views.append(t.contiguous().reshape(-1).view(torch.uint8))
                meta[i] = [str(t.dtype).rsplit(".", 1)[-1], list(t.shape), n, str(device)]
                if tensors[i].requires_grad:
                    meta[i].append(1)
            blob = views[0].clone() if len(views) == 1 else torch.cat(views)
            if blob.device.type != "cpu":
                blob = blob.cpu()  # one copy off the device for all of its tensors
            blobs.append(blob)
            offset += blob.numel()
    header = json.dumps({"tree": tree, "tensors": meta, "bytes": offset},
                        separators=(",", ":")).encode()
    parts: List[Any] = [MAGIC + len(header).to_bytes(_LEN, "little") + header]
    parts += [_view(b.data_ptr(), b.numel()) for b in blobs if b.numel()]
    return parts, blobs


def is_flat(data: Any) -> bool:
    return bytes(data[:len(MAGIC)]) == MAGIC


class FormatError(ValueError):
    """Bytes that claim this form and do not hold it whole."""


def decode(data: Any, map_location: Any = None) -> Any:
    """The object ``encode`` wrote into ``data`` (bytes-like), each tensor in new memory of its
    own, on the device it was on (``map_location``: as ``torch.load``'s: a device, a name, a dict of
    names, or a function of (storage, location)). A short, long or malformed ``data`` raises
    ``FormatError``."""
    import torch

    view = memoryview(data).cast("B")
    if not is_flat(view) or len(view) < len(MAGIC) + _LEN:
        raise FormatError("not a rigdeck flat state (no RDFLAT1 header)")
    n = int.from_bytes(view[len(MAGIC):len(MAGIC) + _LEN], "little")
    base = len(MAGIC) + _LEN + n
    if base > len(view):
        raise FormatError(f"header of {n} bytes, only {len(view) - len(MAGIC) - _LEN} present")
    try:
        header = json.loads(bytes(view[len(MAGIC) + _LEN:base]))
        total, specs, tree = int(header["bytes"]), header["tensors"], header["tree"]
    except (ValueError, KeyError, TypeError) as e:
        raise FormatError(f"unreadable header: {e}") from None
    if len(view) - base != total:
        raise FormatError(f"{len(view) - base} bytes of tensors, the header says {total}")
    whole = None
    if total:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read only: every tensor is cloned out of it
            whole = torch.frombuffer(view[base:], dtype=torch.uint8)
    tensors: List[Any] = []
    offset = 0
    if not isinstance(specs, list):
        raise FormatError("tensors: expected a list")
    for i, spec in enumerate(specs):
        try:
            dname, shape, nbytes, location, *grad = spec
            if grad not in ([], [1]):
                raise FormatError(f"tensor {i}: malformed {spec!r}")
            dtype = getattr(torch, dname) if isinstance(dname, str) else None
            if not isinstance(dtype, torch.dtype):
                raise FormatError(f"tensor {i}: unknown dtype {dname!r}")
            if grad and not (dtype.is_floating_point or dtype.is_complex):
                raise FormatError(f"tensor {i}: a {dname} tensor cannot require grad")
            if (not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape)
                    or type(nbytes) is not int or not isinstance(location, str)):
                raise FormatError(f"tensor {i}: malformed {spec!r}")
            numel = 1
            for s in shape:
                numel *= s
            if numel * torch.empty((), dtype=dtype).element_size() != nbytes or offset + nbytes > total:
                raise FormatError(f"tensor {i}: {nbytes} bytes do not fit {dname}{shape}")
        except (TypeError, ValueError) as e:
            if isinstance(e, FormatError):
                raise
            raise FormatError(f"tensor {i}: malformed {spec!r}") from None
        if nbytes and whole is not None:
            t = whole[offset:offset + nbytes].clone().view(dtype).reshape(shape)
        else:
            t = torch.empty(shape, dtype=dtype)
        offset += nbytes
        t = _place(t, location, map_location, torch)
        tensors.append(t.requires_grad_() if grad else t)
    if offset != total:
        raise FormatError(f"the tensors hold {offset} bytes, the header says {total}")
    try:
        return _untree(tree, tensors)
    except (TypeError, ValueError, IndexError) as e:
        if isinstance(e, FormatError):
            raise
        raise FormatError(f"malformed tree: {e}") from None


def _place(t: Any, location: str, map_location: Any, torch: Any) -> Any:
    if map_location is None:
        target: Any = location
    elif isinstance(map_location, dict):
        target = map_location.get(location, location)
    elif callable(map_location):
        storage = map_location(t.untyped_storage(), location)
        if storage is None:
            return t.to(location) if location != "cpu" else t
        return torch.empty(0, dtype=t.dtype, device=storage.device).set_(storage, 0, t.shape, t.stride())
    else:
        target = map_location
    return t if str(target) == "cpu" else t.to(target)


def _untree(x: Any, tensors: List[Any]) -> Any:
    if x is None or type(x) in (bool, int, float, str):
        return x
    if type(x) is not list or not x or not isinstance(x[0], str):
        raise FormatError(f"malformed tree node {x!r:.60}")
    tag = x[0]
    if tag == "T" and len(x) == 2 and type(x[1]) is int and 0 <= x[1] < len(tensors):
        return tensors[x[1]]
    if tag in ("L", "U") and len(x) == 2 and type(x[1]) is list:
        items = [_untree(v, tensors) for v in x[1]]
        return items if tag == "L" else tuple(items)
    if tag in ("D", "O") and len(x) == (2 if tag == "D" else 3) and type(x[1]) is list:
        pairs = []
        for kv in x[1]:
            if type(kv) is not list or len(kv) != 2:
                raise FormatError(f"malformed dict item {kv!r:.60}")
            pairs.append((_untree(kv[0], tensors), _untree(kv[1], tensors)))
        if tag == "D":
            return dict(pairs)
        out: Any = collections.OrderedDict(pairs)
        if x[2] is not None:
            out._metadata = _untree(x[2], tensors)
        return out
    raise FormatError(f"malformed tree node {x!r:.60}")


__all__ = ["MAGIC", "FormatError", "decode", "encode", "is_flat"]
