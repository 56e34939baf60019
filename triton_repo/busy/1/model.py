"""busy: sums INPUT0 after holding the instance for service_time_ms per request.

The service time comes from the config parameter "service_time_ms" (milliseconds,
a non-negative number), so latency under load is predictable: with one instance,
requests beyond 1000/service_time_ms per second queue.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        raw = config.get("parameters", {}).get("service_time_ms", {}).get("string_value", "20")
        try:
            self.service_time_s = float(raw) / 1000.0
        except ValueError as exc:
            raise pb_utils.TritonModelException(
                f"busy: parameter service_time_ms must be a number of milliseconds, got {raw!r}"
            ) from exc
        if self.service_time_s < 0:
            raise pb_utils.TritonModelException(
                f"busy: parameter service_time_ms must not be negative, got {raw!r}"
            )

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(self.service_time_s)
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", np.array([data.sum()], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
