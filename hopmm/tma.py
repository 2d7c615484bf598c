"""TMA tensor maps: validated descriptions and their 128-byte encodings.

A `TensorMapSpec` describes a tiled view of a global-memory tensor, dims
innermost first (a row-major M x K matrix is dims=(K, M)). `validate` checks it
against the documented rules of cuTensorMapEncodeTiled, so mistakes surface as
a `TmaError` naming the field instead of a bare CUDA_ERROR_INVALID_VALUE.

matmul validates each spec once, when it builds a launch, and hands the spec to
`_tensormap.KernelLaunch`, which re-encodes it with each call's base address.
`encode`, `encode_into` and `as_kernel_arg` produce a standalone map (128 bytes,
taken by value as a `const __grid_constant__ CUtensorMap`) for inspection, for
tests, and for kernels launched through CuPy.
"""

from dataclasses import dataclass
from numbers import Integral

import numpy as np

from hopmm import _tensormap


class TmaError(ValueError):
    """A TensorMapSpec breaks a rule of cuTensorMapEncodeTiled."""


# Enum values of CUDA's cuda.h (checked against it by tests/test_tma.py).
DATA_TYPES = {"float16": 6, "bfloat16": 9, "float32": 7}  # CUtensorMapDataType
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}  # swizzle span in bytes -> CUtensorMapSwizzle

L2_PROMOTION_NONE = 0  # CUtensorMapL2promotion
L2_PROMOTION_64B = 1
L2_PROMOTION_128B = 2
L2_PROMOTION_256B = 3
L2_PROMOTIONS = (L2_PROMOTION_NONE, L2_PROMOTION_64B, L2_PROMOTION_128B, L2_PROMOTION_256B)

OOB_FILL_NONE = 0  # CUtensorMapFloatOOBfill: out-of-bounds elements read as zero
OOB_FILL_NAN_REQUEST_ZERO_FMA = 1
OOB_FILLS = (OOB_FILL_NONE, OOB_FILL_NAN_REQUEST_ZERO_FMA)

# Limits documented for cuTensorMapEncodeTiled.
MAX_RANK = 5
MAX_DIM = 2**32
ADDRESS_ALIGN = 16
STRIDE_ALIGN = 16
STRIDE_LIMIT = 2**40  # strides must be strictly below this
MAX_BOX = 256
BOX_ROW_ALIGN = 16  # bytes of box[0] * itemsize
MAX_ADDRESS = 2**64 - 1

TENSOR_MAP_BYTES = 128  # sizeof(CUtensorMap)
# One opaque map as raw bytes. CuPy passes a numpy.void scalar to a RawKernel
# by value, byte for byte, matching a `const __grid_constant__ CUtensorMap`.
TENSOR_MAP_DTYPE = np.dtype((np.void, TENSOR_MAP_BYTES))


def _is_int(x):
    # `type(x) is int` first: validation runs on every matmul call and the
    # ABC check (which admits numpy ints) is several times slower.
    return type(x) is int or (isinstance(x, Integral) and not isinstance(x, bool))


def _check_ints(name, values, count, count_rule, lo, hi, rule):
    """values must be a tuple or list of `count` ints, each in lo..hi."""
    if not isinstance(values, (tuple, list)) or len(values) != count:
        raise TmaError(f"{name} = {values!r}: must be a tuple of {count} ints ({count_rule})")
    for i, v in enumerate(values):
        if not (type(v) is int or _is_int(v)) or not lo <= v <= hi:
            raise TmaError(f"{name}[{i}] = {v!r}: {rule}")


@dataclass(frozen=True)
class TensorMapSpec:
    """A tiled TMA view of a tensor; sequences are innermost dimension first.

    dtype: a key of DATA_TYPES. address: device pointer of element 0.
    dims: elements per dimension. strides_bytes: byte stride of dimensions
    1..rank-1 (dimension 0 is contiguous). box: elements per dimension moved
    by one TMA copy (may exceed dims; the overhang is filled per oob_fill).
    swizzle: shared-memory swizzle span in bytes (a key of SWIZZLE).
    """

    dtype: str
    address: int
    dims: tuple
    strides_bytes: tuple
    box: tuple
    swizzle: int = 128
    l2_promotion: int = L2_PROMOTION_128B
    oob_fill: int = OOB_FILL_NONE

    def validate(self):
        """Raises TmaError naming the field and the rule it breaks."""
        if not isinstance(self.dtype, str) or self.dtype not in DATA_TYPES:
            raise TmaError(f"dtype = {self.dtype!r}: must be one of {sorted(DATA_TYPES)}")
        itemsize = ITEMSIZE[self.dtype]

        dims = self.dims
        if not isinstance(dims, (tuple, list)) or not 1 <= len(dims) <= MAX_RANK:
            raise TmaError(f"dims = {dims!r}: must be a tuple of 1..{MAX_RANK} ints (the rank)")
        rank = len(dims)
        _check_ints("dims", dims, rank, "the rank", 1, MAX_DIM,
                    "each dim must be an int in 1..2**32")
        _check_ints("strides_bytes", self.strides_bytes, rank - 1,
                    "rank-1: dimension 0 is contiguous", 0, STRIDE_LIMIT - 1,
                    "each stride must be an int number of bytes below 2**40")
        for i, s in enumerate(self.strides_bytes):
            if s % STRIDE_ALIGN:
                raise TmaError(
                    f"strides_bytes[{i}] = {s}: each stride must be a multiple of "
                    f"{STRIDE_ALIGN} bytes"
                )

        if not _is_int(self.address) or not 0 <= self.address <= MAX_ADDRESS:
            raise TmaError(f"address = {self.address!r}: must be an int in 0..2**64-1")
        if self.address % ADDRESS_ALIGN:
            raise TmaError(
                f"address = {self.address:#x}: must be {ADDRESS_ALIGN}-byte aligned"
            )

        _check_ints("box", self.box, rank, "one per dim", 1, MAX_BOX,
                    f"each box dim must be an int in 1..{MAX_BOX}")
        row_bytes = self.box[0] * itemsize
        if row_bytes % BOX_ROW_ALIGN:
            raise TmaError(
                f"box[0] = {self.box[0]}: box[0] * itemsize = {row_bytes} bytes "
                f"({self.dtype}) must be a multiple of {BOX_ROW_ALIGN}"
            )

        if not _is_int(self.swizzle) or self.swizzle not in SWIZZLE:
            raise TmaError(f"swizzle = {self.swizzle!r}: must be one of {sorted(SWIZZLE)} (bytes)")
        if self.swizzle and row_bytes > self.swizzle:
            raise TmaError(
                f"box[0] = {self.box[0]}: with swizzle = {self.swizzle}, box[0] * itemsize "
                f"= {row_bytes} bytes ({self.dtype}) must be <= the swizzle span"
            )

        if not _is_int(self.l2_promotion) or self.l2_promotion not in L2_PROMOTIONS:
            raise TmaError(
                f"l2_promotion = {self.l2_promotion!r}: must be one of {L2_PROMOTIONS} "
                f"(the L2_PROMOTION_* constants)"
            )
        if not _is_int(self.oob_fill) or self.oob_fill not in OOB_FILLS:
            raise TmaError(
                f"oob_fill = {self.oob_fill!r}: must be one of {OOB_FILLS} "
                f"(the OOB_FILL_* constants)"
            )

    def _driver_args(self):
        return (
            DATA_TYPES[self.dtype], self.address, self.dims, self.strides_bytes, self.box,
            SWIZZLE[self.swizzle], self.l2_promotion, self.oob_fill,
        )


def driver_available():
    """True if the CUDA driver can encode tensor maps in this process."""
    return _tensormap.driver_available()


def encode(spec):
    """Validates spec and returns its 128-byte CUtensorMap.

    Raises TmaError for an invalid spec, RuntimeError without a CUDA driver or
    when the driver rejects the map. The driver needs a current CUDA context
    (CuPy creates one with its first allocation).
    """
    spec.validate()
    return _tensormap.encode_tiled(*spec._driver_args())


def encode_into(buf, offset, spec):
    """Like encode, but writes the map into the writable buffer buf at byte
    offset (e.g. one slot of a numpy array of TENSOR_MAP_DTYPE) instead of
    returning a new bytes object. Raises ValueError if the 128 bytes do not fit."""
    spec.validate()
    _tensormap.encode_tiled_into(buf, offset, *spec._driver_args())


def tensor_map_dtype():
    """The numpy dtype of one opaque 128-byte tensor map."""
    return TENSOR_MAP_DTYPE


def as_kernel_arg(raw):
    """A copy of the 128-byte map raw as a numpy scalar that cupy.RawKernel
    passes by value to a `const __grid_constant__ CUtensorMap` parameter."""
    data = bytes(raw)
    if len(data) != TENSOR_MAP_BYTES:
        raise TmaError(f"raw: a tensor map is {TENSOR_MAP_BYTES} bytes, got {len(data)}")
    return np.void(data)  # owns a copy of the bytes; dtype is TENSOR_MAP_DTYPE
