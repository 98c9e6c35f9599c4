"""Test support for real SGLang serving on CPU: the `sgl_kernel` stand-in (kernel_stand_in/)
and the server fixture helpers (serving.py). Never imported by the product."""
