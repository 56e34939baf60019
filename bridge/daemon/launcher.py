"""How a Triton server becomes a Slurm job: the one place that builds its `JobSpec`
(script, partition, account, tags, node, GPUs, the environment the script reads: paths
only, the model-control key's file and the shim that reads it, never the key).

`[triton] runtime` picks what runs tritonserver in the job (the wheel's binary, or a
container through Apptainer or pyxis); the script, the tags and the node are the same for
each, and only the environment says which runtime and image (`deploy/slurm/
triton-server.sbatch` turns that into the runtime's command).

Called by the reconciler (baselines and lends) and by the lab (`bridge.lab.triton`).
Tags: every Triton job's comment holds `stb:triton`; a lent one also `stb:lease=<id>`,
and a baseline `stb:baseline`, so the reconciler can tell whose job it sees.

A server started for no model in particular (a baseline, a lend of no named model) loads
every model of the repository but those whose config.pbtxt sets `stb.load_at_start` to
"false" (`start_models`): such a model, an LLM say, is loaded only where a lend, a
placement or a publish names it (Triton's explicit model control). A baseline also leaves
out the models served from zero (`min_replicas` 0, `ModelFacts.from_zero`: the caller
passes them as `skip`): lent replicas alone serve those.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from bridge.config import TritonJobConfig
from bridge.slurm.model import BASELINE_TAG, TRITON_TAG, JobSpec, LeaseRef, lease_tag
from bridge.triton.ports import http_port, port_tag
from bridge.triton.repository import ModelConfigError, parameters

#: a model's parameter that, "false", keeps it out of a server started for every model
LOAD_AT_START = "stb.load_at_start"


class LauncherError(RuntimeError):
    """The Triton installation or the key file cannot be found; the message says which."""


def triton_home() -> Path:
    """The tritonserver install inside the nvidia-pytriton wheel. Found, not imported:
    only the binary and its backends are used, not pytriton's Python API (whose own
    dependencies the lab does not need)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise LauncherError(
            "nvidia-pytriton is not installed: no tritonserver for [triton] runtime = "
            "\"wheel\" (pip install 'slurm-triton-bridge[lab]', or run Triton from a "
            "container: runtime = apptainer or pyxis)"
        )
    home = Path(next(iter(spec.submodule_search_locations))).resolve() / "tritonserver"
    if not (home / "bin" / "tritonserver").exists():
        raise LauncherError(f"no tritonserver binary under {home}; reinstall nvidia-pytriton")
    return home


def triton_job(
    cfg: TritonJobConfig,
    *,
    node: str | None,
    members: Sequence[str] = (),
    models: Sequence[str] = (),
    lease: LeaseRef | None = None,
    exclusive: bool = False,
    gpus: int = 1,
    gpu_type: str | None = None,
    name: str | None = None,
    partition: str | None = None,
    reservation: str | None = None,
    weights_cache: Path | None = None,
    weights_verify: str = "stamp",
    skip: Sequence[str] = (),
    priority: int | str | None = None,
    slot: int = 0,
) -> JobSpec:
    """The JobSpec of one Triton server. `models` empty: every model that loads at start
    (`start_models`). `members`: a gang's other nodes (one job with `-N n` on `node` and
    them, its server on `node`, the batch host, each node taken whole). A lent node
    is taken whole (`exclusive`, `gpus` = all of its GPUs) so sacct books all its GPUs to
    serving and no other job lands beside it. `weights_cache`: the nodes' weight cache
    (`[weights] cache_root`): the job reads each model version from its verified local
    copy there where it has one (`bridge.weights.overlay`), checked as `weights_verify`
    says (`[weights] verify`). `skip`: models a server
    started for every model leaves out besides those that do not load at start (a
    baseline: the models served from zero); ignored when `models` names them.
    `priority`: `JobSpec.priority` (a drain-mode lend of some of a node's GPUs asks
    `TOP_PRIORITY`); None: Slurm's own. `gpu_type`: the GRES type its `gpus` are of (a
    lend of MIG slices: `--gres=gpu:<type>:k`); None: any GPU. `slot`: the ports the
    server listens on (`bridge.triton.ports`; a node's other leases' servers are on
    others), passed as `STB_TRITON_PORT` and named in the job's tags."""
    if not cfg.key_file.exists():
        raise LauncherError(f"the Triton API key file {cfg.key_file} does not exist")
    shim = cfg.key_shim_path
    if not shim.is_file():
        raise LauncherError(
            f"no key shim at {shim}: `stb daemon` and `stb lab up` build it (from "
            "deploy/slurm/stb-keyshim.c), or set triton.key_shim"
        )
    if not models:
        models = start_models(cfg.model_repository, skip) or ()
    env = {
        "STB_TRITON_RUNTIME": cfg.runtime,
        "STB_MODEL_REPO": str(cfg.model_repository.resolve()),
        "STB_TRITON_KEY_FILE": str(cfg.key_file.resolve()),
        "STB_KEY_SHIM": str(shim),
        # ';' not ',' between models: sbatch's --export splits on commas
        "STB_MODELS": ";".join(models) if models else "*",
    } | _runtime_env(cfg)
    if cfg.run_as is not None:  # its own user and a private /tmp and /dev/shm
        env["STB_TRITON_RUN_AS"] = cfg.run_as
    if weights_cache is not None:
        env |= {
            "STB_WEIGHTS_CACHE": str(weights_cache),
            "STB_WEIGHTS_VERIFY": weights_verify,
            "STB_PYTHON": sys.executable,
        }
    env["STB_TRITON_PORT"] = str(http_port(slot))
    tags = [TRITON_TAG, lease_tag(lease) if lease is not None else BASELINE_TAG]
    if (tag := port_tag(slot)) is not None:
        tags.append(tag)
    output = str(cfg.log_dir.resolve() / "triton-%j.log") if cfg.log_dir else None
    return JobSpec(
        partition=partition or cfg.partition,
        account=cfg.account,
        script=str(cfg.sbatch_script.resolve()),
        name=name
        or (f"stb-triton-lease-{lease[0]}" if lease is not None else "stb-triton-baseline"),
        comment=",".join(tags),
        nodelist=(node, *members) if node else (),
        nodes=1 + len(members) if members else None,
        gpus_per_node=gpus,
        gpu_type=gpu_type,
        exclusive=exclusive,
        requeue=False,
        reservation=reservation,
        output=output,
        priority=priority,
        env=env,
    )


def start_models(repository: Path, skip: Sequence[str] = ()) -> list[str] | None:
    """The models a server started for every model loads: None when that is all of them
    (Triton's `*`, the command line as it always was), else the repository's models
    (non-hidden folders with a config.pbtxt) less those whose `stb.load_at_start` is
    "false" and those in `skip` (a baseline's models served from zero). A config that
    cannot be read stays in: Triton's load then says what is wrong. LauncherError when no
    model would be loaded, or the parameter is not true or false."""
    try:
        dirs = sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return None  # Triton's own start says the repository is missing
    models: list[str] = []
    skipped: list[str] = []
    for d in dirs:
        if not (d / "config.pbtxt").is_file():
            continue
        try:
            value = parameters(d).get(LOAD_AT_START, "true").strip().lower()
        except ModelConfigError:
            value = "true"
        if value not in ("true", "false"):
            raise LauncherError(
                f'{d / "config.pbtxt"}: {LOAD_AT_START} must be "true" or "false", not {value!r}'
            )
        (skipped if value == "false" or d.name in skip else models).append(d.name)
    if not skipped:
        return None
    if not models:
        raise LauncherError(
            f"every model of {repository} sets {LOAD_AT_START} false or min_replicas 0: a "
            "server started for every model would load none (name the models to load)"
        )
    return models


def _runtime_env(cfg: TritonJobConfig) -> dict[str, str]:
    """What the script needs to know of the runtime: the wheel's install, or the image
    and the extra binds of a container (whose backends are the image's own unless
    `backend_directory` is set)."""
    if cfg.runtime == "wheel":
        home = triton_home()
        return {
            "STB_TRITON_HOME": str(home),
            "STB_TRITON_BACKENDS": str((cfg.backend_directory or home / "backends").resolve()),
            # The Python backend's stub runs the python3 first on PATH (isolated: no
            # PYTHONPATH) and imports the models' packages from its environment.
            "PATH": f"{(cfg.python or Path(sys.executable)).parent}:"
            f"{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
    image = cfg.image_reference
    if image is None:  # TritonJobConfig's own validation refuses this
        raise LauncherError(f"triton.runtime {cfg.runtime!r} needs triton.image")
    env = {"STB_TRITON_IMAGE": image}
    if cfg.binds:
        env["STB_TRITON_BINDS"] = ";".join(cfg.binds)
    if cfg.backend_directory is not None:
        env["STB_TRITON_BACKENDS"] = str(cfg.backend_directory.resolve())
    return env
