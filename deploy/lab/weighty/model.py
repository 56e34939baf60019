"""weighty: the lab's model with weights that take time to move (bridge.lab.weights).

At `initialize` it loads `weights.bin`: from its own version folder when the Triton job
gave it a node-local copy there (the job verified it against its manifest first:
bridge.weights.overlay), else from the shared origin named by the parameter
`stb.weights_origin` (the version folder's URL, behind a throttled nginx), checking the
bytes against the origin's manifest. Either way it reads every byte (as a model reading
its weights into memory does); only the origin's bytes are hashed here, a local copy's
were checked by the job before Triton started.
Each answer says where the weights came from and how long loading them took:
OUTPUT0 = [source, load seconds, bytes], source 1.0 for local, 0.0 for the origin."""

import hashlib
import json
import os
import time
import urllib.request

import numpy as np
import triton_python_backend_utils as pb_utils

NUMPY_2 = int(np.__version__.split(".")[0]) >= 2
WEIGHTS = "weights.bin"
MANIFEST = "stb-weights.json"


def output(name, array):
    """A response tensor (by DLPack under numpy 2: see triton_repo/echo/1/model.py)."""
    if NUMPY_2:
        return pb_utils.Tensor.from_dlpack(name, array.__dlpack__())
    return pb_utils.Tensor(name, array)


def _read(stream, h):
    n = 0
    while chunk := stream.read(4 << 20):
        h.update(chunk)
        n += len(chunk)
    return n


def _read_all(path):
    """Every byte of `path` into one reused buffer: the read a load does, no hashing."""
    buf = bytearray(16 << 20)
    view = memoryview(buf)
    n = 0
    with open(path, "rb", buffering=0) as f:
        while got := f.readinto(view):
            n += got
    return n


class TritonPythonModel:
    def initialize(self, args):
        here = os.path.join(args["model_repository"], args["model_version"])
        params = json.loads(args["model_config"]).get("parameters", {})
        t0 = time.monotonic()
        h = hashlib.sha256()
        local = os.path.join(here, WEIGHTS)
        if os.path.isfile(local):
            size = _read_all(local)
            self.source, where = 1.0, os.path.realpath(local)
        else:
            origin = params["stb.weights_origin"]["string_value"].rstrip("/")
            with urllib.request.urlopen(f"{origin}/{MANIFEST}", timeout=30) as r:
                manifest = json.load(r)
            want = next(f for f in manifest["files"] if f["path"] == WEIGHTS)
            with urllib.request.urlopen(f"{origin}/{WEIGHTS}", timeout=30) as r:
                size = _read(r, h)
            if size != want["size"] or h.hexdigest() != want["sha256"]:
                raise pb_utils.TritonModelException(
                    f"weighty: {origin}/{WEIGHTS} does not match its manifest "
                    f"({size} bytes, sha256 {h.hexdigest()[:12]})"
                )
            self.source, where = 0.0, f"{origin}/{WEIGHTS}"
        self.load_s = time.monotonic() - t0
        self.size = float(size)
        print(
            f"weighty: weights from {'local' if self.source else 'origin'} {where}: "
            f"{size} bytes in {self.load_s:.2f} s"
            + (f", sha256 {h.hexdigest()[:12]}" if not self.source else ""),
            flush=True,
        )

    def execute(self, requests):
        answer = np.array([[self.source, self.load_s, self.size]], dtype=np.float32)
        return [
            pb_utils.InferenceResponse(output_tensors=[output("OUTPUT0", answer)]) for _ in requests
        ]
