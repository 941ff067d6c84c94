"""CUDA C++ sources of hmgstore's kernels, compiled at run time by CuPy (NVRTC).

Nothing to import here: ``hmgstore.cuda`` reads the ``*.cu``/``*.cuh`` files beside this
one through ``importlib.resources``.
"""
