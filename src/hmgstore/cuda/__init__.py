"""The CUDA layer: the only place that imports CuPy.

CuPy is imported lazily, the first time a CUDA table is built, so that
``import hmgstore`` and the CPU path work on machines without a GPU or CuPy.

- :mod:`.runtime`: CuPy itself, device checks, kernel compilation (NVRTC,
  once per device and options) and CuPy handles on torch streams;
- :mod:`.host`: page-locking host memory in place (cudaHostRegister);
- :mod:`.gather`: the gather kernel's job layout and its launch;
- :mod:`.peer`: other GPUs of the node: peer access, raw device buffers and
  their mappings in other processes;
- :mod:`.vmm`: GPU memory other processes map (cuMemCreate, a file descriptor
  handed over a Unix socket): 9-14x the legacy CUDA IPC mappings' random reads.
"""
from .runtime import check_device, cupy, cupy_stream, kernel_source, launch, module

__all__ = ["check_device", "cupy", "cupy_stream", "kernel_source", "launch", "module"]
