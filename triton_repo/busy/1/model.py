"""busy: sums INPUT0 after holding the instance for service_time_ms per request.

The service time comes from the config parameter "service_time_ms" (milliseconds,
a non-negative number), so latency under load is predictable: with one instance,
requests beyond 1000/service_time_ms per second queue.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

NUMPY_2 = int(np.__version__.split(".")[0]) >= 2


def output(name, array):
    """A response tensor. The lab's Python backend stub (the nvidia-pytriton wheel's) is
    built against numpy 1's C ABI: under numpy 2 (Python 3.13 hosts, which have no numpy
    1) `pb_utils.Tensor(name, ndarray)` misreads the array's item size, so the tensor
    crosses by DLPack there (the stub then prints a harmless capsule-name traceback)."""
    if NUMPY_2:
        return pb_utils.Tensor.from_dlpack(name, array.__dlpack__())
    return pb_utils.Tensor(name, array)


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
            out = output("OUTPUT0", np.array([data.sum()], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
