"""CPU tests for hopmm.tma and the hopmm._tensormap extension (no GPU needed;
the few checks that need a driver or a GPU skip themselves)."""

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hopmm import _tensormap, tma

# bf16 row-major 4096 x 4096 (dims innermost first), 128 x 64 tiles, 128B swizzle.
GOOD = tma.TensorMapSpec(
    dtype="bfloat16",
    address=0x7F00_0000_0000,
    dims=(4096, 4096),
    strides_bytes=(4096 * 2,),
    box=(64, 128),
    swizzle=128,
)
NO_DRIVER = not _tensormap.driver_available()


def _gpu_count():
    if NO_DRIVER:
        return 0
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no device, or a CuPy/driver mismatch
        return 0


needs_gpu = pytest.mark.skipif(_gpu_count() == 0, reason="needs a CUDA driver and a GPU")


@pytest.fixture
def cuda_context():
    """The driver encodes only with a current context; a CuPy allocation makes one."""
    import cupy
    cupy.zeros(1)


def bad(**changes):
    return dataclasses.replace(GOOD, **changes)


# --- validation: accepted specs ----------------------------------------------

GOOD_SPECS = {
    "bf16-4096x4096-box64x128-swizzle128": GOOD,
    "fp16-swizzle64-box32": bad(dtype="float16", box=(32, 64), swizzle=64),
    "fp32-swizzle32-box8": bad(dtype="float32", strides_bytes=(4096 * 4,), box=(8, 8),
                                swizzle=32),
    "fp32-swizzle128-box32": bad(dtype="float32", strides_bytes=(4096 * 4,), box=(32, 8)),
    "no-swizzle-allows-wide-box": bad(box=(256, 256), swizzle=0),
    "box-larger-than-dims": bad(dims=(8, 3), strides_bytes=(16,), box=(64, 256)),
    "rank1": bad(dims=(4096,), strides_bytes=(), box=(64,)),
    "rank5": bad(dims=(64, 2, 3, 4, 5), strides_bytes=(128, 256, 768, 3072),
                 box=(64, 1, 1, 1, 1)),
    "largest-dim-and-stride": bad(dims=(2**32, 2), strides_bytes=(2**40 - 16,)),
    "zero-stride": bad(strides_bytes=(0,)),
    "numpy-ints-and-list": bad(dims=[np.int64(4096), np.int32(4096)],
                               strides_bytes=(np.uint64(8192),), address=np.uint64(1 << 40)),
    "l2-none-oob-nan": bad(l2_promotion=tma.L2_PROMOTION_NONE,
                           oob_fill=tma.OOB_FILL_NAN_REQUEST_ZERO_FMA),
    "l2-256B": bad(l2_promotion=tma.L2_PROMOTION_256B),
}


@pytest.mark.parametrize("spec", GOOD_SPECS.values(), ids=GOOD_SPECS.keys())
def test_valid_spec_is_accepted(spec):
    spec.validate()  # raises on failure


def test_defaults_are_128B_swizzle_and_128B_l2_promotion():
    spec = tma.TensorMapSpec("float16", 0, (64,), (), (64,))
    assert (spec.swizzle, spec.l2_promotion, spec.oob_fill) == (
        128, tma.L2_PROMOTION_128B, tma.OOB_FILL_NONE)


# --- validation: rejected specs, each with the field and the rule named ------

BAD_SPECS = {
    # id: (changes to GOOD, regex the message must match)
    "dtype-unknown": (dict(dtype="int8"), r"^dtype = 'int8': must be one of"),
    "dtype-numpy-object": (dict(dtype=np.float16), r"^dtype = .*must be one of"),
    "rank0": (dict(dims=(), strides_bytes=(), box=()), r"^dims = \(\): .*1\.\.5 ints \(the rank\)"),
    "rank6": (dict(dims=(1,) * 6, strides_bytes=(16,) * 5, box=(8,) * 6),
              r"^dims = .*1\.\.5 ints \(the rank\)"),
    "dims-not-a-sequence": (dict(dims=4096), r"^dims = 4096: must be a tuple"),
    "dim-zero": (dict(dims=(4096, 0)), r"^dims\[1\] = 0: each dim must be an int in 1\.\.2\*\*32"),
    "dim-above-2^32": (dict(dims=(2**32 + 1, 4096)), r"^dims\[0\] = 4294967297: .*1\.\.2\*\*32"),
    "dim-float": (dict(dims=(4096.0, 4096)), r"^dims\[0\] = 4096\.0: each dim must be an int"),
    "dim-bool": (dict(dims=(True, 4096)), r"^dims\[0\] = True: each dim must be an int"),
    "strides-too-many": (dict(strides_bytes=(8192, 8192)),
                         r"^strides_bytes = .*1 ints \(rank-1"),
    "strides-missing": (dict(strides_bytes=()), r"^strides_bytes = \(\): .*1 ints \(rank-1"),
    "stride-not-multiple-of-16": (dict(strides_bytes=(8200,)),
                                  r"^strides_bytes\[0\] = 8200: .*multiple of 16 bytes"),
    "stride-2^40": (dict(strides_bytes=(2**40,)), r"^strides_bytes\[0\] = 1099511627776: .*below 2\*\*40"),
    "stride-negative": (dict(strides_bytes=(-16,)), r"^strides_bytes\[0\] = -16: .*below 2\*\*40"),
    "address-misaligned": (dict(address=0x7F00_0000_0008),
                           r"^address = 0x7f0000000008: must be 16-byte aligned"),
    "address-negative": (dict(address=-16), r"^address = -16: must be an int in 0\.\.2\*\*64-1"),
    "address-above-2^64": (dict(address=2**64), r"^address = .*0\.\.2\*\*64-1"),
    "address-float": (dict(address=1024.0), r"^address = 1024\.0: must be an int"),
    "box-wrong-rank": (dict(box=(64,)), r"^box = \(64,\): must be a tuple of 2 ints"),
    "box-zero": (dict(box=(64, 0)), r"^box\[1\] = 0: each box dim must be an int in 1\.\.256"),
    "box-257": (dict(box=(64, 257), swizzle=0), r"^box\[1\] = 257: .*1\.\.256"),
    "box-row-not-16B": (dict(box=(4, 128)),
                        r"^box\[0\] = 4: box\[0\] \* itemsize = 8 bytes .*multiple of 16"),
    "box-row-wider-than-swizzle128": (dict(box=(128, 128)),
                                      r"^box\[0\] = 128: with swizzle = 128.* 256 bytes"),
    "box-row-wider-than-swizzle32": (dict(dtype="float32", box=(16, 64), swizzle=32),
                                     r"^box\[0\] = 16: with swizzle = 32.* 64 bytes .*<= the swizzle"),
    "swizzle-16": (dict(swizzle=16), r"^swizzle = 16: must be one of \[0, 32, 64, 128\]"),
    "swizzle-enum-value-not-bytes": (dict(swizzle=3), r"^swizzle = 3: must be one of"),
    "l2-promotion-4": (dict(l2_promotion=4), r"^l2_promotion = 4: must be one of \(0, 1, 2, 3\)"),
    "oob-fill-2": (dict(oob_fill=2), r"^oob_fill = 2: must be one of \(0, 1\)"),
}


@pytest.mark.parametrize("changes, message", BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_invalid_spec_is_rejected_with_a_clear_message(changes, message):
    spec = bad(**changes)
    with pytest.raises(tma.TmaError, match=message):
        spec.validate()
    # encode validates before touching the driver, with or without one.
    with pytest.raises(tma.TmaError, match=message):
        tma.encode(spec)
    with pytest.raises(tma.TmaError, match=message):
        tma.encode_into(np.zeros(1, tma.tensor_map_dtype()), 0, spec)


def test_tma_error_is_a_value_error():
    assert issubclass(tma.TmaError, ValueError)


# --- enum values: tma.py, the extension and cuda.h agree ---------------------

# (cuda.h enum, cuda.h member, value in tma.py, attribute of the extension)
ENUMS = [
    ("CUtensorMapDataType_enum", "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", tma.DATA_TYPES["float16"],
     "DATA_TYPE_FLOAT16"),
    ("CUtensorMapDataType_enum", "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", tma.DATA_TYPES["bfloat16"],
     "DATA_TYPE_BFLOAT16"),
    ("CUtensorMapDataType_enum", "CU_TENSOR_MAP_DATA_TYPE_FLOAT32", tma.DATA_TYPES["float32"],
     "DATA_TYPE_FLOAT32"),
    ("CUtensorMapSwizzle_enum", "CU_TENSOR_MAP_SWIZZLE_NONE", tma.SWIZZLE[0], "SWIZZLE_NONE"),
    ("CUtensorMapSwizzle_enum", "CU_TENSOR_MAP_SWIZZLE_32B", tma.SWIZZLE[32], "SWIZZLE_32B"),
    ("CUtensorMapSwizzle_enum", "CU_TENSOR_MAP_SWIZZLE_64B", tma.SWIZZLE[64], "SWIZZLE_64B"),
    ("CUtensorMapSwizzle_enum", "CU_TENSOR_MAP_SWIZZLE_128B", tma.SWIZZLE[128], "SWIZZLE_128B"),
    ("CUtensorMapL2promotion_enum", "CU_TENSOR_MAP_L2_PROMOTION_NONE", tma.L2_PROMOTION_NONE,
     "L2_PROMOTION_NONE"),
    ("CUtensorMapL2promotion_enum", "CU_TENSOR_MAP_L2_PROMOTION_L2_64B", tma.L2_PROMOTION_64B,
     "L2_PROMOTION_64B"),
    ("CUtensorMapL2promotion_enum", "CU_TENSOR_MAP_L2_PROMOTION_L2_128B", tma.L2_PROMOTION_128B,
     "L2_PROMOTION_128B"),
    ("CUtensorMapL2promotion_enum", "CU_TENSOR_MAP_L2_PROMOTION_L2_256B", tma.L2_PROMOTION_256B,
     "L2_PROMOTION_256B"),
    ("CUtensorMapFloatOOBfill_enum", "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE", tma.OOB_FILL_NONE,
     "OOB_FILL_NONE"),
    ("CUtensorMapFloatOOBfill_enum", "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA",
     tma.OOB_FILL_NAN_REQUEST_ZERO_FMA, "OOB_FILL_NAN_REQUEST_ZERO_FMA"),
    # Used only inside the extension.
    ("CUtensorMapInterleave_enum", "CU_TENSOR_MAP_INTERLEAVE_NONE", 0, "INTERLEAVE_NONE"),
    ("cudaError_enum", "CUDA_SUCCESS", 0, "CUDA_SUCCESS"),
    ("cudaError_enum", "CUDA_ERROR_NOT_INITIALIZED", 3, "CUDA_ERROR_NOT_INITIALIZED"),
    ("cudaError_enum", "CUDA_ERROR_INVALID_CONTEXT", 201, "CUDA_ERROR_INVALID_CONTEXT"),
    ("CUlaunchAttributeID_enum", "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION", 6,
     "LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION"),
    ("CUlaunchAttributeID_enum", "CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION", 4,
     "LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION"),
]
ENUM_IDS = [member for _, member, _, _ in ENUMS]

# A top-level declaration; the copies inside doc comments are indented.
ENUM_DECL = re.compile(r"^typedef enum (\w+) \{(.*?)\}", re.MULTILINE | re.DOTALL)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
NUM_QWORDS = re.compile(r"^#define CU_TENSOR_MAP_NUM_QWORDS (\d+)", re.MULTILINE)
QWORD_BYTES = 8


def find_cuda_h():
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    roots += sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    for root in filter(None, roots):
        header = Path(root, "include", "cuda.h")
        if header.is_file():
            return header
    return None


def parse_enums(text):
    """{enum name: {member: value}} for members with literal or implicit values."""
    enums = {}
    for name, body in ENUM_DECL.findall(text):
        members, value = {}, -1
        for item in COMMENT.sub("", body).split(","):
            member, _, expr = (part.strip() for part in item.partition("="))
            if not member:
                continue
            try:
                value = int(expr, 0) if expr else value + 1
            except ValueError:
                break  # a computed value; the members we need come before any
            members[member] = value
        enums[name] = members
    return enums


@pytest.fixture(scope="module")
def cuda_h_text():
    header = find_cuda_h()
    if header is None:
        pytest.skip("no cuda.h under CUDA_HOME, CUDA_PATH, nvcc's toolkit or /usr/local/cuda*")
    return header.read_text(errors="replace")


@pytest.mark.parametrize("enum, member, value, ext_attr", ENUMS, ids=ENUM_IDS)
def test_enum_value_matches_cuda_h(cuda_h_text, enum, member, value, ext_attr):
    enums = parse_enums(cuda_h_text)
    assert enum in enums, f"typedef enum {enum} not found in cuda.h"
    assert enums[enum].get(member) == value


@pytest.mark.parametrize("enum, member, value, ext_attr", ENUMS, ids=ENUM_IDS)
def test_enum_value_matches_extension(enum, member, value, ext_attr):
    assert getattr(_tensormap, ext_attr) == value


def test_tensor_map_size_matches_cuda_h(cuda_h_text):
    match = NUM_QWORDS.search(cuda_h_text)
    assert match, "CU_TENSOR_MAP_NUM_QWORDS not found in cuda.h"
    assert int(match.group(1)) * QWORD_BYTES == tma.TENSOR_MAP_BYTES


def test_limits_match_extension():
    assert _tensormap.TENSOR_MAP_BYTES == tma.TENSOR_MAP_BYTES == 128
    assert _tensormap.MAX_RANK == tma.MAX_RANK


def test_parse_enums_handles_implicit_values_and_comments():
    text = "typedef enum E_enum {\n  A = 2, // two\n  B, /* three */\n  C = 0x10\n} E;\n" \
           "   typedef enum Doc_enum {\n  X = 7\n } Doc;\n"
    assert parse_enums(text) == {"E_enum": {"A": 2, "B": 3, "C": 16}}


# --- the extension without a driver ------------------------------------------

def test_driver_available_is_a_bool():
    assert isinstance(_tensormap.driver_available(), bool)
    assert tma.driver_available() is _tensormap.driver_available()


@pytest.mark.skipif(not NO_DRIVER, reason="a CUDA driver is present")
def test_encode_without_driver_raises_runtime_error():
    with pytest.raises(RuntimeError, match=r"CUDA driver \(libcuda\.so\.1\) not found"):
        tma.encode(GOOD)
    with pytest.raises(RuntimeError, match="NVIDIA driver"):
        tma.encode_into(np.zeros(1, tma.tensor_map_dtype()), 0, GOOD)


RAW_ARGS = dict(data_type=9, address=0x7F00_0000_0000, dims=[4096, 4096],
                strides_bytes=[8192], box=[64, 128], swizzle=3, l2_promotion=2, oob_fill=0)
RAW_BAD = {
    "rank0": (dict(dims=[], strides_bytes=[], box=[]), r"dims: rank must be 1\.\.5"),
    "rank6": (dict(dims=[1] * 6), r"dims: at most 5 entries, got 6"),
    "strides-count": (dict(strides_bytes=[]), r"strides_bytes: need rank-1 = 1 entries, got 0"),
    "box-count": (dict(box=[64]), r"box: need rank = 2 entries, got 1"),
    "negative-dim": (dict(dims=[-1, 4096]), r"dims\[0\] = -1 is not an integer .*uint64_t"),
    "box-overflows-uint32": (dict(box=[64, 2**32]), r"box\[1\] = 4294967296 .*uint32_t"),
    "float-stride": (dict(strides_bytes=[8192.0]), r"strides_bytes\[0\] = 8192\.0 is not an int"),
}


@pytest.mark.parametrize("changes, message", RAW_BAD.values(), ids=RAW_BAD.keys())
def test_extension_checks_argument_shapes_before_the_driver(changes, message):
    with pytest.raises(ValueError, match=message):
        _tensormap.encode_tiled(**{**RAW_ARGS, **changes})


# --- encode_into bounds checks (before any driver call) ----------------------

OUT_OF_BOUNDS = {
    "negative-offset": (256, -1),
    "past-the-end": (256, 129),
    "buffer-too-small": (127, 0),
    "empty-buffer": (0, 0),
}


@pytest.mark.parametrize("size, offset", OUT_OF_BOUNDS.values(), ids=OUT_OF_BOUNDS.keys())
def test_encode_into_rejects_out_of_bounds_offsets(size, offset):
    buf = np.full(size, 0xAB, np.uint8)
    with pytest.raises(ValueError, match=rf"offset {offset}: .*does not fit in a buffer of {size}"):
        tma.encode_into(buf, offset, GOOD)
    assert (buf == 0xAB).all(), "buffer was written despite the error"


@pytest.mark.parametrize("buf", [
    pytest.param(bytes(256), id="bytes"),
    pytest.param(np.zeros(256, np.uint8)[::2], id="strided-numpy"),
    pytest.param(np.zeros(2, tma.TENSOR_MAP_DTYPE).view(np.uint8)[:0:-1], id="reversed-numpy"),
])
def test_encode_into_rejects_read_only_or_strided_buffers(buf):
    if isinstance(buf, np.ndarray) and buf.flags.writeable:
        assert not buf.flags.c_contiguous
    with pytest.raises(ValueError, match="writable, contiguous buffer"):
        tma.encode_into(buf, 0, GOOD)


IN_BOUNDS = pytest.mark.parametrize("offset", [0, 64, 128],
                                    ids=["first-slot", "unaligned", "last-slot"])


@IN_BOUNDS
@pytest.mark.skipif(not NO_DRIVER, reason="a CUDA driver is present")
def test_encode_into_in_bounds_offsets_pass_the_bounds_check(offset):
    buf = np.full(2 * tma.TENSOR_MAP_BYTES, 0xAB, np.uint8)
    with pytest.raises(RuntimeError, match="driver"):  # got past the bounds check
        tma.encode_into(buf, offset, GOOD)
    assert (buf == 0xAB).all()


@IN_BOUNDS
@needs_gpu
def test_encode_into_writes_only_its_slot(cuda_context, offset):
    buf = np.full(2 * tma.TENSOR_MAP_BYTES, 0xAB, np.uint8)
    tma.encode_into(buf, offset, GOOD)
    assert bytes(buf[offset:offset + tma.TENSOR_MAP_BYTES]) == tma.encode(GOOD)
    untouched = np.delete(buf, np.s_[offset:offset + tma.TENSOR_MAP_BYTES])
    assert (untouched == 0xAB).all()


# --- kernel argument dtype ---------------------------------------------------

def test_tensor_map_dtype_is_128_opaque_bytes():
    dtype = tma.tensor_map_dtype()
    assert dtype == np.dtype((np.void, 128))
    assert dtype.itemsize == tma.TENSOR_MAP_BYTES


@pytest.mark.parametrize("raw", [
    pytest.param(bytes(range(128)), id="bytes"),
    pytest.param(bytearray(range(128)), id="bytearray"),
    pytest.param(np.arange(128, dtype=np.uint8), id="numpy-uint8"),
])
def test_as_kernel_arg_copies_the_map_into_a_scalar(raw):
    arg = tma.as_kernel_arg(raw)
    assert isinstance(arg, np.void)
    assert arg.dtype == tma.tensor_map_dtype()
    assert arg.tobytes() == bytes(range(128))
    if not isinstance(raw, bytes):
        raw[0] = 99  # mutating the source leaves the argument unchanged
        assert arg.tobytes()[0] == 0


@pytest.mark.parametrize("size", [0, 127, 129, 256])
def test_as_kernel_arg_rejects_wrong_sizes(size):
    with pytest.raises(tma.TmaError, match=f"128 bytes, got {size}"):
        tma.as_kernel_arg(bytes(size))


# --- with a GPU (skipped on CPU-only machines) -------------------------------

@needs_gpu
def test_encode_returns_128_bytes_for_a_device_array(cuda_context):
    import cupy
    a = cupy.empty((4096, 4096), dtype=cupy.float16)
    spec = dataclasses.replace(GOOD, dtype="float16", address=a.data.ptr)
    raw = tma.encode(spec)
    assert isinstance(raw, bytes) and len(raw) == tma.TENSOR_MAP_BYTES
    assert raw == tma.encode(spec), "encoding is deterministic"


@needs_gpu
def test_driver_rejection_names_the_code_and_echoes_the_arguments(cuda_context):
    # Skip the Python validation to reach the driver with a box of 0.
    args = {**RAW_ARGS, "box": [64, 0]}
    with pytest.raises(RuntimeError) as info:
        _tensormap.encode_tiled(**args)
    message = str(info.value)
    assert "cuTensorMapEncodeTiled failed with CUresult 1 (CUDA_ERROR_INVALID_VALUE)" in message
    for echoed in ("data_type=9", "address=0x7f0000000000", "dims=[4096, 4096]",
                   "strides_bytes=[8192]", "box=[64, 0]", "swizzle=3", "l2_promotion=2",
                   "oob_fill=0"):
        assert echoed in message


NO_CONTEXT_SCRIPT = """
from hopmm import _tensormap
try:
    _tensormap.encode_tiled(9, 1 << 40, [64], [], [64], 0, 0, 0)
except RuntimeError as e:
    print(e)
"""


@needs_gpu
def test_encode_without_a_context_raises_instead_of_crashing():
    # A fresh process: the driver is loaded but no context exists yet.
    done = subprocess.run([sys.executable, "-c", NO_CONTEXT_SCRIPT], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "needs a current CUDA context" in done.stdout
    assert re.search(r"CUresult (3|201) \(CUDA_ERROR_(NOT_INITIALIZED|INVALID_CONTEXT)\)",
                     done.stdout)


# One thread loads one box with TMA (mbarrier-tracked), then the block copies
# it out: checks the encoding and that as_kernel_arg passes the map by value.
TMA_LOAD_BOX = r"""
struct alignas(64) TensorMap { unsigned long long opaque[16]; };

extern "C" __global__ void tma_load_box(const __grid_constant__ TensorMap map,
                                        int x, int y, unsigned short* out) {
    constexpr int kBoxCols = 64, kBoxRows = 32, kBytes = kBoxCols * kBoxRows * 2;
    __shared__ alignas(128) unsigned short tile[kBoxRows * kBoxCols];
    __shared__ alignas(8) unsigned long long barrier;
    unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(&barrier));
    unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(tile));
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(bar), "r"(kBytes) : "memory");
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1, {%2, %3}], [%4];"
                     :: "r"(dst), "l"(&map), "r"(x), "r"(y), "r"(bar) : "memory");
    }
    __syncthreads();
    asm volatile("{\n .reg .pred done;\n WAIT:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
                 " @!done bra WAIT;\n}" :: "r"(bar) : "memory");
    for (int i = threadIdx.x; i < kBoxRows * kBoxCols; i += blockDim.x) out[i] = tile[i];
}
"""
BOX_COLS, BOX_ROWS = 64, 32


@needs_gpu
@pytest.mark.parametrize("x, y", [(64, 32), (224, 240)], ids=["inside", "overhanging-edge"])
def test_tma_load_with_encoded_map(cuda_context, x, y):
    import cupy
    rows, cols = 256, 256
    # TMA moves bytes, so distinct uint16 patterns stand in for float16 values.
    a = cupy.arange(rows * cols, dtype=cupy.uint16).reshape(rows, cols)
    spec = tma.TensorMapSpec("float16", a.data.ptr, (cols, rows), (a.strides[0],),
                             (BOX_COLS, BOX_ROWS), swizzle=0)
    out = cupy.full((BOX_ROWS, BOX_COLS), 0xFFFF, dtype=cupy.uint16)
    kernel = cupy.RawKernel(TMA_LOAD_BOX, "tma_load_box")
    kernel((1,), (128,), (tma.as_kernel_arg(tma.encode(spec)), np.int32(x), np.int32(y), out))
    expected = cupy.zeros_like(out)  # TMA fills the part outside the tensor with zeros
    inside = a[y:y + BOX_ROWS, x:x + BOX_COLS]
    expected[:inside.shape[0], :inside.shape[1]] = inside
    assert (out == expected).all()


# ---- KernelLaunch: the launch path of every matmul call ----------------------------------

GOOD_TEMPLATE = (9, (64, 64, 1), (128, 8192), (64, 64, 1), 3, 2, 0)


def make_launch(**kw):
    args = dict(function=0, grid=(1, 1, 1), block_x=128, shared_mem_bytes=0,
                map_templates=[GOOD_TEMPLATE], ints=[1, 2, 3])
    args.update(kw)
    return _tensormap.KernelLaunch(**args)


@pytest.mark.parametrize("kw,match", [
    (dict(grid=(1, 1)), "grid"),
    (dict(map_templates=[GOOD_TEMPLATE] * 21), "at most 20"),
    (dict(map_templates=[GOOD_TEMPLATE[:6]]), "7 fields"),
    (dict(ints=list(range(33))), "ints"),  # 32 at most (test_row_store_cpu counts the need)
    (dict(map_templates=[(9, (64, 64, 1), (128,), (64, 64, 1), 3, 2, 0)]), "strides_bytes"),
    (dict(cluster=(1, 2)), "cluster: 3 ints"),
    (dict(grid=(4, 3, 1), cluster=(1, 2, 1)), "divide the grid"),
    (dict(grid=(4, 4, 1), cluster=(1, 0, 1)), "positive"),
], ids=["grid", "too_many_maps", "short_template", "too_many_ints", "strides_rank",
        "cluster_rank", "cluster_not_dividing", "cluster_zero"])
def test_kernel_launch_rejects_bad_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        make_launch(**kw)


def test_kernel_launch_takes_a_fused_split_k_kernels_arguments():
    """A fused split-K kernel: four maps, the workspace's two pointers and the epilogue's
    two, the raster's 10 integers and the epilogue's 9."""
    # Raises ValueError where the extension takes fewer integers or pointers.
    make_launch(map_templates=[GOOD_TEMPLATE] * 4, ints=list(range(19)), pointers=4)


def test_kernel_launch_takes_the_programmatic_flag():
    """Both launch kinds check their addresses before the driver is asked for anything."""
    for programmatic in (False, True):
        with pytest.raises(ValueError, match="one base address per tensor map"):
            make_launch(programmatic=programmatic).launch(0)


def test_kernel_launch_takes_a_cluster_shape_dividing_its_grid():
    """split_k_cluster's launch: clusters of 1 x splits x 1 over a grid of splits rows;
    addresses are checked before the driver is asked for anything."""
    launch = make_launch(grid=(16, 8, 3), cluster=(1, 8, 1), programmatic=True)
    with pytest.raises(ValueError, match="one base address per tensor map"):
        launch.launch(0)


@pytest.mark.skipif(_tensormap.driver_available(), reason="a CUDA driver is present")
def test_max_active_clusters_without_driver_names_the_driver():
    with pytest.raises(RuntimeError, match="driver"):
        _tensormap.max_active_clusters(0, 384, 0, 2)


def test_kernel_launch_needs_one_address_per_map():
    with pytest.raises(ValueError, match="one base address per tensor map"):
        make_launch().launch(0)


def test_kernel_launch_pointers_follow_the_maps():
    """Split-K passes raw pointers (workspace, semaphores) after the maps' addresses."""
    with pytest.raises(ValueError, match="then 2 pointer arguments"):
        make_launch(pointers=2).launch(0, 1024)
    with pytest.raises(ValueError, match="at most 4 pointer"):
        make_launch(pointers=5)


@pytest.mark.skipif(_tensormap.driver_available(), reason="a CUDA driver is present")
def test_kernel_launch_without_driver_names_the_driver():
    with pytest.raises(RuntimeError, match="driver"):
        make_launch().launch(0, 1024)


# ---- DirectRepeat: every launch of a repeated call that reads and stores in place -----------

def make_direct(launches=None, a_bounds=(0, 256), b_bounds=(-64, 192), out_bounds=(0, 128)):
    if launches is None:
        launches = [make_launch(map_templates=[GOOD_TEMPLATE] * 3)]
    return _tensormap.DirectRepeat(launches, a_bounds, b_bounds, out_bounds)


@pytest.mark.parametrize("launches,error,match", [
    ([], ValueError, "no launches"),
    ([object()], TypeError, "KernelLaunch"),
    ([dict(map_templates=[GOOD_TEMPLATE] * 2)], ValueError, "maps of A, B and C only"),
    ([dict(map_templates=[GOOD_TEMPLATE] * 4)], ValueError, "maps of A, B and C only"),
    ([dict(map_templates=[GOOD_TEMPLATE] * 3, pointers=1)], ValueError, "1 pointers"),
    ([dict(map_templates=[GOOD_TEMPLATE] * 3), dict(map_templates=[GOOD_TEMPLATE] * 4,
                                                     pointers=3)], ValueError, "4 maps"),
], ids=["empty", "not_a_launch", "two_maps", "four_maps", "pointers", "split_k_second"])
def test_direct_repeat_takes_launches_of_a_b_and_c_only(launches, error, match):
    """Split-K's launches take a workspace map and pointers: never a DirectRepeat's."""
    launches = [make_launch(**x) if isinstance(x, dict) else x for x in launches]
    with pytest.raises(error, match=match):
        make_direct(launches)


def test_direct_repeat_rejects_inverted_bounds():
    with pytest.raises(ValueError, match=r"out_bounds = \(5, 4\) has lo > hi"):
        make_direct(out_bounds=(5, 4))


def test_direct_repeat_keeps_its_launches_alive():
    launches = [make_launch(map_templates=[GOOD_TEMPLATE] * 3) for _ in range(2)]
    ids = [id(x) for x in launches]
    direct = make_direct(launches)
    del launches
    assert [id(x) for x in direct.launches] == ids


# (a_ptr, b_ptr, c_ptr) against A's bounds (0, 256), B's (-64, 192) and out's (0, 128):
# out's bytes [c, c + 128) against A's [a, a + 256) and B's [b - 64, b + 192).
A, B = 0x10000, 0x20000
PLACEMENTS = {
    "apart": (A, B, 0x30000),
    "just_below_a": (A, B, A - 128),
    "just_past_a": (A, B, A + 256),
    "last_byte_of_a": (A, B, A + 255 - 127),
    "first_byte_of_a": (A, B, A - 127),
    "is_a": (A, B, A),
    "below_b_negative_strides": (A, B, B - 64 - 127),
    "just_below_b": (A, B, B - 64 - 128),
    "just_past_b": (A, B, B + 192),
    "straddles_b": (A, B, B + 100),
}


def _expected_overlap(a_ptr, b_ptr, c_ptr):
    from hopmm.layout import overlaps

    c = (c_ptr, c_ptr + 128)
    return overlaps(c, (a_ptr, a_ptr + 256)) or overlaps(c, (b_ptr - 64, b_ptr + 192))


def _declined_or_launched(run, launch, clash: bool):
    """run() returns False where out clashes, before the driver is asked for anything; else it
    launches: without a driver, the error of launch() (the stand-in kernel on the addresses
    run() should pass it)."""
    if clash:
        assert run() is False
        return
    if _tensormap.driver_available():
        pytest.skip("a CUDA driver is present: the stand-in kernel is never launched")
    with pytest.raises(RuntimeError) as direct_error:
        run()
    with pytest.raises(RuntimeError) as launch_error:
        launch()
    assert str(direct_error.value) == str(launch_error.value)
    assert "CUDA driver (libcuda.so.1) not found" in str(direct_error.value)


@pytest.mark.parametrize("placement", PLACEMENTS, ids=list(PLACEMENTS))
def test_direct_repeat_declines_exactly_the_overlaps_of_layout(placement):
    """Half-open bounds, layout.overlaps's rule: an out that shares a byte with A or B is
    declined (False) before the driver is asked for anything; one that only touches them, or
    lies apart, is launched (without a driver: KernelLaunch.launch's own error)."""
    ptrs = PLACEMENTS[placement]
    direct = make_direct()
    _declined_or_launched(lambda: direct.run(0, *ptrs),
                          lambda: direct.launches[0].launch(0, *ptrs), _expected_overlap(*ptrs))


def test_placements_cover_both_outcomes():
    outcomes = [_expected_overlap(*p) for p in PLACEMENTS.values()]
    assert outcomes.count(True) >= 4 and outcomes.count(False) >= 4


@pytest.mark.skipif(_tensormap.driver_available(), reason="a CUDA driver is present")
def test_direct_repeat_without_out_bounds_always_launches():
    """A new result overlaps nothing: a recipe of calls without out checks nothing."""
    with pytest.raises(RuntimeError, match="driver"):
        make_direct(out_bounds=None).run(0, A, B, A)


# ---- DirectRepeat of fused launches: bias and c after A, B and C ----------------------------
# Bias's bounds (0, 64) and c's (0, 128), c of out's layout: out's [c, c + 128) against them.
BIAS, C_IN = 0x40000, 0x50000


def make_fused_direct(epilogue_bounds=((0, 64), (0, 128)), out_may_be=1, out_bounds=(0, 128),
                      launches=None):
    if launches is None:
        launches = [make_launch(map_templates=[GOOD_TEMPLATE] * 3, pointers=2)]
    return _tensormap.DirectRepeat(launches, (0, 256), (-64, 192), out_bounds,
                                   list(epilogue_bounds), out_may_be)


@pytest.mark.parametrize("kw,error,match", [
    (dict(epilogue_bounds=((0, 64),)), ValueError, "bias's and c's, got 1"),
    (dict(epilogue_bounds=((0, 64), (9, 8))), ValueError, r"epilogue_bounds = \(9, 8\)"),
    (dict(out_may_be=2), ValueError, "out_may_be = 2 names no epilogue operand"),
    (dict(launches=[make_launch(map_templates=[GOOD_TEMPLATE] * 3)]), ValueError,
     "maps of A, B and C, then bias and c, got one of 3 maps and 0 pointers"),
    (dict(launches=[make_launch(map_templates=[GOOD_TEMPLATE] * 2, pointers=3)]), ValueError,
     "got one of 2 maps and 3 pointers"),
], ids=["one_operand", "inverted_bounds", "out_may_be_past", "plain_launch", "two_maps"])
def test_fused_direct_repeat_rejects_bad_construction(kw, error, match):
    with pytest.raises(error, match=match):
        make_fused_direct(**kw)


def test_direct_repeat_runs_only_its_own_kind():
    """Plain launches take three addresses and fused ones five: each run names the other."""
    with pytest.raises(ValueError, match="run_fused"):
        make_fused_direct().run(0, A, B, 0x30000)
    with pytest.raises(ValueError, match=r"run\(\)"):
        make_direct().run_fused(0, A, B, 0x30000, BIAS, C_IN)


def test_fused_direct_repeat_takes_a_c_map():
    """c read through TMA: four maps and the bias pointer make the same five addresses."""
    make_fused_direct(launches=[make_launch(map_templates=[GOOD_TEMPLATE] * 4, pointers=1)])


# (out, bias, c, out_may_be, epilogue_bounds) -> whether out's bytes [out, out + 128) clash.
FUSED_PLACEMENTS = {
    "apart": (0x30000, BIAS, C_IN, 1, ((0, 64), (0, 128)), False),
    "out_is_c": (C_IN, BIAS, C_IN, 1, ((0, 64), (0, 128)), False),
    "out_is_c_of_another_layout": (C_IN, BIAS, C_IN, -1, ((0, 64), (0, 128)), True),
    "out_straddles_c": (C_IN + 64, BIAS, C_IN, 1, ((0, 64), (0, 128)), True),
    "out_covers_bias": (BIAS - 64, BIAS, C_IN, 1, ((0, 64), (0, 128)), True),
    "out_just_below_bias": (BIAS - 128, BIAS, C_IN, 1, ((0, 64), (0, 128)), False),
    "out_is_bias_when_bias_is_c": (BIAS, BIAS, BIAS, 1, ((0, 64), (0, 128)), True),
    "c_not_read": (C_IN + 64, BIAS, C_IN, -1, ((0, 64), None), False),
    "no_bias": (BIAS, BIAS, C_IN, 1, (None, (0, 128)), False),
    "out_over_a": (A + 8, BIAS, C_IN, 1, ((0, 64), (0, 128)), True),
}


@pytest.mark.parametrize("placement", FUSED_PLACEMENTS, ids=list(FUSED_PLACEMENTS))
def test_fused_direct_repeat_declines_exactly_the_overlaps(placement):
    """An out sharing a byte with A, B, bias or a c read (other than being c of its own
    layout) is declined before the driver is asked for anything; operands not read are not
    checked; everything else is launched (without a driver: KernelLaunch.launch's error)."""
    out, bias, c, out_may_be, bounds, clash = FUSED_PLACEMENTS[placement]
    direct = make_fused_direct(bounds, out_may_be)
    read = [0 if b is None else x for x, b in zip((bias, c), bounds)]
    _declined_or_launched(lambda: direct.run_fused(0, A, B, out, bias, c),
                          lambda: direct.launches[0].launch(0, A, B, out, *read), clash)


@pytest.mark.skipif(_tensormap.driver_available(), reason="a CUDA driver is present")
def test_fused_direct_repeat_without_out_bounds_always_launches():
    with pytest.raises(RuntimeError, match="driver"):
        make_fused_direct(out_bounds=None, out_may_be=-1).run_fused(0, A, B, BIAS, BIAS, C_IN)
