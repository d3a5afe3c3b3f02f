"""Exact, pickle-free encoding of Python values as tagged JSON nodes plus a flat tensor table.

Loading never runs code; plain JSON would lose tuples, non-str dict keys, bytes, numpy values and tensors.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np
import torch

from nemo_dp.utils.packed_tensor import PackedTensor

__all__ = ["CorruptValueError", "UnencodableValueError", "ValueEncoder", "decode_value"]

_MAX_DEPTH = 200
_MAX_BARE_INT_BITS = 4096  # ~1233 decimal digits, far below the interpreter's str limit
_SEQUENCES: dict[type, str] = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}
_SEQUENCE_TYPES: dict[str, type] = {tag: kind for kind, tag in _SEQUENCES.items()}
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class UnencodableValueError(TypeError):
    """A value has no representation in the typed checkpoint encoding."""


class CorruptValueError(ValueError):
    """An encoded node is malformed or refers to a missing or inconsistent tensor."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class ValueEncoder:
    """Encodes values into JSON nodes; tensors go into the shared ``tensors`` table under ``key_prefix``.

    ``None``, ``bool``, ``int``, ``str`` and finite ``float`` are bare JSON; any other value is an
    object whose ``"t"`` names its type:

    ===================  ==============================================================
    ``"int"``            ``{"hex": str}`` (ints too long for decimal JSON text, > 4096 bits)
    ``"float"``          ``{"v": "nan" | "inf" | "-inf"}`` (non-finite floats)
    ``"complex"``        ``{"re": node, "im": node}``
    ``"bytes"``          ``{"b64": str}``; ``"bytearray"`` likewise
    ``"list"``           ``{"v": [node, ...]}``; ``"tuple"``, ``"set"``, ``"frozenset"`` likewise
    ``"dict"``           ``{"k": [node, ...], "v": [node, ...]}`` (any encodable keys, in order)
    ``"tensor"``         ``{"key": str, "requires_grad": bool}`` -> a dense CPU tensor in the table
    ``"ndarray"``        ``{"dtype": str, "shape": [int], "key": str}`` -> raw bytes (uint8) in
                         the table; object arrays: ``{"dtype": "|O", "shape": [...], "v": [...]}``
    ``"npscalar"``       ``{"dtype": str, "b64": str}`` (raw bytes of one numpy scalar)
    ``"packed"``         ``{"dim": int, "v": [tensor node | null, ...]}`` (a ``PackedTensor``:
                         its packing dim and one entry per sample, ``null`` for ``None``)
    ===================  ==============================================================

    ``key_prefix`` must be unique per encoder of one table.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], key_prefix: str) -> None:
        self._tensors = tensors
        self._prefix = key_prefix
        self._count = 0

    def encode(self, value: Any) -> Any:
        """Encode one value into a JSON node; types match exactly (a namedtuple or ``IntEnum`` is refused).

        Raises:
            UnencodableValueError: The value or a part (named by path, e.g. ``value[0]['k']``) has no
                exact form: also reference cycles, nested/non-CPU/subclassed tensors, structured dtypes.
        """
        return self._node(value, "value", set(), 0)

    def _key(self) -> str:
        key = f"{self._prefix}.{self._count}"
        self._count += 1
        return key

    def _node(self, value: Any, path: str, active: set[int], depth: int) -> Any:
        kind = type(value)
        if kind is int and value.bit_length() > _MAX_BARE_INT_BITS:
            # decimal text of huge ints is capped by the interpreter; hex is not
            return {"t": "int", "hex": format(value, "x")}
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            if math.isfinite(value):
                return value
            text = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
            return {"t": "float", "v": text}
        if kind is complex:
            return {"t": "complex", "re": self._node(value.real, path, active, depth),
                    "im": self._node(value.imag, path, active, depth)}
        if kind is bytes or kind is bytearray:
            return {"t": kind.__name__, "b64": _b64(bytes(value))}
        if kind is torch.Tensor:
            return self._tensor(value, path)
        if kind is PackedTensor:
            return self._packed(value, path)
        if kind is np.ndarray:
            if value.dtype.hasobject:
                return self._container(value, path, active, depth)
            return self._ndarray(value, path)
        if isinstance(value, np.generic) and kind.__module__ == "numpy":
            if value.dtype.fields is not None or value.dtype.hasobject:
                raise UnencodableValueError(f"{path}: numpy scalar of dtype {value.dtype} is not supported")
            return {"t": "npscalar", "dtype": value.dtype.str, "b64": _b64(value.tobytes())}
        if kind in _SEQUENCES or kind is dict:
            return self._container(value, path, active, depth)
        return self._refuse(value, path)

    @staticmethod
    def _refuse(value: Any, path: str) -> Any:
        kind = type(value)
        raise UnencodableValueError(
            f"{path}: a {kind.__module__}.{kind.__qualname__} value cannot be checkpointed exactly "
            "(supported: None, bool, int, float, complex, str, bytes, bytearray, list, tuple, "
            "set, frozenset, dict, numpy scalars and arrays, dense CPU torch.Tensor, PackedTensor)"
        )

    def _container(self, value: Any, path: str, active: set[int], depth: int) -> dict[str, Any]:
        if depth >= _MAX_DEPTH:
            raise UnencodableValueError(f"{path}: nested deeper than {_MAX_DEPTH} levels")
        if id(value) in active:
            raise UnencodableValueError(f"{path}: the value contains itself (a reference cycle)")
        active.add(id(value))
        try:
            if type(value) is np.ndarray:
                flat = value.reshape(-1)
                items = [self._node(flat[i], f"{path}.flat[{i}]", active, depth + 1) for i in range(flat.size)]
                shape = list(value.shape)
                return {"t": "ndarray", "dtype": value.dtype.str, "shape": shape, "v": items}
            if type(value) is dict:
                keys, vals = [], []
                for i, (k, v) in enumerate(value.items()):
                    keys.append(self._node(k, f"{path}.keys()[{i}]", active, depth + 1))
                    vals.append(self._node(v, f"{path}[{k!r}]", active, depth + 1))
                return {"t": "dict", "k": keys, "v": vals}
            items = [self._node(v, f"{path}[{i}]", active, depth + 1) for i, v in enumerate(value)]
            return {"t": _SEQUENCES[type(value)], "v": items}
        finally:
            active.discard(id(value))

    def _tensor(self, value: torch.Tensor, path: str) -> dict[str, Any]:
        if value.is_nested or value.layout != torch.strided:
            raise UnencodableValueError(f"{path}: a {value.layout} / nested tensor cannot be checkpointed")
        if value.device.type != "cpu":
            raise UnencodableValueError(f"{path}: a tensor on {value.device} cannot be checkpointed exactly")
        key = self._key()
        self._tensors[key] = value.detach().clone(memory_format=torch.contiguous_format)
        return {"t": "tensor", "key": key, "requires_grad": bool(value.requires_grad)}

    def _packed(self, value: PackedTensor, path: str) -> dict[str, Any]:
        entries: list[Any] = []
        for i, t in enumerate(value.tensors):
            where = f"{path}.tensors[{i}]"
            if t is None:
                entries.append(None)
            elif type(t) is torch.Tensor:
                entries.append(self._tensor(t, where))
            else:
                self._refuse(t, where)
        return {"t": "packed", "dim": value.dim_to_pack, "v": entries}

    def _ndarray(self, value: np.ndarray, path: str) -> dict[str, Any]:
        if value.dtype.fields is not None:
            raise UnencodableValueError(f"{path}: a structured numpy dtype {value.dtype} is not supported")
        key = self._key()
        raw = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        self._tensors[key] = torch.from_numpy(raw.copy())
        return {"t": "ndarray", "dtype": value.dtype.str, "shape": list(value.shape), "key": key}


def _fail(where: str, what: str) -> CorruptValueError:
    return CorruptValueError(f"{where}: {what}")


def _field(node: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = node.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise _fail(where, f"node {node.get('t')!r} needs a {name!r} of the right type")
    return value


def _unb64(node: dict[str, Any], where: str) -> bytes:
    try:
        return base64.b64decode(_field(node, "b64", str, where), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _fail(where, f"bad base64 payload: {exc}") from None


def _dtype(node: dict[str, Any], where: str) -> np.dtype:
    text = _field(node, "dtype", str, where)
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError) as exc:
        raise _fail(where, f"unknown numpy dtype {text!r}: {exc}") from None
    if dtype.fields is not None:
        raise _fail(where, f"structured numpy dtype {text!r} is not allowed")
    return dtype


def _shape(node: dict[str, Any], where: str) -> tuple[int, ...]:
    shape = _field(node, "shape", list, where)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise _fail(where, f"bad shape {shape!r}")
    return tuple(shape)


def _table_tensor(node: dict[str, Any], tensors: dict[str, torch.Tensor], where: str) -> torch.Tensor:
    key = _field(node, "key", str, where)
    if key not in tensors:
        raise _fail(where, f"tensor {key!r} is missing from the tensor file")
    return tensors[key]


def decode_value(node: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """Rebuild a fresh value of the same types from a validated :class:`ValueEncoder` node (``where`` locates errors).

    Raises:
        CorruptValueError: Malformed node, unknown tag, missing or inconsistent tensor.
    """
    return _decode(node, tensors, where, 0)


def _decode(node: Any, tensors: dict[str, torch.Tensor], where: str, depth: int) -> Any:
    if node is None or type(node) in (bool, int, str):
        return node
    if type(node) is float:
        if not math.isfinite(node):
            raise _fail(where, "non-finite float stored as a bare number")
        return node
    if type(node) is not dict:
        raise _fail(where, f"a {type(node).__name__} is not a value node")
    if depth > _MAX_DEPTH:
        raise _fail(where, f"nested deeper than {_MAX_DEPTH} levels")
    tag = node.get("t")
    if tag == "int":
        try:
            return int(_field(node, "hex", str, where), 16)
        except ValueError:
            raise _fail(where, "bad hex integer") from None
    if tag == "float":
        text = node.get("v")
        if text not in _NON_FINITE:
            raise _fail(where, f"bad non-finite float {text!r}")
        return _NON_FINITE[text]
    if tag == "complex":
        parts = [_decode(node.get(p), tensors, where, depth + 1) for p in ("re", "im")]
        if not all(type(p) is float for p in parts):
            raise _fail(where, "complex parts must be floats")
        return complex(parts[0], parts[1])
    if tag in ("bytes", "bytearray"):
        return _unb64(node, where) if tag == "bytes" else bytearray(_unb64(node, where))
    if tag in _SEQUENCE_TYPES:
        items = [_decode(v, tensors, where, depth + 1) for v in _field(node, "v", list, where)]
        try:
            return _SEQUENCE_TYPES[tag](items)
        except TypeError as exc:  # an unhashable item in a set
            raise _fail(where, f"bad {tag}: {exc}") from None
    if tag == "dict":
        keys = _field(node, "k", list, where)
        vals = _field(node, "v", list, where)
        if len(keys) != len(vals):
            raise _fail(where, "dict keys and values differ in length")
        out: dict[Any, Any] = {}
        for k, v in zip(keys, vals):
            key = _decode(k, tensors, where, depth + 1)
            try:
                if key in out:
                    raise _fail(where, f"duplicate dict key {key!r}")
                out[key] = _decode(v, tensors, where, depth + 1)
            except TypeError as exc:  # an unhashable key
                raise _fail(where, f"bad dict key: {exc}") from None
        return out
    if tag == "tensor":
        grad = node.get("requires_grad")
        if not isinstance(grad, bool):
            raise _fail(where, "tensor node needs a bool 'requires_grad'")
        t = _table_tensor(node, tensors, where).clone()
        return t.requires_grad_(True) if grad else t
    if tag == "ndarray":
        return _decode_ndarray(node, tensors, where, depth)
    if tag == "packed":
        dim = _field(node, "dim", int, where)
        entries = _field(node, "v", list, where)
        if not entries:
            raise _fail(where, "a packed node needs at least one entry")
        out_entries = []
        for entry in entries:
            if entry is not None and (type(entry) is not dict or entry.get("t") != "tensor"):
                raise _fail(where, "a packed node's entries must be tensor nodes or null")
            out_entries.append(None if entry is None else _decode(entry, tensors, where, depth + 1))
        return PackedTensor(out_entries, dim)
    if tag == "npscalar":
        dtype = _dtype(node, where)
        raw = _unb64(node, where)
        if dtype.hasobject or len(raw) != dtype.itemsize:
            raise _fail(where, f"numpy scalar of dtype {dtype} needs {dtype.itemsize} bytes")
        if dtype.itemsize == 0:  # e.g. np.str_(""): frombuffer cannot read zero-sized items
            return np.zeros((), dtype=dtype)[()]
        return np.frombuffer(raw, dtype=dtype)[0]
    raise _fail(where, f"unknown value node type {tag!r}")


def _decode_ndarray(node: dict[str, Any], tensors: dict[str, torch.Tensor], where: str, depth: int) -> np.ndarray:
    dtype = _dtype(node, where)
    shape = _shape(node, where)
    count = math.prod(shape)
    if dtype.hasobject:
        items = [_decode(v, tensors, where, depth + 1) for v in _field(node, "v", list, where)]
        if len(items) != count:
            raise _fail(where, f"object array of shape {shape} holds {len(items)} items")
        arr = np.empty(count, dtype=dtype)
        for i, item in enumerate(items):
            arr[i] = item
        return arr.reshape(shape)
    raw = _table_tensor(node, tensors, where)
    if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != count * dtype.itemsize:
        raise _fail(where, f"array bytes do not match dtype {dtype} and shape {shape}")
    if count * dtype.itemsize == 0:
        return np.zeros(shape, dtype=dtype)
    return np.frombuffer(raw.numpy().tobytes(), dtype=dtype).reshape(shape).copy()
