"""Output checks of a gradual rollout: recorded requests the new version must answer as
expected before it takes any traffic (`stb models publish --canary ... --checks FILE`).

The file, JSON:

    {"rtol": 1e-5, "atol": 1e-6,
     "requests": [
       {"inputs": {"INPUT0": {"shape": [1, 4], "data": [1, 2, 3, 4]}},
        "outputs": {"OUTPUT0": {"data": [1, 2, 3, 4]}}},
       {"inputs": {"INPUT0": {"shape": [1, 2], "data": [5, 6]}}}
     ]}

Each request gives every input the model's config declares (its datatype is the
config's; `data` is flat, row-major, `shape` multiplies to its length). A request with
`outputs` must answer those values (within `rtol`/`atol`, numpy's `allclose`; strings
exactly); one without must answer what the old version answers to it. `load` refuses a bad
file naming the request and the field, before anything is written; the file is kept in
the repository's archive beside the version's config (`ModelRepository.save_checks`), so
the daemon that activates the rollout reads the same checks. `run` raises `PublishError`
naming the first request whose answer differs, and by how much: the driver then rolls the
version back before any split.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from bridge.models.publish import DTYPES, PublishError, Server
from bridge.triton.protocol import Array

#: the most recorded requests one rollout runs on each server
MAX_REQUESTS = 1000


@dataclass(frozen=True)
class Check:
    inputs: dict[str, Array]
    #: expected outputs; None: the old version's answers
    outputs: dict[str, Array] | None


@dataclass(frozen=True)
class Checks:
    requests: tuple[Check, ...]
    rtol: float = 1e-5
    atol: float = 1e-8


def _dtype(tensor: Any) -> Any:
    name = model_config_pb2.DataType.Name(tensor.data_type)
    dtype = DTYPES.get(name)
    if dtype is None:
        raise PublishError(f"{tensor.name}: no checks for {name}")
    return dtype


def _array(where: str, raw: Any, dtype: Any, shape_required: bool) -> Array:
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list):
        raise PublishError(f'{where}: give {{"data": [...]}} (flat, row-major)')
    data = raw["data"]
    shape = raw.get("shape")
    if shape is None and not shape_required:
        shape = [len(data)]
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise PublishError(f"{where}: shape must be a list of non-negative integers")
    if math.prod(shape) != len(data):
        raise PublishError(
            f"{where}: shape {shape} holds {math.prod(shape)} values, data {len(data)}"
        )
    try:
        if dtype is np.object_:
            return np.array([str(x).encode() for x in data], dtype=np.object_).reshape(shape)
        return np.array(data, dtype=dtype).reshape(shape)
    except (TypeError, ValueError, OverflowError) as exc:
        raise PublishError(f"{where}: {exc}") from exc


def load(text: str, cfg: model_config_pb2.ModelConfig, source: str) -> Checks:
    """The checks of `text` for a model of config `cfg`; PublishError naming what is wrong."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise PublishError(f"{source}: not JSON ({exc})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise PublishError(f'{source}: give an object with "requests": [...]')
    if not 1 <= len(doc["requests"]) <= MAX_REQUESTS:
        raise PublishError(f"{source}: 1 to {MAX_REQUESTS} requests, got {len(doc['requests'])}")
    tol = {}
    for key, default in (("rtol", 1e-5), ("atol", 1e-8)):
        value = doc.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise PublishError(f"{source}: {key} must be a number >= 0, got {value!r}")
        tol[key] = float(value)
    inputs = {t.name: _dtype(t) for t in cfg.input}
    outputs = {t.name: _dtype(t) for t in cfg.output}
    checks = []
    for i, req in enumerate(doc["requests"], 1):
        where = f"{source}: request {i}"
        if not isinstance(req, dict) or not isinstance(req.get("inputs"), dict):
            raise PublishError(f'{where}: give "inputs": {{name: {{"shape", "data"}}}}')
        given = req["inputs"]
        if set(given) != set(inputs):
            raise PublishError(
                f"{where}: inputs {sorted(given)}, the config declares {sorted(inputs)}"
            )
        arrays = {n: _array(f"{where} input {n}", given[n], inputs[n], True) for n in inputs}
        expected = None
        if "outputs" in req:
            want = req["outputs"]
            if not isinstance(want, dict) or not want or not set(want) <= set(outputs):
                raise PublishError(
                    f"{where}: outputs must name some of the config's {sorted(outputs)}"
                )
            expected = {n: _array(f"{where} output {n}", want[n], outputs[n], False) for n in want}
        checks.append(Check(arrays, expected))
    return Checks(tuple(checks), tol["rtol"], tol["atol"])


def _differs(got: Array, want: Array, checks: Checks) -> str | None:
    got = np.asarray(got)
    if want.dtype == np.object_ or got.dtype == np.object_:
        same = got.size == want.size and [bytes(x) for x in got.ravel()] == [
            bytes(x) for x in want.ravel()
        ]
        return None if same else "differs"
    if got.size != want.size:
        return f"has {got.size} values, expected {want.size}"
    g, w = got.ravel().astype(np.float64), want.ravel().astype(np.float64)
    if np.allclose(g, w, rtol=checks.rtol, atol=checks.atol):
        return None
    return f"differs by up to {float(np.max(np.abs(g - w))):.6g}"


def run(checks: Checks, server: Server, name: str, new: int, old: int) -> None:
    """Every recorded request on the new version at `server`; PublishError at the first
    answer that is not the expected one (or the old version's)."""
    for i, check in enumerate(checks.requests, 1):
        got = server.client.infer(name, check.inputs, str(new))
        want = check.outputs
        against = "the expected"
        if want is None:
            want = {
                k: np.asarray(v)
                for k, v in server.client.infer(name, check.inputs, str(old)).items()
            }
            against = f"version {old}'s"
        for output, expected in want.items():
            if output not in got:
                raise PublishError(f"{server.address}: recorded request {i}: no {output}")
            why = _differs(got[output], expected, checks)
            if why is not None:
                raise PublishError(
                    f"{server.address}: recorded request {i}: {output} {why} from {against} "
                    f"answer (rtol {checks.rtol:g}, atol {checks.atol:g})"
                )


__all__ = ["MAX_REQUESTS", "Check", "Checks", "load", "run"]
