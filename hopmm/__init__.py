"""hopmm: fast matrix products on NVIDIA Hopper (sm_90a) for CuPy arrays."""
from .api import FallbackError, explain, matmul, plan
from .problem import Problem

__all__ = ["matmul", "explain", "plan", "Problem", "FallbackError"]
__version__ = "0.1.0"
