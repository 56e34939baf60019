"""echo: returns INPUT0 as OUTPUT0. The cheapest model a replica can serve."""

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
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = output("OUTPUT0", np.ascontiguousarray(data, dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
