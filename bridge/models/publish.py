"""Publishing a model: validate, write the version atomically, load it where it is served,
check that it answers, roll back if it does not. Also rollback and retire.

`publish` order, all under the repository's publish lock (one publish at a time):
1. before the lock, check the name (`check_name`: no '/', '.', NUL, at most 64 characters),
   the folder (`check_source`: regular files and folders only, no symbolic link), the
   config's size and nesting (`read_config_text`, `parse_config`), then validate it against
   Triton's ModelConfig protobuf and the bridge's metadata (`check_model`): nothing is
   written for a bad name, folder or model;
2. stage the files, then one rename makes version V visible, then the config;
3. load the model on every serving instance that holds it (a model no server holds yet is
   loaded on the baseline servers), Triton's default version policy serving the latest;
4. check it answers on each: the version is READY and an inference with zero-filled inputs
   shaped from the config returns every declared output;
5. on any failure: the version goes to the archive, the old config comes back, the
   instances reload the previous version (or unload a new model), and PublishError says
   what failed and that it was rolled back;
6. the outcome (published, or failed and rolled back) goes into the repository's journal
   (`bridge.models.history`) with who and why; rollback and retire are journalled too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from bridge.models import history
from bridge.models.repo import Change, ModelRepository, RepositoryError, check_source
from bridge.triton.errors import TritonError
from bridge.triton.protocol import Array, TritonInstance
from bridge.triton.repository import (
    ModelMeta,
    check_model,
    check_name,
    parse_config,
    read_config_text,
)

DTYPES: dict[str, Any] = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32, "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}  # fmt: skip


class PublishError(RuntimeError):
    """A publish, rollback or retire failed; says what and what state it left."""


@dataclass(frozen=True)
class Server:
    """A running Triton server: its address and whether it is a baseline replica."""

    address: str
    client: TritonInstance
    baseline: bool = False


@dataclass
class Outcome:
    name: str
    version: int
    previous: int | None
    meta: ModelMeta
    loaded_on: list[str] = field(default_factory=list)


def holders_of(servers: Sequence[Server], name: str) -> list[Server]:
    out = []
    for s in servers:
        try:
            if any(m.name == name and m.state == "READY" for m in s.client.repository_index()):
                out.append(s)
        except TritonError:
            continue  # an unreachable server holds nothing we can reload
    return out


def zero_inputs(cfg: model_config_pb2.ModelConfig) -> dict[str, Array]:
    """One request of zeros per declared input (variable dims -> 1, a batch of 1)."""
    out: dict[str, Array] = {}
    for inp in cfg.input:
        type_name = model_config_pb2.DataType.Name(inp.data_type)
        dtype = DTYPES.get(type_name)
        if dtype is None:
            raise PublishError(f"input {inp.name}: no test value for {type_name}")
        dims = [1 if d < 0 else int(d) for d in inp.dims]
        if cfg.max_batch_size > 0:
            dims = [1, *dims]
        if dtype is np.object_:
            out[inp.name] = np.full(dims, b"", dtype=np.object_)
        else:
            out[inp.name] = np.zeros(dims, dtype=dtype)
    return out


def check_answers(
    server: Server, name: str, version: int, cfg: model_config_pb2.ModelConfig
) -> None:
    client = server.client
    if not client.is_model_ready(name, str(version)):
        raise PublishError(f"{server.address}: {name} version {version} is not ready")
    outputs = client.infer(name, zero_inputs(cfg), str(version))
    missing = sorted({o.name for o in cfg.output} - set(outputs))
    if missing:
        raise PublishError(f"{server.address}: {name} answered without output(s) {missing}")


def own_config_text(text: str, cfg: model_config_pb2.ModelConfig, name: str) -> str:
    """The config as written by its author, with `name` set when it had none."""
    return text if cfg.name else f'name: "{name}"\n{text}'


def read_model(src: Path, name: str) -> tuple[str, model_config_pb2.ModelConfig, ModelMeta]:
    """Step 1 of a publish: the name, the folder and its config checked (nothing written);
    the config's text, parsed config and the bridge's metadata."""
    check_name(name)
    check_source(src)
    where = src / "config.pbtxt"
    text = read_config_text(where)
    cfg = parse_config(text, str(where))
    return text, cfg, check_model(cfg, name, str(where))


def publish(
    repo: ModelRepository,
    src: Path,
    name: str,
    servers: Sequence[Server],
    *,
    version: int | None = None,
    say: Callable[[str], None] = lambda _: None,
    why: str = "",
    who: str | None = None,
) -> Outcome:
    text, cfg, meta = read_model(src, name)
    if version is not None and version < 1:
        raise PublishError(f"version must be a positive integer, got {version}")
    with repo.lock():
        latest = repo.latest(name)
        v = version if version is not None else (latest or 0) + 1
        if v in repo.versions(name):
            raise PublishError(f"{name} version {v} already exists in {repo.root}")
        if latest is not None and v < latest:
            raise PublishError(
                f"{name}: version {v} is below the served version {latest} (Triton serves "
                "the highest); publish a higher one, or use `stb models rollback`"
            )
        targets = holders_of(servers, name) or [s for s in servers if s.baseline]
        staging = repo.stage(name, src)
        change = repo.commit(name, staging, v, own_config_text(text, cfg, name))
        say(f"{name} version {v} written to {repo.root} ({meta.team}, SLO {meta.slo_p99_ms:g} ms)")
        try:
            for s in targets:
                s.client.load_model(name)
                say(f"loaded on {s.address}")
            for s in targets:
                check_answers(s, name, v, cfg)
                say(f"answers on {s.address}")
        except (TritonError, PublishError) as exc:
            failure = f"{type(exc).__name__}: {exc}"
            _undo(repo, change, targets, failure, say)
            journal(repo, name, "publish-failed", v, change.previous, who,
                    f"{why}; {failure}" if why else failure, targets)  # fmt: skip
            back = f"version {change.previous}" if change.previous else "nothing (new model)"
            raise PublishError(f"{name} version {v} failed ({exc}); rolled back to {back}") from exc
        journal(repo, name, "publish", v, v, who, why, targets)
        return Outcome(name, v, change.previous, meta, [s.address for s in targets])


def journal(
    repo: ModelRepository,
    name: str,
    action: history.Action,
    version: int | None,
    serving: int | None,
    who: str | None,
    why: str,
    servers: Sequence[Server],
) -> None:
    """Append the change to the repository's journal (the publish lock is held)."""
    entry = history.Entry(
        history.now(), name, action, version, serving, who or history.actor(), why,
        tuple(s.address for s in servers),
    )  # fmt: skip
    history.append(repo.archive, entry)


def _undo(
    repo: ModelRepository,
    change: Change,
    targets: Sequence[Server],
    why: str,
    say: Callable[[str], None],
) -> None:
    repo.revert(change, why)
    for s in targets:
        try:
            if change.previous is None:
                s.client.unload_model(change.name)
            else:
                s.client.load_model(change.name)
            say(f"rolled back on {s.address}")
        except TritonError as exc:  # reported, the files are already consistent
            say(f"rollback on {s.address} failed: {exc}")


def rollback(
    repo: ModelRepository, name: str, servers: Sequence[Server], why: str, who: str | None = None
) -> tuple[int, int, list[str]]:
    """The latest version leaves; the previous one serves again where the model is held."""
    _model_dir(repo, name)
    with repo.lock():
        try:
            gone, now = repo.rollback(name, why)
        except RepositoryError as exc:
            raise PublishError(str(exc)) from exc
        cfg = parse_config(repo.config_text(name) or "", str(repo.root / name / "config.pbtxt"))
        holders = holders_of(servers, name)
        journal(repo, name, "rollback", gone, now, who, why, holders)
        for s in holders:
            s.client.load_model(name)
            check_answers(s, name, now, cfg)
        return gone, now, [s.address for s in holders]


def retire(
    repo: ModelRepository, name: str, servers: Sequence[Server], why: str, who: str | None = None
) -> list[str]:
    """Unload the model everywhere, then move it out of the repository."""
    _model_dir(repo, name)
    with repo.lock():
        if name not in repo.models():
            raise PublishError(f"no model {name!r} in {repo.root}")
        holders = holders_of(servers, name)
        for s in holders:
            s.client.unload_model(name)
        last = repo.latest(name)
        repo.retire(name, why)
        journal(repo, name, "retire", last, None, who, why, holders)
        return [s.address for s in holders]


def _model_dir(repo: ModelRepository, name: str) -> Path:
    """The model's folder; PublishError (before the lock, so before anything is written)
    for a name that is no plain folder name."""
    try:
        return repo.model_dir(name)
    except RepositoryError as exc:
        raise PublishError(str(exc)) from exc
