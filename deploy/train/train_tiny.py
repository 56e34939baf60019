"""A tiny training run: fits a linear model y = X.w + b by least squares with numpy on
synthetic data, then writes a Triton model folder (config.pbtxt, model.py, weights.npy)
ready for `stb models publish`. The example of deploy/train/train-tiny.sbatch: a real
training job would write its checkpoint the same way.

    python deploy/train/train_tiny.py OUT_DIR [--features 4] [--team T] [--slo-ms 50] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

CONFIG = """# {name}: a linear model trained by deploy/train/train_tiny.py ({meta})
backend: "python"
max_batch_size: 32
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {features} ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters: {{ key: "stb.team" value: {{ string_value: "{team}" }} }}
parameters: {{ key: "stb.slo_p99_ms" value: {{ string_value: "{slo}" }} }}
parameters: {{ key: "stb.min_replicas" value: {{ string_value: "1" }} }}
parameters: {{ key: "stb.max_replicas" value: {{ string_value: "2" }} }}
"""

MODEL = '''"""A linear model: Y = X . w + b, the weights from weights.npy beside this file."""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        weights = np.load(Path(__file__).with_name("weights.npy"))
        self.w, self.b = weights[:-1].astype(np.float32), np.float32(weights[-1])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = (x @ self.w + self.b).reshape(-1, 1).astype(np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", y)]))
        return responses
'''


def train(features: int, seed: int, samples: int = 4096) -> tuple[np.ndarray, float]:
    """Least squares on noisy synthetic data; returns the weights (w..., b) and the fit's
    root-mean-square error."""
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=features)
    x = rng.normal(size=(samples, features))
    y = x @ true_w + 0.5 + rng.normal(scale=0.01, size=samples)
    design = np.hstack([x, np.ones((samples, 1))])
    weights, *_ = np.linalg.lstsq(design, y, rcond=None)
    rmse = float(np.sqrt(np.mean((design @ weights - y) ** 2)))
    return weights, rmse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--name", default="tiny")
    ap.add_argument("--features", type=int, default=4)
    ap.add_argument("--team", default="team-research")
    ap.add_argument("--slo-ms", type=float, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    weights, rmse = train(args.features, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = f"seed {args.seed}, rmse {rmse:.4f}"
    (args.out / "config.pbtxt").write_text(
        CONFIG.format(
            name=args.name, meta=meta, features=args.features, team=args.team, slo=args.slo_ms
        )
    )
    (args.out / "model.py").write_text(MODEL)
    np.save(args.out / "weights.npy", weights)
    (args.out / "training.json").write_text(json.dumps({"weights": weights.tolist(), "rmse": rmse}))
    print(f"trained {args.name}: {args.features} features, rmse {rmse:.4f} -> {args.out}")


if __name__ == "__main__":
    main()
