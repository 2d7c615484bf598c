"""Fused epilogues: `activation(alpha * (a @ b) + beta * c + bias)` in fp32, one rounding.

EpilogueSpec is the compile-time part (which chain: the kernel's name and cache key);
FusedEpilogue adds a call's operands (bias, c, alpha, beta), validated against the call's
shapes and laid out as the kernel reads them (epilogue_functors.cuh). `reference` computes the
same chain with any array module (CuPy on the fallback path, NumPy in tests).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# Config::kActivation is the index in this tuple (epilogue_functors.cuh's kActivation*).
ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu", "sigmoid")
# Element strides the kernel takes as 32-bit ints; larger ones go to the CuPy path.
MAX_STRIDE = 2**31 - 1
# The kernel's extra arguments: two pointers after the schedule's own, and scalars after the
# raster's (m, n, bias strides, c strides, alpha, beta).
POINTER_PARAMS = "\n               const void* epilogue_bias, const void* epilogue_c,"
SCALAR_PARAMS = (",\n               int epilogue_m, int epilogue_n, int bias_row_stride, "
                 "int bias_col_stride,\n               int c_row_stride, int c_col_stride, "
                 "int c_batch_stride, float alpha, float beta")
_CHAIN_ARGS = ("epilogue_bias, epilogue_c, epilogue_m, epilogue_n, bias_row_stride,\n"
               "                            bias_col_stride, c_row_stride, c_col_stride, "
               "c_batch_stride, alpha, beta")
# A chain that applies nothing (alpha 1, beta 0) over the row store's extent.
_NO_CHAIN_ARGS = "nullptr, nullptr, out_m, out_n, 0, 0, 0, 0, 0, 1.0f, 0.0f"
POINTERS = 2
# A kernel that stores its output rows without TMA (KernelConfig.row_store) takes, after the
# raster's scalars, the output's extent and its row and batch strides in elements; its address
# comes in C's map parameter (launch.ADDRESS_SLOT).
ROW_STORE_PARAMS = (",\n               int out_m, int out_n, int out_row_stride, "
                    "int out_batch_stride")
_ROW_STORE_ARGS = ", hopmm::address_in_map_slot(&map_c), out_row_stride, out_batch_stride"


def call_args(fused: bool, row_store: bool) -> str:
    """The kernel entry's EpilogueArgs argument to its skeleton ("" for a plain kernel that
    stores through TMA: the skeleton's default)."""
    if not (fused or row_store):
        return ""
    chain = _CHAIN_ARGS if fused else _NO_CHAIN_ARGS
    store = _ROW_STORE_ARGS if row_store else ""
    return f",\n        hopmm::EpilogueArgs{{{chain}{store}}}"
# The dtypes the CuPy path computes an epilogue for (in float32, or float64 for float64).
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class EpilogueSpec:
    """Which chain a kernel applies: the activation and whether it adds a bias and beta * c.
    alpha is always applied (a runtime scalar)."""
    activation: str | None = None
    bias: bool = False
    c: bool = False

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}; known: "
                             f"{[a for a in ACTIVATIONS if a]}")

    @property
    def tag(self) -> str:
        """Kernel name suffix, e.g. `_ep_relu_bias_c`."""
        parts = [self.activation or "linear"] + ["bias"] * self.bias + ["c"] * self.c
        return "_ep_" + "_".join(parts)

    def describe(self) -> str:
        """The chain as hopmm.explain shows it."""
        x = "alpha * acc"
        if self.c:
            x += " + beta * c"
        if self.bias:
            x += " + bias"
        return f"{self.activation}({x})" if self.activation else x

    @staticmethod
    def config_fields(spec: "EpilogueSpec | None") -> dict:
        """The rendered Config's epilogue fields (None: a plain kernel, whose chain is the
        identity)."""
        return {"kEpilogue": spec is not None,
                "kActivation": ACTIVATIONS.index(spec.activation if spec else None),
                "kHasBias": bool(spec and spec.bias), "kHasC": bool(spec and spec.c)}


PLAIN = EpilogueSpec()


@dataclass
class FusedEpilogue:
    """A call's validated epilogue: the spec, bias as a (rows, cols) broadcastable view and c
    as a (batch, m, n) view (stride 0 along broadcast dimensions), alpha and beta."""
    spec: EpilogueSpec
    alpha: float
    beta: float
    bias: object = None     # the caller's array
    c: object = None        # the caller's array, as broadcast to the output's shape
    bias_strides: tuple = (0, 0)      # elements: (row, col)
    c3: object = None                 # (batch, m, n) view of c, or None
    c_strides: tuple = (0, 0, 0)      # elements: (batch, row, col)
    # Whether the kernel reads c3 where the caller's c lies (else a contiguous copy of it).
    c_in_place: bool = True
    # Whether readable() copied c (a copy is made on every call: such calls are not repeated
    # through remembered launches).
    c_copied: bool = False

    def overlaps(self, out) -> bool:
        """Whether `out` overlaps bias or c, other than being c itself (same pointer, shape
        and strides)."""
        same = (self.c is not None and out.data.ptr == self.c.data.ptr
                and out.shape == self.c.shape and out.strides == self.c.strides)
        return any(x is not None and _overlap(out, x)
                   for x in (self.bias, None if same else self.c))

    def readable(self, out) -> "FusedEpilogue":
        """This epilogue with bias and c as the kernel may read them while it writes `out`
        (None: a new result): copies of those that overlap out (c itself excepted), and the
        contiguous copy of a c whose batch dimensions do not collapse."""
        import dataclasses

        import cupy

        copy = dataclasses.replace(self)
        if out is not None and self.bias is not None and _overlap(out, self.bias):
            copy.bias = self.bias.copy()
            copy.bias_strides = tuple(0 if s == 0 else 1 for s in self.bias_strides)
        if self.c is None:
            return copy
        same = (out is not None and out.data.ptr == self.c.data.ptr
                and out.shape == self.c.shape and out.strides == self.c.strides)
        if not self.c_in_place or (out is not None and not same and _overlap(out, self.c)):
            copy.c3 = cupy.ascontiguousarray(self.c3)
            m, n = self.c3.shape[-2:]
            copy.c_strides = (m * n, n if m > 1 else 0, 1 if n > 1 else 0)
            copy.c_copied = True
        return copy

    def kernel_reason(self) -> str | None:
        """Why the kernels cannot take this epilogue (the call then runs on CuPy), or None."""
        strides = self.bias_strides + self.c_strides
        if any(abs(s) > MAX_STRIDE for s in strides):
            return "an epilogue operand's element stride exceeds the kernels' 32-bit arguments"
        return None

    def scalars(self, m: int, n: int) -> tuple:
        """The kernel's epilogue integers after the raster's (alpha and beta as their fp32
        bits: the launch passes every scalar as a 32-bit word)."""
        cb, cr, cc = self.c_strides
        return (m, n, self.bias_strides[0], self.bias_strides[1], cr, cc, cb,
                f32_bits(self.alpha), f32_bits(self.beta))

    def pointers(self) -> tuple:
        return (0 if self.bias is None else self.bias.data.ptr,
                0 if self.c3 is None else self.c3.data.ptr)


def _overlap(x, y) -> bool:
    from .layout import byte_bounds, overlaps

    return overlaps(byte_bounds(x.data.ptr, x.shape, x.strides, x.itemsize),
                    byte_bounds(y.data.ptr, y.shape, y.strides, y.itemsize))


def f32_bits(x: float) -> int:
    """The IEEE fp32 bit pattern of x as a signed 32-bit int."""
    import struct

    return struct.unpack("<i", struct.pack("<f", x))[0]


def _check_array(name: str, x, dtype, device_id: int):
    import cupy

    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"hopmm.matmul: {name} must be a cupy.ndarray, got "
                        f"{type(x).__module__}.{type(x).__qualname__}")
    if x.device.id != device_id:
        raise ValueError(f"hopmm.matmul: {name} is on device {x.device.id}, the operands on "
                         f"device {device_id}")
    if x.dtype != dtype:
        raise TypeError(f"hopmm.matmul: {name} has dtype {x.dtype}, the operands' result "
                        f"dtype is {dtype}")


def _scalar(name: str, x) -> float:
    import numbers

    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"hopmm.matmul: {name} must be a real number, got "
                        f"{type(x).__qualname__}")
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"hopmm.matmul: {name} must be finite, got {x}")
    return x


def resolve(shapes, dtype, device_id: int, *, bias, activation, alpha, beta,
            c) -> FusedEpilogue:
    """Validates the epilogue keywords of a call with these MatmulShapes and result dtype;
    ValueError / TypeError naming the argument."""
    import numpy

    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"hopmm.matmul: activation must be a string or None, got "
                        f"{type(activation).__qualname__}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"hopmm.matmul: unknown activation {activation!r}; known: "
                         f"{[a for a in ACTIVATIONS if a]}")
    alpha, beta = _scalar("alpha", alpha), _scalar("beta", beta)
    if numpy.dtype(dtype).name not in FLOAT_DTYPES:
        raise TypeError(f"hopmm.matmul: epilogue keywords need floating-point operands "
                        f"({', '.join(FLOAT_DTYPES)}), the result dtype is {dtype}")
    if beta != 0.0 and c is None:
        raise ValueError(f"hopmm.matmul: beta = {beta} needs c (beta * c is added)")
    out = FusedEpilogue(EpilogueSpec(activation, bias is not None, False), alpha, beta)
    m, n = shapes.m, shapes.n
    if bias is not None:
        _check_array("bias", bias, dtype, device_id)
        if bias.shape == (n,):
            out.bias_strides = (0, bias.strides[0] // bias.itemsize)
        elif bias.shape == (m, 1):
            out.bias_strides = (bias.strides[0] // bias.itemsize, 0)
        else:
            raise ValueError(f"hopmm.matmul: bias has shape {bias.shape}; it must be ({n},) "
                             f"(one value per output column) or ({m}, 1) (one per row)")
        out.bias = bias
    if c is not None:
        _check_array("c", c, dtype, device_id)
        try:  # c broadcasts to the result, not the result to c
            ok = numpy.broadcast_shapes(c.shape, shapes.out_shape) == shapes.out_shape
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"hopmm.matmul: c has shape {c.shape}, which does not broadcast "
                             f"to the result's shape {shapes.out_shape}")
        if beta != 0.0:  # beta == 0: c is not read (NaN and inf in it do not propagate)
            out.spec = EpilogueSpec(activation, bias is not None, True)
            out.c = c
            out.c3, out.c_strides, out.c_in_place = c_view(c, shapes)
    return out


def c_view(c, shapes):
    """c broadcast to the output and seen as (batch..., m, n) (views only, no GPU work):
    (the view, its (batch, row, col) element strides, whether its batch dimensions collapse
    into that one batch stride; where they do not, the kernel reads a contiguous copy of the
    view, whose strides these are)."""
    import cupy

    view = cupy.broadcast_to(c, shapes.out_shape)
    # A vector operand's missing dimension comes back as an axis of one (m, or n).
    if shapes.a_is_vector:
        view = view[..., None, :] if not shapes.b_is_vector else view[..., None]
    if shapes.b_is_vector:
        view = view[..., None]
    item = view.itemsize
    batch_stride = collapsed_stride(view.shape[:-2], view.strides[:-2])
    if batch_stride is None:
        return view, (shapes.m * shapes.n, shapes.n, 1), False
    rs, cs = view.strides[-2:]
    # A dimension of extent one is never stepped over.
    return view, (batch_stride // item, rs // item if shapes.m > 1 else 0,
                  cs // item if shapes.n > 1 else 0), True


def collapsed_stride(shape: tuple, strides: tuple) -> int | None:
    """The one stride that steps through dims `shape` flattened (row-major), or None when they
    do not collapse (0 for dims that are all broadcast; any value for a single slice)."""
    dims = [(e, s) for e, s in zip(shape, strides) if e > 1]
    if not dims:
        return 0
    for (e_hi, s_hi), (e_lo, s_lo) in zip(dims, dims[1:]):
        if s_hi != s_lo * e_lo:
            return None
    return dims[-1][1]


def activate(xp, x, activation: str | None):
    """The activation with array module `xp` (NumPy or CuPy), in x's dtype. Written in forms
    without cancellation, so the negative tails keep their relative accuracy: 1 + erf(x) or
    1 + tanh(x) of a very negative x loses every digit in fp32 (x = -4: 1 + erf(-4 / sqrt 2)
    is 6e-5, with an absolute error of a few 1e-8)."""
    if activation is None:
        return x
    if activation == "relu":
        return xp.maximum(x, 0)
    if activation == "gelu":
        return 0.5 * x * _erfc(xp, -x / math.sqrt(2))
    if activation == "gelu_tanh":
        # 0.5 * (1 + tanh(u)) = logistic(2u)
        return x * _logistic(xp, 2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
    if activation == "silu":
        return x * _logistic(xp, x)
    if activation == "sigmoid":
        return _logistic(xp, x)
    raise ValueError(f"unknown activation {activation!r}")


def _logistic(xp, x):
    """1 / (1 + exp(-x)) through exp(-|x|), which cannot overflow."""
    e = xp.exp(-abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _erfc(xp, x):
    if xp.__name__ == "cupy":
        from cupyx.scipy.special import erfc
        return erfc(x)
    # NumPy (tests' references): element by element, in float64, back to x's dtype.
    return numpy_erfc(x)


def numpy_erfc(x):
    import numpy

    return numpy.vectorize(math.erfc, otypes=[numpy.float64])(x).astype(x.dtype)


def reference(xp, acc, *, bias=None, activation=None, alpha=1.0, beta=0.0, c=None):
    """The chain on an accumulator array `acc` (already in the compute dtype), with `xp`."""
    y = alpha * acc
    if c is not None and beta != 0.0:
        y = y + beta * c.astype(acc.dtype)
    if bias is not None:
        y = y + bias.astype(acc.dtype)
    return activate(xp, y, activation)
