"""The lab's weights that take time to move: a shared repository behind a throttled
nginx origin, and the model that loads from it or from a node-local copy.

`build_origin` writes the origin's folder: `weighty/<version>/` with `model.py`
(deploy/lab/weighty/model.py), a `weights.bin` of random bytes and the version's
manifest (`bridge.weights.manifest`), as a publish leaves a version. `origin_conf`
renders the nginx server that serves it on a 127.0.0.1 port at `limit_rate` bytes a
second per connection (the slow shared file system of a real site); `start_origin` runs
it (`bridge.routing.nginxctl.NginxProcess`). `build_repository` writes the Triton-facing
model repository: the model's config, with the origin's URL as `stb.weights_origin`, and
its code without the weights, which the model then fetches from the origin unless the
Triton job points its version at a verified local copy (`bridge.weights.overlay`).
Used by tests/lab/test_weights_lab.py and bench/weights_lab.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bridge.paths import project_root
from bridge.routing.nginxctl import NginxProcess
from bridge.weights import manifest as mf

MODEL = "weighty"
WEIGHTS = "weights.bin"

CONFIG = """name: "weighty"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1, 3 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters: { key: "stb.team", value: { string_value: "team-platform" } }
parameters: { key: "stb.slo_p99_ms", value: { string_value: "50" } }
parameters: { key: "stb.load_at_start", value: { string_value: "false" } }
"""


def model_code() -> Path:
    return project_root() / "deploy" / "lab" / MODEL / "model.py"


def build_origin(root: Path, size_bytes: int, version: int = 1) -> mf.Manifest:
    """The origin's folder under `root`: one version of weighty with `size_bytes` of
    random weights, and its manifest."""
    folder = root / MODEL / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    (root / MODEL / "config.pbtxt").write_text(CONFIG)
    shutil.copyfile(model_code(), folder / "model.py")
    with open(folder / WEIGHTS, "wb") as f:
        left = size_bytes
        while left > 0:
            n = min(left, 16 << 20)
            f.write(os.urandom(n))
            left -= n
    return mf.write_manifest(folder, MODEL, version)


def build_repository(root: Path, origin_url: str, version: int = 1) -> Path:
    """The Triton-facing repository under `root`: weighty's config (naming the origin)
    and its code, no weights."""
    folder = root / MODEL / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    url = f"{origin_url.rstrip('/')}/{MODEL}/{version}/"
    (root / MODEL / "config.pbtxt").write_text(
        CONFIG
        + f'parameters: {{ key: "stb.weights_origin", value: {{ string_value: "{url}" }} }}\n'
    )
    shutil.copyfile(model_code(), folder / "model.py")
    return root


def origin_conf(root: Path, port: int, rate_bytes_s: int) -> str:
    """An nginx server on 127.0.0.1:`port` serving `root` read-only, each connection
    at most `rate_bytes_s` bytes a second (`limit_rate`)."""
    if "'" in str(root) or ";" in str(root) or not 0 < port < 65536 or rate_bytes_s < 1:
        raise ValueError(f"cannot serve {root!r} on port {port} at {rate_bytes_s} B/s")
    return "\n".join(
        [
            "# bridge.lab.weights: the shared repository's throttled origin",
            "server {",
            f"    listen 127.0.0.1:{port};",
            f"    root '{root.resolve()}';",
            "    sendfile on;",
            "    location / {",
            "        limit_except GET { deny all; }",
            f"        limit_rate {rate_bytes_s};",
            "    }",
            "}",
            "",
        ]
    )


def start_origin(prefix: Path, root: Path, port: int, rate_bytes_s: int) -> NginxProcess:
    """A lab nginx under `prefix` serving `root` as `origin_conf` says; started."""
    proc = NginxProcess(prefix)
    proc.routing_conf.parent.mkdir(parents=True, exist_ok=True)
    proc.routing_conf.write_text(origin_conf(root, port, rate_bytes_s))
    proc.start()
    return proc
