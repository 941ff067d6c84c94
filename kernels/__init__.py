"""CUDA C++ sources of hmgstore's kernels, compiled at run time by CuPy (NVRTC).

Nothing to import here: ``hmgstore._cuda`` reads the ``*.cu`` files beside this
one through ``importlib.resources``.
"""
