"""Minimal reader/writer for the safetensors layout used by tptrain exports.

The layout: an 8-byte little-endian unsigned header length N, N bytes of
JSON (name -> {"dtype", "shape", "data_offsets": [begin, end]}, plus an
optional "__metadata__" object of string -> string), then the raw
little-endian tensor data; offsets are relative to the start of that data.

This is written here rather than imported because the test machines do not
have the `safetensors` package, and because an independent parser is itself a
check of the C writer: every byte range is validated and any inconsistency is
reported with the file name and what is wrong. Only the dtypes tptrain uses
are supported (F32, I32, I64).
"""

import json
import struct

import numpy as np
import torch

# safetensors dtype tag -> (numpy little-endian dtype, torch dtype)
_DTYPES = {
    "F32": (np.dtype("<f4"), torch.float32),
    "I32": (np.dtype("<i4"), torch.int32),
    "I64": (np.dtype("<i8"), torch.int64),
}
_TAG_OF_TORCH = {tdt: tag for tag, (_, tdt) in _DTYPES.items()}


class SafetensorsError(ValueError):
    """A file that does not follow the safetensors layout."""


def load(path):
    """Read `path`; return (dict name -> torch tensor, metadata dict)."""
    with open(path, "rb") as f:
        blob = f.read()

    def fail(what):
        raise SafetensorsError(f"{path}: {what}")

    if len(blob) < 8:
        fail(f"file is {len(blob)} bytes, too short for the 8-byte header size")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if hlen > len(blob) - 8:
        fail(f"header size {hlen} exceeds the {len(blob) - 8} bytes after it")
    try:
        header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"header is not valid JSON ({e})")
    if not isinstance(header, dict):
        fail("header JSON is not an object")

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        fail("__metadata__ is not an object of string values")

    data = memoryview(blob)[8 + hlen:]
    tensors = {}
    for name, info in header.items():
        try:
            tag, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            fail(f"tensor '{name}' lacks dtype/shape/data_offsets")
        if tag not in _DTYPES:
            fail(f"tensor '{name}' has unsupported dtype '{tag}'")
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and d >= 0 for d in shape):
            fail(f"tensor '{name}' has an invalid shape {shape}")
        npdt, _ = _DTYPES[tag]
        numel = int(np.prod(shape, dtype=np.int64))
        if not (isinstance(begin, int) and isinstance(end, int)
                and 0 <= begin <= end <= len(data)):
            fail(f"tensor '{name}' byte range [{begin}, {end}) lies outside "
                 f"the {len(data)}-byte data section")
        if end - begin != numel * npdt.itemsize:
            fail(f"tensor '{name}' byte range [{begin}, {end}) holds {end - begin} "
                 f"bytes, but {tag}{list(shape)} needs {numel * npdt.itemsize}")
        arr = np.frombuffer(data[begin:end], dtype=npdt).reshape(shape)
        tensors[name] = torch.from_numpy(arr.astype(npdt.newbyteorder("="), copy=True))
    return tensors, dict(metadata)


def save(path, tensors, metadata=None):
    """Write `tensors` (name -> tensor of float32/int32/int64) to `path`.

    Tensors are stored in the given order; the JSON header is padded with
    spaces so that the data section starts at a multiple of 8 bytes.
    """
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks, offset = [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in _TAG_OF_TORCH:
            raise SafetensorsError(f"{path}: tensor '{name}' has unsupported dtype {t.dtype}")
        tag = _TAG_OF_TORCH[t.dtype]
        raw = t.numpy().astype(_DTYPES[tag][0], copy=False).tobytes()
        header[name] = {"dtype": tag, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for raw in chunks:
            f.write(raw)
