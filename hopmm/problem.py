"""The frozen description of one GEMM call that every later stage works from."""
from __future__ import annotations

from dataclasses import dataclass

# Operand element types that hopmm's Hopper kernels cover, by NumPy dtype name.
KERNEL_DTYPES = ("float16", "bfloat16")
# A TMA box row is 128 bytes: it falls on one cache line only where the operand's lines start
# on 128-byte boundaries.
LINE_BYTES = 128


@dataclass(frozen=True)
class Problem:
    """C[z] (m x n) = A[z] (m x k) @ B[z] (k x n) for z in range(batch).

    `a_major` is the dimension of A that is contiguous in memory ("k": row-major A, "m": A is a
    transposed view); likewise `b_major` ("n": row-major B, "k": B is a transposed view).
    `b_pitch_aligned`: the bytes between B's consecutive contiguous lines are a multiple of
    LINE_BYTES (see heuristics: N-major B rows that are not cost the unclustered kernels
    about a quarter of their speed).
    """

    m: int
    n: int
    k: int
    batch: int
    dtype: str
    a_major: str = "k"
    b_major: str = "n"
    b_pitch_aligned: bool = True

    def __post_init__(self):
        for name in ("m", "n", "k", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Problem.{name} must be a positive int, got {value!r}")
        if self.dtype not in KERNEL_DTYPES:
            raise ValueError(f"Problem.dtype must be one of {KERNEL_DTYPES}, got {self.dtype!r}")
        if self.a_major not in ("k", "m"):
            raise ValueError(f"Problem.a_major must be 'k' or 'm', got {self.a_major!r}")
        if self.b_major not in ("k", "n"):
            raise ValueError(f"Problem.b_major must be 'k' or 'n', got {self.b_major!r}")
        if not isinstance(self.b_pitch_aligned, bool):
            raise ValueError(f"Problem.b_pitch_aligned must be a bool, got "
                             f"{self.b_pitch_aligned!r}")

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def trans_a(self) -> bool:
        """A is M-major: the kernel reads it with wgmma's transpose bit."""
        return self.a_major == "m"

    @property
    def trans_b(self) -> bool:
        """B is N-major (row-major B): the kernel reads it with wgmma's transpose bit."""
        return self.b_major == "n"

    @property
    def layout(self) -> str:
        """BLAS-style layout tag: N = row-major operand, T = transposed view."""
        return ("N" if self.a_major == "k" else "T") + ("N" if self.b_major == "n" else "T")
