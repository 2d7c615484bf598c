"""hopmm: fast matrix products on NVIDIA Hopper (sm_90a) for CuPy arrays and CUDA torch tensors."""
from .api import FallbackError, explain, matmul, plan, use_schedule
from .compile import KernelCompileError
from .kernel_cache import CacheWarning
from .problem import Problem
from .shared_a import matmul_shared_a, swiglu
from .tuning import autotune

__all__ = ["matmul", "matmul_shared_a", "swiglu", "explain", "plan", "use_schedule", "autotune",
           "Problem", "FallbackError", "KernelCompileError", "CacheWarning"]
__version__ = "0.2.0"
