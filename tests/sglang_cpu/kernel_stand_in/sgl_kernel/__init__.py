"""Test-only stand-in for two names of SGLang's native kernel package, for CPU serving.

Why this exists: with `SGLANG_USE_CPU_ENGINE=1`, SGLang 0.5.23 imports two names from
`sgl_kernel` at startup -- `assign_req_to_token_pool_cpu` (mem_cache/allocation.py, called on
every prefill) and `copy_all_layer_kv_cache_cpu` (kernels/ops/kvcache/cache_move.py, imported,
not called in normal serving). The only wheels on PyPI (`sglang-kernel`, `sgl-kernel`) are
CUDA builds: importing them on a CPU-only machine fails with `libcuda.so.1: cannot open
shared object file`, and no CPU build is published (SGLang documents CPU serving only via
its Xeon Dockerfile or a source build). See /work/shared/facts/sglang-on-cpu.md.

This package is found first on PYTHONPATH only in the test fixture that starts a real
server (tests/sglang_cpu/serving.py); the product never imports it. It implements the first
name in plain torch with the signature of SGLang's Python call site and the copy semantics
of SGLang's Triton kernel `assign_req_to_token_pool`; every other name
(`copy_all_layer_kv_cache_cpu`, and the CPU kernels other modules import at startup, e.g.
speculative decoding's `build_tree_kernel_efficient_cpu`) imports fine and raises
NotImplementedError if it is ever called: a call would be a test failure, not a silent
fallback. It deliberately does NOT register the op
`torch.ops.sgl_kernel.convert_weight_packed`, so `cpu_has_amx_support()` stays false and
SGLang uses its torch-native layers and `torch_native` attention.
"""

from __future__ import annotations

from typing import Any

import torch

STAND_IN = True  # lets a test check which sgl_kernel the server imported


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """For each request i: req_to_token[req_pool_indices[i], start[i]:end[i]] = the next
    (end[i] - start[i]) entries of out_cache_loc (requests packed back to back)."""
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(),
                               strict=True):
        n = end - start
        if n > 0:
            assert end <= pool_len, (end, pool_len)
            req_to_token[row, start:end] = out_cache_loc[offset:offset + n].to(req_to_token.dtype)
        offset += n


def _not_available(name: str) -> Any:
    def missing(*_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel.{name} is not provided by the CPU test stand-in")

    missing.__name__ = name
    return missing


copy_all_layer_kv_cache_cpu = _not_available("copy_all_layer_kv_cache_cpu")



def __getattr__(name: str) -> Any:  # `from sgl_kernel import <name>`: importable, fails if called
    if name.startswith("__"):
        raise AttributeError(name)
    return _not_available(name)
