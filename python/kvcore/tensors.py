"""Framework glue the compiled module calls back into: new output tensors in the caller's
framework, and torch's current CUDA stream. torch is imported only if the caller already did."""

import sys


def _framework(obj):
    return type(obj).__module__.split(".", 1)[0]


def empty_like(like, shape, dtype):
    """A new uninitialized tensor of `shape` and `dtype` (a numpy/torch dtype name) in the
    framework and on the device of `like`."""
    fw = _framework(like)
    if fw == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    device_type = like.__dlpack_device__()[0] if hasattr(like, "__dlpack_device__") else 1
    if device_type not in (1, 3):  # kDLCPU, kDLCUDAHost
        from ._ext import NotSupportedError

        raise NotSupportedError(
            f"NotSupported: cannot allocate an output like a {type(like).__name__} on DLPack device type "
            f"{device_type}; pass out="
        )
    import numpy

    if dtype == "bfloat16":
        from ._ext import NotSupportedError

        raise NotSupportedError("NotSupported: numpy has no bfloat16; pass out= or use float16/float32")
    return numpy.empty(shape, dtype=dtype)


def current_stream(device_index):
    """torch's current CUDA stream handle on `device_index` when torch is loaded, else 0 (the
    default stream)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return 0
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object: cheaper per call
    if raw is not None:
        return raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream
