"""Reading a folder of trained weights someone may have shared (``harness export``'s
``model.json`` and ``model.safetensors``) without running anything and without a raw
library exception.

* **Nothing runs unless the user says so.** A ``model.json`` whose config names plugin files
  (``plugins:``) is refused unless the caller passes ``trust_plugins=True``
  (``--trust-plugins``): importing them would run their code, as ``trust_remote_code`` would
  elsewhere. Installed plugins (entry points) are the user's own and load as always.
* **Checked before anything is built.** ``model.json`` must be a regular file of JSON with the
  fields export writes (:func:`read_meta`); ``model.safetensors`` must be a regular file whose
  header (its first 8 bytes give the header's length, then JSON naming each tensor's dtype,
  shape and byte range) describes tensors that lie inside the file (:func:`weights_header`).
  The model is then built on PyTorch's ``meta`` device (no memory) and its parameters'
  names and shapes compared with the header (:func:`check_fits`): a config whose sizes do not
  fit the weights (``d_model: 10**6``) is refused before a byte is allocated.
* **Every failure is a** :class:`~harness.errors.HarnessError` naming the folder and the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from harness.errors import HarnessError, shorten
from harness.runtime.files import check_regular, open_regular

#: A safetensors header larger than this is not one (safetensors itself refuses past 100 MB).
MAX_HEADER_BYTES = 100_000_000
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
INFO_FIELDS = ("format", "vocab_size", "max_length")


class DamagedExport(HarnessError):
    """An exported folder that cannot be loaded as it is (the message names the file)."""


def _damaged(folder: Path, name: str, what: str) -> DamagedExport:
    return DamagedExport(f"{folder / name}: {what}. The folder is damaged or not one `harness "
                         f"export` wrote; export the run again (harness export RUN_ID --out DIR).")


def read_meta(folder: Path, name: str) -> dict[str, Any]:
    """``model.json``, checked to hold what export writes."""
    try:
        with open_regular(folder / name, "the model's description") as fh:
            meta = json.loads(fh.read(16 << 20).decode("utf-8"))
    except HarnessError as exc:
        raise DamagedExport(str(exc)) from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _damaged(folder, name, f"not JSON ({shorten(str(exc), 120)})") from None
    if not isinstance(meta, dict):
        raise _damaged(folder, name, f"a JSON {type(meta).__name__}, not an object")
    info = meta.get("info")
    problems = []
    if not isinstance(meta.get("config"), dict):
        problems.append("no 'config' object")
    if not isinstance(info, dict) or not all(k in info for k in INFO_FIELDS):
        problems.append(f"no 'info' object with {', '.join(INFO_FIELDS)}")
    elif not isinstance(info["format"], str) or not all(
            isinstance(info[k], int) and not isinstance(info[k], bool) and 0 < info[k] < 2**31
            for k in ("vocab_size", "max_length")):
        problems.append("'info' sizes that are not positive integers")
    elif not (info.get("num_classes") is None or (isinstance(info["num_classes"], int) and 0 < info["num_classes"] < 2**31)):
        problems.append("an 'info.num_classes' that is not a positive integer")
    elif not isinstance(info.get("extra", {}), dict) or not _id_or_none(info.get("document_token")) \
            or not _id_or_none(info.get("pad_id", 0)):
        problems.append("an 'info.extra' that is not an object, or an 'info.document_token' or "
                        "'info.pad_id' that is not a token id")
    data = meta.get("data", {})
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        problems.append("a 'data' that is not an object of strings")
    if not isinstance(meta.get("symbols"), list) or not all(isinstance(s, str) for s in meta["symbols"]):
        problems.append("no 'symbols' list of strings")
    if not isinstance(meta.get("task_kind"), str):
        problems.append("no 'task_kind'")
    if problems:
        raise _damaged(folder, name, "; ".join(problems))
    return meta


def _id_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31)


def check_trusted(meta: dict[str, Any], folder: Path, trust_plugins: bool) -> None:
    """Refuse a config naming plugin files unless the caller trusts them (see the module)."""
    plugins = meta["config"].get("plugins") or []
    if plugins and not trust_plugins:
        names = ", ".join(shorten(str(p), 100) for p in (plugins if isinstance(plugins, list) else [plugins])[:4])
        raise HarnessError(
            f"{folder}: its model.json names plugin files ({names}); loading it would import and run "
            f"their code. Load it only if you trust where it came from: pass --trust-plugins "
            f"(harness.load_model(..., trust_plugins=True)), or install those plugins and remove "
            f"them from config.plugins in model.json.")


def weights_header(folder: Path, name: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's (dtype, shape) from ``model.safetensors``'s header, checked against the
    file's size (see the module)."""
    path = folder / name
    try:
        size = check_regular(path, "the model's weights").st_size
        with open_regular(path, "the model's weights") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise _damaged(folder, name, f"{size} bytes: too short for a safetensors file (empty or truncated)")
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER_BYTES, size - 8):
                raise _damaged(folder, name, "not a safetensors file (its first bytes give no header "
                                             "that fits the file: another format, e.g. a pickle, or truncated)")
            header = json.loads(fh.read(length).decode("utf-8"))
    except DamagedExport:
        raise
    except HarnessError as exc:
        raise DamagedExport(str(exc)) from None
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise _damaged(folder, name, "not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise _damaged(folder, name, "not a safetensors file (its header is not a JSON object)")
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    data = size - 8 - length
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
            count = 1
            for d in shape:
                count *= d
            ok = dtype in DTYPE_BYTES and all(d >= 0 for d in shape) and 0 <= start <= end <= data \
                and end - start == count * DTYPE_BYTES[dtype]
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise _damaged(folder, name, f"tensor {shorten(str(key), 60)!r} does not lie inside the file "
                                         f"(truncated, or its header is damaged)")
        out[key] = (dtype, shape)
    return out


def check_fits(folder: Path, name: str, header: dict[str, tuple[str, tuple[int, ...]]], build: Any) -> None:
    """Build the model on the meta device (``build()``) and compare each parameter's name and
    shape with the weights' header."""
    import torch

    try:
        with torch.device("meta"):
            model = build()
    except HarnessError:
        raise
    except Exception:
        return  # a plugin that cannot build on the meta device: the real load still checks
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = [k for k in expected if k not in header]
    if len(missing) == len(expected) and expected:
        raise _damaged(folder, name, "none of the model's parameters is in it (weights of another model)")
    for key, shape in expected.items():
        if key in header and header[key][1] != shape:
            raise DamagedExport(
                f"{folder}: the sizes in model.json do not fit the weights in {name}: {key} is "
                f"{list(header[key][1])} in the weights and {list(shape)} by the config. The two files "
                f"are of different models; export the run again.")
