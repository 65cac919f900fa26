"""The weights store (name -> NumPy array) and its safetensors file format.

The format is the public safetensors layout: an 8-byte little-endian header length, a JSON
header mapping each name to its dtype, shape and byte offsets, then the raw little-endian
data. Writing is atomic (a temporary file renamed into place), so a crash mid-save leaves
the previous file intact.
"""

from __future__ import annotations

import json
import os
import struct
from math import prod
from pathlib import Path
from typing import Iterator, MutableMapping

import numpy as np

from .diagnostics import WeightsError
from .dtypes import DType, DTYPES, from_numpy

# safetensors dtype names (F8_E8M0 is the name recent safetensors releases use). The fnuz
# float8 variants and the 4/2-bit types have no standard name, and safetensors packs its 4-bit
# F4 two to a byte where NumPy keeps one per byte, so saving them is refused (_NO_ST_NAME).
_ST_NAMES = {"bool": "BOOL", "u8": "U8", "i8": "I8", "i16": "I16", "i32": "I32", "i64": "I64",
             "f16": "F16", "bf16": "BF16", "f32": "F32", "f64": "F64", "u16": "U16", "u32": "U32", "u64": "U64",
             "f8e4m3fn": "F8_E4M3", "f8e5m2": "F8_E5M2", "f8e8m0": "F8_E8M0"}
DTYPE_OF_SAFETENSORS_NAME = {v: k for k, v in _ST_NAMES.items()}
_NO_ST_NAME = ("f8e4m3fnuz", "f8e5m2fnuz", "f4e2m1", "i4", "u4", "i2", "u2")


class Weights(MutableMapping[str, np.ndarray]):
    """Named arrays that feed a graph's ``param`` and ``state`` inputs."""

    def __init__(self, arrays: dict[str, np.ndarray] | None = None) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        for k, v in (arrays or {}).items():
            self[k] = v

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __setitem__(self, name: str, value) -> None:
        if not isinstance(name, str):
            raise WeightsError(f"weight names are strings, got {name!r}")
        arr = np.asarray(value)
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        try:
            from_numpy(arr.dtype)
        except KeyError:
            raise WeightsError(f"weight '{name}' has dtype {arr.dtype}, which partita does not support") from None
        self._arrays[name] = arr

    def __delitem__(self, name: str) -> None:
        del self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        return f"Weights({', '.join(f'{k}: {from_numpy(v.dtype)}{list(v.shape)}' for k, v in self._arrays.items())})"

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def save(self, path: str | os.PathLike) -> None:
        """Write a safetensors file atomically (a ``.tmp`` file beside it, then a rename)."""
        save_safetensors(path, self._arrays)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Weights":
        """Read a safetensors file; raises WeightsError if it is missing or corrupt."""
        return cls(load_safetensors(path))


def save_safetensors(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` as a safetensors file; the old file stays intact until the rename."""
    path = Path(path)
    header: dict[str, dict] = {}
    offset = 0
    blobs = []
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr).reshape(np.shape(arr))  # keeps rank 0 (ascontiguousarray makes it 1)
        dt: DType = from_numpy(arr.dtype)
        if dt.name in _NO_ST_NAME:
            raise WeightsError(f"{path}: weight '{name}' has dtype {dt}, which the safetensors format has no "
                               f"name for; cast it to a wider type (f16/f32, or i8/u8 for integers) before saving")
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _ST_NAMES[dt.name], "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(head)))
            f.write(head)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise WeightsError(f"{path}: cannot write the weights file ({e.strerror or e})") from None


def load_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a safetensors file into arrays; every defect is a WeightsError naming the file."""
    path = Path(path)
    if not path.exists():
        raise WeightsError(f"{path}: weights file not found")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise WeightsError(f"{path}: cannot read the weights file ({e.strerror or e})") from None
    if len(raw) < 8:
        raise WeightsError(f"{path}: not a safetensors file (only {len(raw)} bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise WeightsError(f"{path}: header of {n} bytes runs past the end of the file ({len(raw)} bytes): truncated or corrupt")
    try:
        header = json.loads(raw[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{path}: corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: corrupt safetensors header (not a JSON object)")
    data = memoryview(raw)[8 + n:]
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dt = DTYPES[DTYPE_OF_SAFETENSORS_NAME[info["dtype"]]]
            shape = tuple(_nonneg_int(d) for d in info["shape"])
            start, end = (_nonneg_int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise WeightsError(f"{path}: tensor '{name}' has an invalid or unsupported entry {info!r}") from None
        count = prod(shape)
        if not 0 <= start <= end <= len(data) or end - start != count * dt.itemsize:
            raise WeightsError(f"{path}: tensor '{name}' has data offsets {start}..{end} that do not fit its shape "
                               f"{list(shape)} or the file ({len(data)} data bytes): truncated or corrupt")
        arr = np.frombuffer(data[start:end], dtype=dt.np.newbyteorder("<") if dt.itemsize > 1 else dt.np)
        out[name] = arr.astype(dt.np, copy=True).reshape(shape)
    return out


def _nonneg_int(x) -> int:
    # JSON true/false and floats are not sizes; int() would quietly accept them.
    if type(x) is not int or x < 0:
        raise ValueError(x)
    return x
