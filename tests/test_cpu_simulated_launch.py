"""CPU: the whole Python side of a kernel call, run against a simulated GPU.

CuPy is replaced by NumPy arrays that expose CuPy's pointer attributes, and the kernel by a
stand-in that computes C = A @ B from nothing but what the real kernel receives: the three
tensor-map templates (dims, byte strides, boxes), the base addresses and the integer
arguments. A wrong stride, batch mapping, copy, chunk offset or remembered launch therefore
gives a wrong result here exactly as it would on the GPU.
"""
import ctypes
import sys
import types

import ml_dtypes
import numpy as np
import pytest

import hopmm
from hopmm import (api, device, epilogue, fastpath, heuristics, launch, layout, row_copy,
                   shared_a, tma, workspace)
from hopmm.schedules import (BLOCK_M, CLUSTER_REDUCE_GROUP_ROWS, GEMV_MMA_ROWS, TMA_BOX_ELEMS,
                             WARPGROUP_THREADS, WGMMA_M)

BF16 = np.dtype(ml_dtypes.bfloat16)


class _Pointer:
    def __init__(self, array):
        self.ptr = array.__array_interface__["data"][0]
        self.device_id = 0


class _Device:
    id = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeArray(np.ndarray):
    """A NumPy array with the attributes of a cupy.ndarray that hopmm reads."""

    @property
    def data(self):
        return _Pointer(self)

    @property
    def device(self):
        return _Device()


def fake(x):
    return np.asarray(x).view(FakeArray)


def _fake_cupy():
    m = types.ModuleType("cupy")
    m.ndarray = FakeArray
    m.empty = lambda shape, dtype=None: np.empty(shape, dtype).view(FakeArray)
    m.zeros = lambda shape, dtype=None: np.zeros(shape, dtype).view(FakeArray)
    m.uint8, m.uint32 = np.uint8, np.uint32
    m.result_type = np.result_type
    m.broadcast_to = lambda x, shape: np.broadcast_to(x, shape).view(FakeArray)
    m.ascontiguousarray = lambda x: np.ascontiguousarray(x).view(FakeArray)
    m.float32, m.float64 = np.float32, np.float64
    m.maximum, m.exp, m.tanh = np.maximum, np.exp, np.tanh
    m.where = lambda cond, x, y: np.where(cond, x, y).view(FakeArray)
    m.matmul = _fake_matmul
    m.ElementwiseKernel = _FakeElementwiseKernel
    m.cuda = types.SimpleNamespace(
        Device=_Device,
        runtime=types.SimpleNamespace(getDevice=lambda: 0, memcpy2DAsync=_memcpy_2d,
                                      memcpyDeviceToDevice=_DEVICE_TO_DEVICE),
        get_current_stream=lambda: types.SimpleNamespace(ptr=0),
        device=types.SimpleNamespace(get_cublas_handle=lambda: _FakeCublas.HANDLE),
        cublas=_FakeCublas)
    return m


def _fake_matmul(a, b, out=None):
    """cupy.matmul: in fp32 (NumPy's bfloat16 matmul returns float32), rounded to the
    operands' dtype."""
    got = np.matmul(np.asarray(a, np.float32), np.asarray(b, np.float32)).astype(
        np.result_type(a.dtype, b.dtype))
    if out is None:
        return fake(got)
    out[...] = got
    return out


class _FakeCublas:
    """cupy.cuda.cublas's gemmEx on the fake arrays' host memory: column-major operands of
    leading dimensions lda, ldb, ldc, with the library's argument rules; records each call."""
    HANDLE = 7
    CUBLAS_OP_N = 0
    TYPES = {2: np.float16, 14: BF16}
    calls = []

    @staticmethod
    def setStream(handle, stream):
        assert handle == _FakeCublas.HANDLE

    @classmethod
    def gemmEx(cls, handle, transa, transb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb,
               beta, c, c_type, ldc, compute_type, algo):
        assert handle == cls.HANDLE and transa == transb == cls.CUBLAS_OP_N
        assert a_type == b_type == c_type and lda >= m and ldb >= k and ldc >= m
        dt = np.dtype(cls.TYPES[a_type])

        def matrix(ptr, rows, cols, ld):   # column-major rows x cols, columns ld apart
            buf = (ctypes.c_char * (ld * (cols - 1) + rows) * dt.itemsize).from_address(ptr)
            flat = np.frombuffer(buf, dt)
            return np.lib.stride_tricks.as_strided(flat, (rows, cols),
                                                   (dt.itemsize, ld * dt.itemsize))

        scale = [np.frombuffer((ctypes.c_char * 4).from_address(p), np.float32)[0]
                 for p in (alpha, beta)]
        got = scale[0] * (matrix(a, m, k, lda).astype(np.float32)
                          @ matrix(b, k, n, ldb).astype(np.float32))
        out = matrix(c, m, n, ldc)
        out[...] = (got + scale[1] * out.astype(np.float32) if scale[1] else got).astype(dt)
        cls.calls.append((m, n, k, compute_type, algo))


class _FakeElementwiseKernel:
    """cupy.ElementwiseKernel for the one hopmm makes (swiglu's composed gating): its
    operation is checked, and silu(gate) * up computed in fp32, rounded once."""

    def __init__(self, in_params, out_params, operation, name):
        from hopmm.shared_a import GATED_PRODUCT

        assert (in_params, out_params, operation) == ("T gate, T up", "T y", GATED_PRODUCT)

    def __call__(self, gate, up):
        assert gate.dtype == up.dtype and gate.shape == up.shape
        g = np.asarray(gate, np.float32)
        return fake((g / (1 + np.exp(-g)) * np.asarray(up, np.float32)).astype(gate.dtype))


_DEVICE_TO_DEVICE = 3  # cudaMemcpyKind


def _memcpy_2d(dst, dpitch, src, spitch, width, height, kind, stream):
    """cudaMemcpy2DAsync on the fake arrays' host memory, with the runtime's argument rules."""
    assert kind == _DEVICE_TO_DEVICE and width <= min(dpitch, spitch)
    for row in range(height):
        ctypes.memmove(dst + row * dpitch, src + row * spitch, width)


def _zero_rows(address, pitch, width, rows, stream):
    """cuMemsetD2D8Async to zero, on the fake arrays' host memory."""
    assert width <= pitch
    for row in range(rows):
        ctypes.memset(address + row * pitch, 0, width)


_REAL_LOADED = launch._loaded
# Stand-ins for loaded kernels: each kernel name gets its own handle, through which the
# stand-in launch reads the operands' layout from the name's tag (e.g. ..._NN).
_KERNEL_NAMES: dict = {}


def _fake_loaded(cubin_path, name, smem_bytes, device_id):
    handle = _KERNEL_NAMES.setdefault(name, len(_KERNEL_NAMES) + 1)
    return types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=handle),
                                 max_dynamic_shared_size_bytes=smem_bytes)


def _kernel_name(function) -> str:
    """The name of the kernel behind a stand-in handle."""
    return next(n for n, h in _KERNEL_NAMES.items() if h == function)


def _block_n(function) -> int:
    """The tile width of the kernel behind a stand-in handle (its name's MxNxK)."""
    tile = next(part for part in _kernel_name(function).split("_") if part.count("x") == 2)
    return int(tile.split("x")[1])


def _layout(function) -> tuple[bool, bool]:
    """(A is K-major, B is N-major) of the kernel behind a stand-in handle."""
    name = _kernel_name(function)
    tag = name.rsplit("_", 1)[1]
    return tag[0] == "N", tag[1] == "N"


def _epilogue_spec(function):
    """The fused epilogue named by a stand-in kernel's name (`..._ep_relu_bias_c_NT`)."""
    name = _kernel_name(function)
    if "_ep_" not in name:
        return None
    parts = name.split("_ep_")[1].rsplit("_", 1)[0].split("_")
    bias, c = "bias" in parts, "c" in parts
    words = [w for w in parts if w not in ("bias", "c", "rs")]   # "rs": a row store
    act = "_".join(words)
    return epilogue.EpilogueSpec(None if act == "linear" else act, bias, c)


def _strided(address, shape, elem_strides, dtype):
    """The float32 values of a (rows, cols) array at `address` with element strides
    (negative or zero allowed), as the kernel's epilogue reads bias and c."""
    extents = [(e - 1) * s for e, s in zip(shape, elem_strides)]
    lo = sum(min(0, x) for x in extents)
    hi = sum(max(0, x) for x in extents)
    raw = (ctypes.c_char * ((hi - lo + 1) * dtype.itemsize)).from_address(
        address + lo * dtype.itemsize)
    arr = np.ndarray(shape, dtype, buffer=raw, offset=-lo * dtype.itemsize,
                     strides=tuple(s * dtype.itemsize for s in elem_strides))
    return arr.astype(np.float32)


def _view(address, dims, strides, dtype):
    """The (batch, outer, inner) array a tensor map describes."""
    inner, outer, nb = dims
    nbytes = (nb - 1) * strides[1] + (outer - 1) * strides[0] + inner * dtype.itemsize
    raw = (ctypes.c_char * nbytes).from_address(address)
    flat = np.frombuffer(raw, dtype=np.uint8)
    return np.lib.stride_tricks.as_strided(flat.view(dtype), (nb, outer, inner),
                                           (strides[1], strides[0], dtype.itemsize))


class SimulatedLaunch:
    """What the kernel computes, reconstructed from its launch arguments only."""

    launches = 0
    copies = 0            # launches of the row-copy kernel
    split_launches = []   # (grid, stream, workspace pointer, semaphore pointer) of split-K

    def __init__(self, function, grid, block_x, shared_mem_bytes, map_templates, ints,
                 pointers=0, programmatic=False, cluster=(1, 1, 1)):
        self.block_x, self.shared_mem_bytes = block_x, shared_mem_bytes
        self.a_k_major, self.b_n_major = _layout(function)
        self.programmatic = programmatic
        self.cluster = tuple(cluster)
        self.templates = map_templates
        self.grid = grid
        self.pointers = pointers
        self.function = function
        if _KERNEL_NAMES.get(row_copy.KERNEL_NAME) == function:
            assert not map_templates and pointers == row_copy.POINTERS
            assert block_x == row_copy.THREADS
            self.copy_ints = tuple(ints)
            return
        if not map_templates:   # gemv: raw pointers and launch._gemv_ints
            self.gemv_ints = tuple(ints)
            return
        (self.k, self.z0, self.count, self.a_div, self.a_mod, self.b_div, self.b_mod,
         self.tiles_m, self.tiles_n, self.group, self.m, self.n) = ints[:12]
        # A row-store kernel (C's map parameter an address only) takes the output's extent
        # and element strides next (epilogue.ROW_STORE_PARAMS).
        self.row_store = map_templates[2] is launch.ADDRESS_SLOT
        assert self.row_store == ("_rs_" in _kernel_name(function))
        self.row_store_ints = tuple(ints[12:16]) if self.row_store else None
        # A fused epilogue's scalars follow (hopmm/epilogue.py, FusedEpilogue.scalars), and
        # its bias and c pointers come last at launch.
        self.epilogue_ints = tuple(ints[16 if self.row_store else 12:])
        self.epilogue_spec = _epilogue_spec(function)
        assert bool(self.epilogue_ints) == (self.epilogue_spec is not None)

    def launch(self, stream, a_ptr, b_ptr, c_ptr, *extra):
        if hasattr(self, "copy_ints"):   # counted apart: `launches` and `last` are products'
            SimulatedLaunch.copies += 1
            return self._copy_rows(a_ptr, b_ptr, c_ptr, *extra)
        SimulatedLaunch.launches += 1
        SimulatedLaunch.last = self
        if not self.templates:
            return self._gemv(a_ptr, b_ptr, c_ptr, *extra)
        assert len(extra) == self.pointers + len(self.templates) - 3
        if self.epilogue_spec is not None:
            self.epilogue_ptrs, extra = extra[-2:], extra[:-2]
        name = _kernel_name(self.function)
        if name.startswith(("hopmm_shared_a_", "hopmm_swiglu_")):
            return self._dual_b(name, a_ptr, b_ptr, c_ptr, *extra)
        if len(self.templates) == 4 and self.templates[2][3][1] == CLUSTER_REDUCE_GROUP_ROWS:
            return self._split_k_parallel(stream, a_ptr, b_ptr, c_ptr, *extra)
        if len(self.templates) == 4:
            return self._split_k(stream, a_ptr, b_ptr, c_ptr, *extra)
        if not self.row_store and self.templates[2][3][1] == CLUSTER_REDUCE_GROUP_ROWS:
            # C's box: 8 rows
            return self._split_k_cluster(a_ptr, b_ptr, c_ptr)
        assert self.cluster == (1, 1, 1)
        dt = self._dtype()
        if self.row_store:   # the address, then the extent and element strides in the ints
            m, n, row_stride, batch_stride = self.row_store_ints
            nb = self.z0 + self.count
            c_dims = (n, m, nb)
            c_str = (row_stride * dt.itemsize, batch_stride * dt.itemsize)
        else:
            # 64 x 64 boxes, or 32 columns wide on a tile of an odd number of 32 columns,
            # swizzled over their rows' bytes
            half = _block_n(self.function) % TMA_BOX_ELEMS != 0
            assert self.templates[2][3] == (TMA_BOX_ELEMS // (1 + half), TMA_BOX_ELEMS, 1)
            assert self.templates[2][4] == tma.SWIZZLE[64 if half else 128]
            _, c_dims, c_str, *_ = self.templates[2]
        (a, a_dims, a_box), (b, _, _) = self._operand(a_ptr, 0, dt), self._operand(b_ptr, 1, dt)
        c = _view(c_ptr, c_dims, c_str, dt)
        a_k_major, b_n_major = self.a_k_major, self.b_n_major
        assert a_box is None or a_box[1] == TMA_BOX_ELEMS   # 64-row boxes (or 64-wide ones)
        n, m = c_dims[0], c_dims[1]
        # A transposed kernel (KernelConfig.trans_c) computes C^T: its rows are C's columns,
        # and it stores each tile transposed.
        transposed = "_ct_" in name
        if transposed:
            assert self.epilogue_spec is None and not self.row_store
            m, n = n, m
        block_m = WGMMA_M * (self.block_x // WARPGROUP_THREADS - 1)   # a producer, then consumers
        assert self.tiles_m == -(-m // block_m)
        assert self.k == (a_dims[0] if a_k_major else a_dims[1])
        assert (self.m, self.n) == (m, n)   # the extent whose edge the producer's loads stop at
        for z in range(self.z0, self.z0 + self.count):
            za, zb = (z // self.a_div) % self.a_mod, (z // self.b_div) % self.b_mod
            am = a[za] if a_k_major else a[za].T          # (m, k)
            bm = b[zb] if b_n_major else b[zb].T          # (k, n)
            tile = self._final(am.astype(np.float32) @ bm.astype(np.float32), z, dt)
            c[z] = tile.T if transposed else tile

    def _dtype(self):
        """The operands' dtype, from A's map (the first of a phased A's)."""
        first = self.templates[0][0][1] if isinstance(self.templates[0], list) else \
            self.templates[0]
        return BF16 if first[0] == 9 else np.dtype(np.float16)

    def _operand(self, ptr, index, dt):
        """(The (batch, rows, cols) array, its dims as a map gives them, its box; None for a
        phased operand's) of map parameter `index` (0: A, 1: B) at `ptr`."""
        template = self.templates[index]
        if not isinstance(template, list):
            _, dims, strides, box, *_ = template
            return _view(ptr, dims, strides, dt), dims, box
        x = self._phased(ptr, index, dt)
        return x, (x.shape[2], x.shape[1], x.shape[0]), None

    def _phased(self, ptr, index, dt):
        """A (batch, m, k) or B (batch, k, n), map parameter `index`, from its eight phase maps
        (launch.phased_specs): map j holds rows j, j + 8, ..., each starting (j * pitch) % 8
        elements into the map's rows, the lead the kernel skips (its name's _ap<pitch mod 8>
        or _bp<...>)."""
        tag = "_ap" if index == 0 else "_bp"
        pitch_mod8 = int(_kernel_name(self.function).split(tag)[1].split("_")[0])
        rows, cols = (self.m, self.k) if index == 0 else (self.k, self.n)
        group = self.templates[index]
        assert len(group) == layout.PHASES
        nb = group[0][1][1][2]
        x = np.zeros((nb, rows, cols), dt)
        for j, (offset, (_, dims, strides, box, swizzle, *_)) in enumerate(group):
            lead = (j * pitch_mod8) % layout.PHASES
            assert dims[:2] == (cols + lead, -(-(rows - j) // layout.PHASES))
            assert box == (TMA_BOX_ELEMS + layout.PHASES, TMA_BOX_ELEMS // layout.PHASES, 1)
            assert swizzle == 0 and offset % layout.TMA_ALIGN == 0
            x[:, j::layout.PHASES] = _view(ptr + offset, dims, strides, dt)[:, :, lead:]
        return x

    def _dual_b(self, name, a_ptr, b_ptr, c_ptr, *extra):
        """The shared-A kernels (kernel_dual_b.cuh): the second B (and C) through copies of
        the first one's maps at the addresses after C's; swiglu stores silu(A @ B0) *
        (A @ B1) from the fp32 products, rounded once."""
        swiglu = name.startswith("hopmm_swiglu_")
        assert len(self.templates) == (4 if swiglu else 5)
        assert self.pointers == (0 if self.epilogue_spec is None else 2)
        assert self.templates[3] == self.templates[1]
        assert swiglu or self.templates[4] == self.templates[2]
        assert len(extra) == (1 if swiglu else 2)
        (_, a_dims, a_str, a_box, *_), (_, b_dims, b_str, *_), (_, c_dims, c_str, *_) = \
            self.templates[:3]
        dt = BF16 if self.templates[0][0] == 9 else np.dtype(np.float16)
        a = _view(a_ptr, a_dims, a_str, dt)
        b0, b1 = (_view(p, b_dims, b_str, dt) for p in (b_ptr, extra[0]))
        cs = [_view(p, c_dims, c_str, dt) for p in (c_ptr,) + extra[1:]]
        for z in range(self.z0, self.z0 + self.count):
            za, zb = (z // self.a_div) % self.a_mod, (z // self.b_div) % self.b_mod
            am = (a[za] if self.a_k_major else a[za].T).astype(np.float32)
            p0, p1 = (am @ (b[zb] if self.b_n_major else b[zb].T).astype(np.float32)
                      for b in (b0, b1))
            if swiglu:
                assert self.epilogue_spec is None
                cs[0][z] = (epilogue.activate(np, p0, "silu") * p1).astype(dt)
            else:
                cs[0][z], cs[1][z] = self._final(p0, z, dt), self._final(p1, z, dt)

    def _final(self, acc, z, dt):
        """The fp32 tile values of batch slice z through the kernel's fused epilogue (read
        from its arguments only), rounded once."""
        spec = self.epilogue_spec
        if spec is None:
            return acc.astype(dt)
        m, n, brs, bcs, crs, ccs, cbs, alpha, beta = self.epilogue_ints
        assert acc.shape == (m, n)
        alpha, beta = (float(np.array(x, np.int32).view(np.float32)) for x in (alpha, beta))
        bias_ptr, c_ptr = self.epilogue_ptrs
        v = alpha * acc
        if spec.c:
            v = v + beta * _strided(c_ptr + z * cbs * dt.itemsize, (m, n), (crs, ccs), dt)
        if spec.bias:
            v = v + _strided(bias_ptr, (m, n), (brs, bcs), dt)
        return epilogue.activate(np, v.astype(np.float32), spec.activation).astype(dt)

    def _copy_rows(self, *pointers):
        """The row-copy kernel (copy_rows.cuh), from its pointers and integers alone: job j
        (blockIdx.y) copies rows of `width` 16-bit elements between pitches; a padded
        destination (`pad`) whose rows start on 16 bytes gets zeros to the end of each row's
        last 16-byte chunk, any other only the row's elements."""
        assert len(pointers) == row_copy.POINTERS and self.grid[1] in (1, 2)
        n = row_copy.JOB_INTS
        for job in range(self.grid[1]):
            src, dst = pointers[2 * job], pointers[2 * job + 1]
            rows, width, src_pitch, dst_pitch, pad = self.copy_ints[n * job:n * job + n]
            assert src and dst and width <= min(src_pitch, dst_pitch)
            padded = pad and dst % 16 == 0 and dst_pitch % row_copy.CHUNK == 0
            written = -(-width // row_copy.CHUNK) * row_copy.CHUNK if padded else width
            for row in range(rows):
                ctypes.memmove(dst + 2 * row * dst_pitch, src + 2 * row * src_pitch, 2 * width)
                ctypes.memset(dst + 2 * (row * dst_pitch + width), 0, 2 * (written - width))

    def _gemv(self, a_ptr, b_ptr, c_ptr, scratch_ptr):
        """The gemv kernel, from its pointers and integers alone (gemv_entry.cu.in): strides
        in elements along each operand's non-contiguous axis, batch strides in 16-byte units;
        split launches get a scratch whose counters are zero. A transposed kernel (_ct_ in
        its name) computes C^T from its operands (B^T and A^T) and stores C."""
        from hopmm.schedules import GEMV_COUNTERS

        assert self.pointers == 4 and self.cluster == (1, 1, 1)
        (m, n, k, z0, a_div, a_mod, b_div, b_mod, a_ld, b_ld, c_ld, a_b16, b_b16,
         c_b16) = self.gemv_ints
        tiles, splits, count = self.grid
        name = _kernel_name(self.function)
        dt = BF16 if "_bf16_" in name else np.dtype(np.float16)
        if splits > 1:
            counters = _view(scratch_ptr, (GEMV_COUNTERS, 1, 1), (4 * GEMV_COUNTERS,) * 2,
                             np.dtype(np.uint32))
            assert not counters.any(), "counters must be zero when a kernel starts"
        item = dt.itemsize

        def matrix(ptr, rows, cols, row_stride, col_stride):
            extent = ((rows - 1) * row_stride + (cols - 1) * col_stride + 1) * item
            flat = np.frombuffer((ctypes.c_char * extent).from_address(ptr), dtype=dt)
            return np.lib.stride_tricks.as_strided(flat, (rows, cols),
                                                   (row_stride * item, col_stride * item))

        for z in range(z0, z0 + count):
            za, zb = (z // a_div) % a_mod, (z // b_div) % b_mod
            pa, pb, pc = (a_ptr + za * a_b16 * 16, b_ptr + zb * b_b16 * 16, c_ptr + z * c_b16 * 16)
            am = matrix(pa, m, k, a_ld, 1) if self.a_k_major else matrix(pa, m, k, 1, a_ld)
            bm = matrix(pb, k, n, b_ld, 1) if self.b_n_major else matrix(pb, k, n, 1, b_ld)
            product = (am.astype(np.float32) @ bm.astype(np.float32)).astype(dt)
            if "_ct_" in name:
                matrix(pc, n, m, c_ld, 1)[...] = product.T
            else:
                matrix(pc, m, n, c_ld, 1)[...] = product

    def _partials(self, am, bm, splits):
        """Each split's partial product over its k-blocks (the kernel's partition)."""
        k_blocks = -(-self.k // 64)
        assert 1 <= splits <= k_blocks
        q, r = divmod(k_blocks, splits)
        partials = []
        for s in range(splits):
            first, nblk = s * q + min(s, r), q + (s < r)
            assert nblk >= 1
            lo, hi = 64 * first, min(self.k, 64 * (first + nblk))
            partials.append(am[:, lo:hi] @ bm[lo:hi])
        assert 64 * (splits * q + min(splits, r)) >= self.k  # every k-block covered
        return partials

    def _split_k_cluster(self, a_ptr, b_ptr, c_ptr):
        """The cluster split-K kernel: the splits of a tile are one cluster (1 x splits x 1)
        and add their partials in split order; C is stored in boxes of 8 rows."""
        tiles, splits, count = self.grid
        assert self.cluster == (1, splits, 1) and splits <= 8
        assert tiles == self.tiles_m * self.tiles_n and count == self.count
        (_, a_dims, a_str, a_box, *_), (_, b_dims, b_str, b_box, *_), \
            (_, c_dims, c_str, c_box, *_) = self.templates
        assert c_box == (TMA_BOX_ELEMS, CLUSTER_REDUCE_GROUP_ROWS, 1)
        dt = BF16 if self.templates[0][0] == 9 else np.dtype(np.float16)
        a, b, c = (_view(p, d, s, dt) for p, d, s in
                   ((a_ptr, a_dims, a_str), (b_ptr, b_dims, b_str), (c_ptr, c_dims, c_str)))
        a_k_major, b_n_major = self.a_k_major, self.b_n_major
        for z in range(self.z0, self.z0 + self.count):
            za, zb = (z // self.a_div) % self.a_mod, (z // self.b_div) % self.b_mod
            am = (a[za] if a_k_major else a[za].T).astype(np.float32)
            bm = (b[zb] if b_n_major else b[zb].T).astype(np.float32)
            partials = self._partials(am, bm, splits)
            total = partials[0]
            for p in partials[1:]:
                total = total + p
            c[z] = self._final(total, z, dt)

    def _split_k_parallel(self, stream, a_ptr, b_ptr, c_ptr, w_map_ptr, w_ptr, sem_ptr):
        """The parallel split-K kernel: split s of a tile stores its partial into workspace
        slot (batch slot * splits + s), then the splits add all of them in split order; C is
        stored in boxes of 8 rows; the counters are zero before and after."""
        tiles, splits, count = self.grid
        SimulatedLaunch.split_launches.append((self.grid, stream, w_ptr, sem_ptr))
        assert tiles == self.tiles_m * self.tiles_n and count == self.count
        assert tiles * splits * count <= device.H100_SXM.sm_count or splits == 1
        (_, c_dims, c_str, *_), (w_type, w_dims, w_str, w_box, *_) = self.templates[2:]
        dt = self._dtype()
        (a, _, a_box), (b, _, _) = self._operand(a_ptr, 0, dt), self._operand(b_ptr, 1, dt)
        c = _view(c_ptr, c_dims, c_str, dt)
        n, m = c_dims[0], c_dims[1]
        consumers = self.block_x // 128 - 1
        block_m = 64 * consumers
        assert self.tiles_m == -(-m // block_m)
        if self.a_k_major and a_box:   # K-major A boxes of 64 rows, or all the rows it loads
            assert a_box[1] <= TMA_BOX_ELEMS and a_box[1] % 8 == 0 and \
                (a_box[1] == TMA_BOX_ELEMS or m <= a_box[1])
        assert w_type == 7 and w_box == (32, 64, 1) and w_dims[2] == count * splits
        assert w_dims[1] == self.tiles_m * block_m and w_map_ptr == w_ptr
        ws = _view(w_ptr, w_dims, w_str, np.dtype(np.float32))
        sems = _view(sem_ptr, (tiles * consumers, count, 1),
                     (tiles * consumers * 4, tiles * consumers * 4 * count), np.dtype(np.uint32))
        assert not sems.any(), "counters must be zero when a kernel starts"
        for zl in range(self.count):
            z = self.z0 + zl
            za, zb = (z // self.a_div) % self.a_mod, (z // self.b_div) % self.b_mod
            am = (a[za] if self.a_k_major else a[za].T).astype(np.float32)
            bm = (b[zb] if self.b_n_major else b[zb].T).astype(np.float32)
            for s, partial in enumerate(self._partials(am, bm, splits)):
                ws[zl * splits + s, :m, :n] = partial
            total = ws[zl * splits, :m, :n].copy()
            for s in range(1, splits):
                total = total + ws[zl * splits + s, :m, :n]
            c[z] = self._final(total, z, dt)

    def _split_k(self, stream, a_ptr, b_ptr, c_ptr, w_map_ptr, w_ptr, sem_ptr):
        """The split-K kernel: split s of a tile sums its k-blocks (the kernel's partition),
        the partials meet in the workspace in split order, the last adds it to its own; the
        semaphores must be zero before and are zero after."""
        tiles, splits, count = self.grid
        SimulatedLaunch.split_launches.append((self.grid, stream, w_ptr, sem_ptr))
        assert tiles == self.tiles_m * self.tiles_n and count == self.count
        (_, c_dims, c_str, *_), (w_type, w_dims, w_str, w_box, *_) = self.templates[2:]
        dt = self._dtype()
        (a, _, _), (b, _, _) = self._operand(a_ptr, 0, dt), self._operand(b_ptr, 1, dt)
        c = _view(c_ptr, c_dims, c_str, dt)
        a_k_major, b_n_major = self.a_k_major, self.b_n_major
        n, m = c_dims[0], c_dims[1]
        assert (n, m) == (c.shape[2], c.shape[1])
        k_blocks = -(-self.k // 64)
        assert 1 <= splits <= k_blocks and tiles * splits * count <= device.H100_SXM.sm_count
        sems = _view(sem_ptr, (tiles * 2, count, 1), (tiles * 2 * 4, tiles * 2 * 4 * count),
                     np.dtype(np.uint32))
        assert not sems.any(), "semaphores must be zero when a kernel starts"
        if splits > 1:
            assert w_type == 7 and w_box == (32, 64, 1) and w_dims[2] == count
            assert w_dims[0] >= self.tiles_n * _block_n(self.function)
            assert w_dims[1] >= self.tiles_m * 128
            assert w_map_ptr == w_ptr
            ws = _view(w_ptr, w_dims, w_str, np.dtype(np.float32))
        for zl in range(self.count):
            z = self.z0 + zl
            za, zb = (z // self.a_div) % self.a_mod, (z // self.b_div) % self.b_mod
            am = (a[za] if a_k_major else a[za].T).astype(np.float32)
            bm = (b[zb] if b_n_major else b[zb].T).astype(np.float32)
            partials = self._partials(am, bm, splits)
            if splits == 1:
                c[z] = self._final(partials[0], z, dt)
                continue
            ws[zl, :m, :n] = partials[0]
            for p in partials[1:-1]:
                ws[zl, :m, :n] += p
            c[z] = self._final(ws[zl, :m, :n] + partials[-1], z, dt)


class SimulatedDirectRepeat:
    """_tensormap.DirectRepeat over SimulatedLaunch: its checks (tests/test_tma.py tests the
    extension's own), in Python. `calls` records what each run returned."""

    calls = []

    def __init__(self, launches, a_bounds, b_bounds, out_bounds, epilogue_bounds=(),
                 out_may_be=-1):
        assert len(epilogue_bounds) in (0, 2) and -1 <= out_may_be < len(epilogue_bounds)
        addresses = 3 + len(epilogue_bounds)
        assert launches and all(type(x) is SimulatedLaunch and len(x.templates) >= 3
                                and len(x.templates) + x.pointers == addresses
                                for x in launches)
        self.launches = tuple(launches)
        self.bounds = a_bounds, b_bounds, out_bounds
        self.epilogue_bounds, self.out_may_be = tuple(epilogue_bounds), out_may_be

    def _declines(self, out_ptr, a_ptr, b_ptr, epilogue_ptrs=()) -> bool:
        (a_lo, a_hi), (b_lo, b_hi), out_bounds = self.bounds
        if out_bounds is None:
            return False
        out = (out_ptr + out_bounds[0], out_ptr + out_bounds[1])
        spans = [(a_ptr + a_lo, a_ptr + a_hi), (b_ptr + b_lo, b_ptr + b_hi)]
        for i, (ptr, bounds) in enumerate(zip(epilogue_ptrs, self.epilogue_bounds)):
            if bounds is not None and not (i == self.out_may_be and ptr == out_ptr):
                spans.append((ptr + bounds[0], ptr + bounds[1]))
        return any(layout.overlaps(out, span) for span in spans)

    def _run(self, stream, addresses, declined) -> bool:
        SimulatedDirectRepeat.calls.append(not declined)
        if declined:
            return False
        for x in self.launches:
            x.launch(stream, *addresses)
        return True

    def run(self, stream, a_ptr, b_ptr, c_ptr):
        assert not self.epilogue_bounds, "fused launches repeat through run_fused"
        return self._run(stream, (a_ptr, b_ptr, c_ptr), self._declines(c_ptr, a_ptr, b_ptr))

    def run_fused(self, stream, a_ptr, b_ptr, c_ptr, bias_ptr, c_in_ptr):
        assert self.epilogue_bounds, "plain launches repeat through run"
        ptrs = tuple(0 if bounds is None else ptr
                     for ptr, bounds in zip((bias_ptr, c_in_ptr), self.epilogue_bounds))
        return self._run(stream, (a_ptr, b_ptr, c_ptr, *ptrs),
                         self._declines(c_ptr, a_ptr, b_ptr, ptrs))


def _forget_cupy_objects():
    """Drop what hopmm remembers that holds objects of one cupy module (recipes, workspaces,
    plans, the gating kernel), so that neither the real cupy's nor the fake's reach the other's
    tests in one process (the GPU tier runs both)."""
    fastpath.clear()
    workspace.clear()
    shared_a._plans.clear()
    shared_a._dual_launches.clear()
    shared_a._gated_product.cache_clear()


@pytest.fixture
def simulated_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setattr(fastpath, "_cupy", None)   # bound again, to the fake, by the first call
    monkeypatch.setattr(device, "query", lambda device_id: device.H100_SXM)
    monkeypatch.setattr(launch, "query", lambda device_id: device.H100_SXM)
    monkeypatch.setattr(hopmm._tensormap, "KernelLaunch", SimulatedLaunch)
    monkeypatch.setattr(hopmm._tensormap, "DirectRepeat", SimulatedDirectRepeat)
    monkeypatch.setattr(hopmm._tensormap, "zero_rows", _zero_rows)
    # Stand in for the loaded kernel without touching launch._loaded's cache: on a machine
    # with a GPU, a fake handle left there would be launched by the GPU tests that follow.
    monkeypatch.setattr(launch, "_loaded", _fake_loaded)
    _forget_cupy_objects()
    SimulatedLaunch.launches = 0
    SimulatedLaunch.copies = 0
    SimulatedLaunch.split_launches = []
    SimulatedDirectRepeat.calls = []
    yield
    _forget_cupy_objects()
    hopmm.use_schedule(None)


def rand(shape, dtype=BF16):
    return fake(np.random.standard_normal(shape).astype(np.float32).astype(dtype))


def expect(a, b, got):
    ref = np.matmul(np.asarray(a, np.float32), np.asarray(b, np.float32))
    got = np.asarray(got, np.float32)
    assert got.shape == ref.shape and not np.isnan(got).any()
    assert np.linalg.norm(got - ref) <= 1e-2 * max(np.linalg.norm(ref), 1e-30)


CASES = {
    "row_major": lambda: (rand((200, 96)), rand((96, 136))),
    "a_transposed": lambda: (rand((96, 200)).T, rand((96, 136))),
    "b_transposed": lambda: (rand((200, 96)), rand((136, 96)).T),
    "both_transposed": lambda: (rand((96, 200)).T, rand((136, 96)).T),
    "odd_sizes_copied": lambda: (rand((97, 23)), rand((23, 75))),   # too many rows for gemv
    "misaligned_base": lambda: (rand((96, 130))[:, 1:129], rand((128, 96))),
    "negative_strides": lambda: (rand((64, 128))[::-1], rand((128, 64))[:, ::-1]),
    "batched": lambda: (rand((3, 40, 64)), rand((3, 64, 24))),
    "broadcast_a": lambda: (rand((40, 64)), rand((3, 64, 24))),
    "outer_inner_broadcast": lambda: (rand((2, 1, 40, 64)), rand((1, 3, 64, 24))),
    "not_one_run": lambda: (rand((2, 1, 3, 8, 16)), rand((1, 4, 1, 16, 8))),
    "vector_a": lambda: (rand((64,)), rand((64, 40))),
    "vector_b": lambda: (rand((2, 40, 64)), rand((64,))),
    "fp16": lambda: (rand((72, 64), np.float16), rand((64, 48), np.float16)),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_simulated_matmul(simulated_gpu, case):
    a, b = CASES[case]()
    expect(a, b, hopmm.matmul(a, b))
    assert SimulatedLaunch.launches >= 1


def test_out_views_and_aliasing(simulated_gpu):
    a, b = rand((64, 64)), rand((64, 64))
    big = fake(np.full((64, 128), np.nan, dtype=BF16))
    out = big[:, ::2]
    hopmm.matmul(a, b, out=out)
    expect(a, b, out)
    assert np.isnan(np.asarray(big[:, 1::2], np.float32)).all()
    a0 = fake(a.copy())
    hopmm.matmul(a, b, out=a)            # out is an input: computed aside, then copied
    expect(a0, b, a)


def test_repeat_calls_reuse_launches_on_new_arrays(simulated_gpu, monkeypatch):
    planned = []
    real_plan = api.plan
    monkeypatch.setattr(api, "plan", lambda *args: planned.append(1) or real_plan(*args))
    for _ in range(3):
        a, b = rand((80, 64)), rand((64, 48))
        expect(a, b, hopmm.matmul(a, b))
    assert len(planned) == 1 and SimulatedLaunch.launches == 3


@pytest.mark.parametrize("case", ["odd_sizes_copied", "misaligned_base", "negative_strides",
                                  "vector_b", "fp16"])
def test_repeat_calls_with_copies_read_the_new_operands(simulated_gpu, monkeypatch, case):
    """Repeats of calls whose operands or result are copied take the recipe, which copies
    straight from the new arrays' pointers (stored offsets and pitches) where the copied view
    is one matrix with contiguous rows, and through the view otherwise (reversed columns)."""
    planned, views = [], []
    real_plan, real_view = api.plan, api._batch_view
    monkeypatch.setattr(api, "plan", lambda *args: planned.append(1) or real_plan(*args))
    monkeypatch.setattr(api, "_batch_view", lambda *args, **kw: views.append(1) or
                        real_view(*args, **kw))
    for _ in range(3):
        a, b = CASES[case]()
        expect(a, b, hopmm.matmul(a, b))
        shape = np.matmul(np.zeros(a.shape, np.float32), np.zeros(b.shape, np.float32)).shape
        out = fake(np.full(shape, np.nan, dtype=a.dtype))
        assert hopmm.matmul(a, b, out=out) is out
        expect(a, b, out)
    assert len(planned) == 2   # one call without out=, one with
    assert bool(views) == (case == "negative_strides")   # B's columns reversed: its view
    # One matrix of rows per copy: the repeats copy through the row-copy kernel, into one
    # scratch buffer. Reversed columns (a view) and a batch of results (vector_b) are copied
    # as the first call copied them; fp16's operands are read in place.
    kernel_copies = case in ("odd_sizes_copied", "misaligned_base")
    copied = [r for r in fastpath._recipes.values() if type(r) is fastpath.Recipe]
    assert all((r.scratch is not None) == kernel_copies for r in copied)
    assert (SimulatedLaunch.copies > 0) == kernel_copies


@pytest.mark.parametrize("m, n, k, copied", [
    (16256, 8, 9408, True),     # 16-byte rows: shorter than a sector, a product long enough
    (16256, 16, 9408, False),   # 32-byte rows: whole sectors
    (3000, 8, 3000, False),     # too short a product for the copy's launch
])
def test_narrow_b_rows_shorter_than_a_sector_read_from_a_line_copy(simulated_gpu, m, n, k, copied):
    """A narrow product's row-major B whose rows are shorter than a 32-byte sector is read from a
    copy of whole 128-byte lines where NARROW_B_ROW_COST of the product's estimate exceeds the
    copy's cost (heuristics.narrow_b_copy_reason), which explain gives; the first call and its
    repeats compute the product on new operands either way."""
    for _ in range(2):
        a, b = rand((m, k)), rand((k, n))
        expect(a, b, hopmm.matmul(a, b))
    text = hopmm.explain(a, b)
    assert ("aligned copies of b" in text and "shorter than a 32-byte sector" in text) == copied, text
    assert "schedule: gemv" not in text, text
    assert (SimulatedLaunch.copies > 0) == copied


@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_routed_16_bit_repeats_call_gemm_ex_directly(simulated_gpu, monkeypatch, dtype):
    """A routed call of two C-contiguous 16-bit matrices repeats as cuBLAS's gemmEx itself
    (fastpath.GemmRoute: C^T = B^T A^T in cuBLAS's column-major terms, fp32 compute, the
    default algorithm), into a new result; with out, a view or a vector it stays
    cupy.matmul."""
    # Route every call that runs on the kernels (as where its copies cost more than
    # cuBLAS reading the rows in place).
    monkeypatch.setattr(api, "_copy_route_reason", lambda *args: "routed for the test")
    planned = _count_plans(monkeypatch)
    _FakeCublas.calls = []
    m, n, k = 37, 130, 71
    for _ in range(3):
        a, b = rand((m, k), dtype), rand((k, n), dtype)
        got = hopmm.matmul(a, b)
        assert got.shape == (m, n) and got.dtype == dtype
        expect(a, b, got)
    assert len(planned) == 1 and SimulatedLaunch.launches == 0
    (route,) = fastpath._recipes.values()
    assert type(route) is fastpath.GemmRoute
    assert _FakeCublas.calls == [(n, m, k, fastpath.CUBLAS_COMPUTE_32F,
                                  fastpath.CUBLAS_GEMM_DEFAULT)] * 2
    for a, b, out in [(rand((k, m), dtype).T, rand((k, n), dtype), None),
                      (rand((m, k), dtype), rand((k, n), dtype),
                       fake(np.empty((m, n), dtype))),
                      (rand((k,), dtype), rand((k, n), dtype), None)]:
        assert fastpath.route_recipe(a, b, out) is fastpath.ROUTE


def test_repeats_of_calls_routed_to_cupy_skip_planning(simulated_gpu, monkeypatch):
    """A call api.plan sends to cupy.matmul (here float32) is remembered as that route: its
    repeats call cupy.matmul without planning; under HOPMM_STRICT a repeat takes the full
    path, which raises."""
    planned = _count_plans(monkeypatch)
    for _ in range(3):
        a, b = rand((40, 24), np.float32), rand((24, 8), np.float32)
        np.testing.assert_allclose(hopmm.matmul(a, b), np.matmul(a, b), rtol=1e-6)
    assert len(planned) == 1 and SimulatedLaunch.launches == 0
    assert list(fastpath._recipes.values()) == [fastpath.ROUTE]
    monkeypatch.setenv(api.STRICT_ENV, "1")
    with pytest.raises(api.FallbackError):
        hopmm.matmul(a, b)


def test_repeat_calls_with_out_take_the_fast_path_unless_out_aliases(simulated_gpu,
                                                                     monkeypatch):
    planned = []
    real_plan = api.plan
    monkeypatch.setattr(api, "plan", lambda *args: planned.append(1) or real_plan(*args))
    for _ in range(3):
        a, b = rand((64, 64)), rand((64, 64))
        out = fake(np.full((64, 64), np.nan, dtype=BF16))
        assert hopmm.matmul(a, b, out=out) is out
        expect(a, b, out)
    assert len(planned) == 1
    # Same shapes, strides and dtypes, so the same recipe; but out is A itself now: the
    # recipe's out bounds must catch it, and the full path computes aside, then copies.
    a, b = rand((64, 64)), rand((64, 64))
    a0 = fake(a.copy())
    hopmm.matmul(a, b, out=a)
    expect(a0, b, a)
    assert len(planned) == 2


def _count_plans(monkeypatch) -> list:
    planned = []
    real_plan = api.plan
    monkeypatch.setattr(api, "plan", lambda *args: planned.append(1) or real_plan(*args))
    return planned


def test_repeat_calls_without_copies_run_one_direct_repeat(simulated_gpu, monkeypatch):
    """Operands read in place and a result stored straight into: each repeat, with out= or
    without, is one DirectRepeat run that launches every chunk (two here) on its arrays."""
    monkeypatch.setattr(layout, "MAX_GRID_Z", 2)   # 3 batches: two launches per call
    planned = _count_plans(monkeypatch)
    for _ in range(3):   # 130 rows: the persistent kernel (64 or fewer take split-K's tiles)
        a, b = rand((3, 130, 64)), rand((64, 128))
        expect(a, b, hopmm.matmul(a, b))
        out = fake(np.full((3, 130, 128), np.nan, dtype=BF16))
        assert hopmm.matmul(a, b, out=out) is out
        expect(a, b, out)
    assert len(planned) == 2
    assert all(type(r) is fastpath.DirectRecipe for r in fastpath._recipes.values())
    assert SimulatedDirectRepeat.calls == [True] * 4
    assert SimulatedLaunch.launches == 2 * 6


@pytest.mark.parametrize("overlap", ["out_is_a", "out_in_b"])
def test_direct_repeat_declines_an_overlapping_out(simulated_gpu, monkeypatch, overlap):
    """A recipe remembered with a separate out; then out lies over A (or over half of B):
    the DirectRepeat launches nothing, the full path computes aside and copies."""
    planned = _count_plans(monkeypatch)
    a, b = rand((130, 64)), rand((64, 64))   # 130 rows: the persistent kernel's launch
    hopmm.matmul(a, b, out=fake(np.empty((130, 64), BF16)))
    buf = rand((200, 64))
    a, b, out = ((buf[:130], rand((64, 64)), buf[:130]) if overlap == "out_is_a" else
                 (rand((130, 64)), buf[:64], buf[32:162]))
    a0, b0 = fake(a.copy()), fake(b.copy())
    before = SimulatedLaunch.launches
    assert hopmm.matmul(a, b, out=out) is out
    expect(a0, b0, out)
    assert SimulatedDirectRepeat.calls == [False] and len(planned) == 2
    assert SimulatedLaunch.launches == before + 1   # the full path's launch only


REPEATS_WITHOUT_DIRECT = {
    "copied_operand": (lambda: CASES["odd_sizes_copied"](), None),
    "strided_out": (lambda: (rand((64, 64)), rand((64, 64))),
                    lambda: fake(np.full((64, 128), np.nan, dtype=BF16))[:, ::2]),
    "split_k": (lambda: (rand((256, 1024)), rand((1024, 256))), None),
}


@pytest.mark.parametrize("case", REPEATS_WITHOUT_DIRECT, ids=list(REPEATS_WITHOUT_DIRECT))
def test_repeats_with_copies_or_split_k_take_the_general_recipe(simulated_gpu, monkeypatch,
                                                                case):
    """An aligned copy of an operand, an aligned result buffer (a strided out) or split-K's
    per-stream workspace: the recipe does that work in Python, and no DirectRepeat exists."""
    operands, make_out = REPEATS_WITHOUT_DIRECT[case]
    if case == "split_k":
        hopmm.use_schedule("split_k")
    planned = _count_plans(monkeypatch)
    for _ in range(3):
        a, b = operands()
        out = make_out() if make_out else None
        result = hopmm.matmul(a, b, out=out)
        expect(a, b, result)
        assert out is None or result is out
    assert len(planned) == 1
    (recipe,) = fastpath._recipes.values()
    assert type(recipe) is fastpath.Recipe and SimulatedDirectRepeat.calls == []


@pytest.mark.parametrize("env, programmatic", [(None, True), ("1", True), ("0", False)],
                         ids=["default", "on", "off"])
def test_launches_are_programmatic_unless_turned_off(simulated_gpu, monkeypatch, env,
                                                     programmatic):
    """Every kernel waits for the previous kernel of its stream before touching global memory
    (griddepcontrol.wait, checked in SASS by test_kernels_cpu), so launches may overlap it."""
    if env is None:
        monkeypatch.delenv(launch.PDL_ENV, raising=False)
    else:
        monkeypatch.setenv(launch.PDL_ENV, env)
    for schedule in (None, "split_k"):   # split-K's launch goes through WorkspaceLaunch
        hopmm.use_schedule(schedule)
        a, b = rand((256, 1024)), rand((1024, 256))
        expect(a, b, hopmm.matmul(a, b))
        assert SimulatedLaunch.last.programmatic is programmatic
    assert len(SimulatedLaunch.split_launches) == 1


def test_batches_beyond_one_grid(simulated_gpu, monkeypatch):
    monkeypatch.setattr(layout, "MAX_GRID_Z", 4)   # split 10 batches into launches of 4
    a, b = rand((10, 24, 32)), rand((32, 16))
    expect(a, b, hopmm.matmul(a, b))
    assert SimulatedLaunch.launches == 3


def test_leaves_the_loaded_kernel_cache_alone(simulated_gpu):
    """The GPU tests that run after these in one process must never see a stand-in kernel."""
    before = _REAL_LOADED.cache_info().currsize
    a, b = rand((64, 64)), rand((64, 64))
    expect(a, b, hopmm.matmul(a, b))
    assert _REAL_LOADED.cache_info().currsize == before


@pytest.mark.parametrize("case", ["row_major", "both_transposed", "batched", "fp16"])
def test_pingpong_through_the_glue(simulated_gpu, case):
    """Forced ping-pong: a persistent grid of 128 x 128 tiles, 384 threads, the plan's shared
    memory, and explain says so."""
    from hopmm.schedules import PingPongSchedule

    hopmm.use_schedule("pingpong")
    try:
        a, b = CASES[case]()
        text = hopmm.explain(a, b)
        expect(a, b, hopmm.matmul(a, b))
    finally:
        hopmm.use_schedule(None)
    assert "schedule: pingpong" in text and "take alternate 128x128 tiles" in text
    run = SimulatedLaunch.last
    batch = a.shape[0] if a.ndim == 3 else 1
    tiles = -(-a.shape[-2] // BLOCK_M) * -(-b.shape[-1] // 128) * batch
    assert run.grid == (min(device.H100_SXM.sm_count, tiles), 1, 1)
    assert run.block_x == 384 and run.tiles_n == -(-b.shape[-1] // 128)
    cfg = PingPongSchedule.deepest(str(a.dtype), 128, case == "both_transposed",
                                   case != "both_transposed", device.H100_SXM.smem_per_block_optin)
    assert run.shared_mem_bytes == PingPongSchedule.smem_bytes(cfg)


SPLIT_CASES = {
    # (m, k, n, batch): splits dividing / not dividing the k-blocks, K not a multiple of 64,
    # K shorter than 2 k-blocks, batches, several tiles.
    "even": (256, 1024, 256, 1),
    "uneven": (200, 64 * 13, 136, 1),
    "k_not_64": (130, 1000, 70, 1),
    "k_tiny": (64, 65, 64, 1),
    "k_one_block": (64, 40, 64, 1),
    "batched": (100, 700, 90, 3),
    "many_tiles": (1000, 300, 1023, 1),
}


@pytest.mark.parametrize("case", SPLIT_CASES, ids=list(SPLIT_CASES))
def test_simulated_split_k(simulated_gpu, case):
    m, k, n, batch = SPLIT_CASES[case]
    hopmm.use_schedule("split_k")
    a, b = rand((batch, m, k)), rand((k, n))
    expect(a, b, hopmm.matmul(a, b))
    (grid, _, _, sem_ptr), = SimulatedLaunch.split_launches
    tiles = -(-m // 128) * -(-n // 128)
    assert grid[0] == tiles and grid[2] == batch and grid[1] * tiles * batch <= 132
    assert grid[1] == heuristics.choose(api._kernel_call(a, b, layout.matmul_shapes(
        a.shape, b.shape)).problem, device.H100_SXM, "split_k").splits
    if -(-k // 64) >= 2 and tiles * batch * 2 <= 132:
        assert grid[1] >= 2, "forced split-K splits whenever the bound allows"


@pytest.mark.parametrize("case", SPLIT_CASES, ids=list(SPLIT_CASES))
def test_simulated_split_k_cluster(simulated_gpu, monkeypatch, case):
    """Forced split_k_cluster: a grid of (tiles, splits, batch) launched in clusters of
    1 x splits x 1, C stored in boxes of 8 rows (checked by the stand-in kernel), no workspace;
    explain names the cluster; repeats without copies go through DirectRepeat."""
    m, k, n, batch = SPLIT_CASES[case]
    hopmm.use_schedule("split_k_cluster")
    a, b = rand((batch, m, k)), rand((k, n))
    text = hopmm.explain(a, b)
    planned = _count_plans(monkeypatch)
    for _ in range(2):
        expect(a, b, hopmm.matmul(a, b))
    run = SimulatedLaunch.last
    tiles = -(-m // 128) * -(-n // 128)
    splits = heuristics.choose(api._kernel_call(a, b, layout.matmul_shapes(
        a.shape, b.shape)).problem, device.H100_SXM, "split_k_cluster").splits
    assert run.grid == (tiles, splits, batch) and run.cluster == (1, splits, 1)
    assert 1 <= splits <= min(8, -(-k // 64)) and (splits >= 2) == (k > 64)
    assert SimulatedLaunch.split_launches == [] and len(planned) == 1
    (recipe,) = fastpath._recipes.values()
    copies = type(recipe) is fastpath.Recipe and (recipe.a_copy or recipe.b_copy
                                                  or recipe.c_buffer)
    assert type(recipe) is fastpath.DirectRecipe or copies   # no workspace to look up
    assert "schedule: split_k_cluster" in text
    assert (f"cluster: (1, {splits}, 1) at launch" in text) == (splits > 1)


def test_simulated_split_k_fast_path_and_streams(simulated_gpu, monkeypatch):
    """Repeat calls reuse the remembered split-K launch; each stream gets its own workspace
    and semaphores, grown (never shrunk) as needed, semaphores zero at allocation."""
    hopmm.use_schedule("split_k")
    import cupy

    streams = iter([7, 7, 9, 9])
    monkeypatch.setattr(cupy.cuda, "get_current_stream",
                        lambda: types.SimpleNamespace(ptr=next(streams)))
    for shape in [(256, 2048, 256), (256, 2048, 256), (256, 2048, 256), (512, 4096, 384)]:
        m, k, n = shape
        a, b = rand((m, k)), rand((k, n))
        expect(a, b, hopmm.matmul(a, b))
    used = SimulatedLaunch.split_launches
    assert [s for _, s, _, _ in used] == [7, 7, 9, 9]
    assert used[0][2:] == used[1][2:]           # same stream: the same workspace
    assert used[1][2] != used[2][2] and used[1][3] != used[2][3]   # other stream: its own
    ws7, ws9 = workspace._workspaces[(0, 7, None)], workspace._workspaces[(0, 9, None)]
    # One fp32 copy of the (tile-padded) output per stream, whatever the split count.
    assert ws7.data.nbytes >= 256 * 256 * 4 and ws7.semaphores.size >= 4 * 2
    assert ws9.data.nbytes >= 512 * 384 * 4 and ws9.semaphores.size >= 12 * 2
    assert not ws9.semaphores.any()


def test_per_thread_default_stream_is_one_stream_per_thread(simulated_gpu):
    """cudaStreamPerThread has one handle but is a different stream in each thread: two
    threads must not share semaphores on it; an ordinary stream handle is shared."""
    import threading

    got, cases = {}, [("t1", workspace.PER_THREAD_DEFAULT_STREAM),
                      ("t2", workspace.PER_THREAD_DEFAULT_STREAM), ("u1", 7), ("u2", 7)]
    alive = threading.Barrier(len(cases))   # all threads live at once: no reused thread ids

    def take(name, stream):
        got[name] = workspace.get(0, stream, 1024, 8)
        alive.wait()

    threads = [threading.Thread(target=take, args=case) for case in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got["t1"].semaphores is not got["t2"].semaphores
    assert got["u1"].semaphores is got["u2"].semaphores


def test_workspace_growth():
    assert workspace._grown(0, 10, 1 << 20) == 1 << 20
    assert workspace._grown(1 << 20, (1 << 20) + 1, 1 << 20) == 1 << 21
    assert workspace._grown(1 << 22, 5, 1 << 20) == 1 << 22


@pytest.mark.parametrize("case", SPLIT_CASES, ids=list(SPLIT_CASES))
def test_simulated_split_k_parallel(simulated_gpu, case):
    """Forced split_k_parallel: a grid of (tiles, splits, batch) over the tiles its model takes
    (64 rows for problems of at most 64; more rows take them only where all run at once), a
    workspace slot per split and batch slot (checked by the stand-in kernel), C stored in
    boxes of 8 rows; explain names it."""
    m, k, n, batch = SPLIT_CASES[case]
    hopmm.use_schedule("split_k_parallel")
    a, b = rand((batch, m, k)), rand((k, n))
    text = hopmm.explain(a, b)
    expect(a, b, hopmm.matmul(a, b))
    (grid, _, _, _), = SimulatedLaunch.split_launches
    choice = heuristics.choose(api._kernel_call(a, b, layout.matmul_shapes(
        a.shape, b.shape)).problem, device.H100_SXM, "split_k_parallel")
    tiles = -(-m // choice.config.block_m) * -(-n // choice.config.block_n)
    assert grid == (tiles, choice.splits, batch)
    assert choice.config.block_m == 64 or m > 64
    assert choice.config.block_m == 128 or tiles * batch <= device.H100_SXM.sm_count
    assert f"{choice.config.block_m}x{choice.config.block_n}" in text
    assert "schedule: split_k_parallel" in text and "workspace slot" in text


@pytest.mark.parametrize("m,k,n,batch,transposed", [
    (1, 4096, 4096, 1, False), (2, 4096, 4096, 2, False), (4, 4096, 6000, 1, True),
    (3, 4096, 8000, 3, False), (3, 4096, 4096, 1, True)])
def test_simulated_few_rows_take_gemv(simulated_gpu, m, k, n, batch, transposed):
    """The default path for problems of at most GEMV_MAX_M rows of a K-major B, and of one row
    of an N-major B: gemv, K split where N alone gives too few CTAs; explain names it. More
    rows of an N-major B take the tile kernels (heuristics.GEMV_N_MAJOR_MAX_ROWS)."""
    a = rand((batch, k, m)).transpose(0, 2, 1) if transposed else rand((batch, m, k))
    for b_major, b in (("n", rand((k, n))), ("k", rand((n, k)).T)):
        expect(a, b, hopmm.matmul(a, b))
        text = hopmm.explain(a, b)
        if b_major == "n" and m > heuristics.GEMV_N_MAJOR_MAX_ROWS:
            assert "schedule: gemv" not in text and SimulatedLaunch.last.templates
            continue
        assert not SimulatedLaunch.last.templates and SimulatedLaunch.last.pointers == 4
        assert "schedule: gemv" in text and "predicted" in text


GEMV_CASES = {
    "odd_n_and_k": lambda: (rand((3, 13)), rand((13, 7))),
    "k_below_a_vector": lambda: (rand((2, 5)), rand((5, 24))),
    "k_major_b_odd": lambda: (rand((7, 1001)), rand((33, 1001)).T),
    "m_major_a": lambda: (rand((300, 15)).T, rand((300, 40))),
    "rows_past_16": lambda: (rand((40, 96)), rand((24, 96)).T),
    "vector_times_matrix": lambda: (rand((264,)), rand((264, 48))),
    "batched_broadcast_b": lambda: (rand((4, 2, 64)), rand((64, 72))),
    "batched_both": lambda: (rand((3, 8, 64)), rand((3, 40, 64)).transpose(0, 2, 1)),
    "sliced_b": lambda: (rand((4, 96)), rand((96, 200))[:, 8:136]),
    "fp16": lambda: (rand((8, 128), np.float16), rand((128, 64), np.float16)),
    "few_columns": lambda: (rand((300, 64)), rand((64, 5))),
    "few_columns_transposed": lambda: (rand((64, 300)).T, rand((5, 64)).T),
    "matrix_times_vector": lambda: (rand((2, 100, 72)), rand((72,))),
}


@pytest.mark.parametrize("case", GEMV_CASES, ids=list(GEMV_CASES))
def test_simulated_forced_gemv(simulated_gpu, case):
    """use_schedule("gemv"): any shape, through aligned copies where rows are not whole
    16-byte vectors; repeats (the fast path) read the new operands."""
    hopmm.use_schedule("gemv")
    for _ in range(2):
        a, b = GEMV_CASES[case]()
        expect(a, b, hopmm.matmul(a, b))
        assert not SimulatedLaunch.last.templates
    assert "schedule: gemv" in hopmm.explain(a, b)


@pytest.mark.parametrize("schedule", ["gemv", "persistent"])
def test_gemv_reads_zeroed_row_tails_of_its_copies(simulated_gpu, monkeypatch, schedule):
    """An aligned copy gemv reads has the bytes past each row up to the end of its last
    16-byte vector zeroed, so its masked loads never read uninitialised memory; the rest of the
    padding stays as it was. On the first call, where a tile schedule's copies (TMA reads no
    byte past a row) are left alone, and on repeats, whose row-copy kernel writes whole
    16-byte chunks for every schedule into the repeat's one scratch buffer."""
    made = []

    def poisoned_empty(shape, dtype=None):
        x = np.empty(shape, dtype).view(FakeArray)
        x.view(np.uint8)[...] = 0xFF
        made.append(x)
        return x

    monkeypatch.setattr(sys.modules["cupy"], "empty", poisoned_empty)
    # gemv through copies, not reading the rows where they lie (the next test)
    monkeypatch.setattr(api, "_in_place_gemv", lambda *args, **kw: None)
    hopmm.use_schedule(schedule)
    k = 100   # 200-byte rows: 8 bytes (4 elements) to the next 16-byte boundary
    for repeat in (False, True):
        made.clear()
        a, b = rand((5, k)), rand((k, 64))
        expect(a, b, hopmm.matmul(a, b))
        # A's aligned copy: 5 rows of whole 128-byte lines (the result is stored in place).
        if repeat:
            (recipe,) = fastpath._recipes.values()
            (scratch,) = [x for x in made if x.dtype == np.uint8]
            at = recipe.scratch.a_at
            bits = scratch[at:at + 5 * 128 * 2].view(np.uint16).reshape(1, 5, 128)
        else:
            (copy,) = [x for x in made if x.shape == (1, 5, 128)]
            bits = copy.view(np.uint16)
        tails = bits[..., k:k + 4]
        assert (tails == 0).all() if schedule == "gemv" or repeat else (tails == 0xFFFF).all()
        assert (bits[..., k + 4:] == 0xFFFF).all()


@pytest.mark.parametrize("case", ["odd_b_rows", "odd_a_rows_few_columns", "offset_views",
                                  "m_major_a", "batched"])
def test_simulated_gemv_reads_unaligned_rows_in_place(simulated_gpu, case):
    """Few rows (or columns) and operands whose rows do not start on 16 bytes: unforced, gemv
    reads them where they lie (no aligned copy, no row-copy launch) and stores the result of
    odd rows itself; repeats read the new operands."""
    cases = {
        "odd_b_rows": lambda: (rand((12, 1001)), rand((1001, 2601))),
        "odd_a_rows_few_columns": lambda: (rand((3001, 999)), rand((999, 13))),
        "offset_views": lambda: (rand((9, 4003))[1:, 3:], rand((4000, 1203))[:, 1:1200]),
        "m_major_a": lambda: (rand((777, 10)).T, rand((777, 3001))),
        "batched": lambda: (rand((3, 16, 8000)), rand((3, 8000, 3001))),
    }
    for _ in range(2):
        a, b = cases[case]()
        SimulatedLaunch.copies = 0
        expect(a, b, hopmm.matmul(a, b))
        text = hopmm.explain(a, b)
        assert not SimulatedLaunch.last.templates and SimulatedLaunch.copies == 0, text
    assert "schedule: gemv" in text and "read where they lie" in text
    assert "aligned copies of" not in text and "through an aligned buffer" not in text


def test_simulated_gemv_split_k_scratch(simulated_gpu):
    """A split gemv launch gets its stream's scratch, counters zero (checked by the stand-in)."""
    a, b = rand((2, 8192)), rand((1024, 8192)).T
    expect(a, b, hopmm.matmul(a, b))
    run = SimulatedLaunch.last
    assert not run.templates and run.grid[1] > 1
    assert len(workspace._gemv_scratch) == 1


@pytest.mark.parametrize("a_transposed", [False, True])
@pytest.mark.parametrize("m,k,n,batch", [(4096, 4096, 1, 1), (4096, 2048, 8, 2),
                                         (6000, 4096, 3, 1)])
def test_simulated_few_columns_take_gemv_transposed(simulated_gpu, m, k, n, batch,
                                                    a_transposed):
    """Problems of few columns and many rows: gemv on C^T = B^T A^T, streaming A (the
    heuristic's pick on its CUDA-core loops; its tensor-core loops, from 8 columns, forced:
    with a row-major B the tile kernels take those)."""
    if n >= GEMV_MMA_ROWS[0]:
        hopmm.use_schedule("gemv")
    a = rand((batch, k, m)).transpose(0, 2, 1) if a_transposed else rand((batch, m, k))
    for b in (rand((k, n)), rand((n, k)).T):
        expect(a, b, hopmm.matmul(a, b))
        assert not SimulatedLaunch.last.templates
        assert "C^T = B^T A^T" in hopmm.explain(a, b)


@pytest.mark.parametrize("m,k,n,batch,transposed", [
    (30, 16000, 264, 1, False), (64, 3000, 640, 1, True), (17, 2048, 136, 1, False)])
def test_simulated_few_rows_take_the_parallel_split_k(simulated_gpu, m, k, n, batch,
                                                      transposed):
    """The default path for problems of a few more rows than gemv takes: split_k_parallel's
    64-row tiles, K-major A boxes of only the rows the problem has (32), M-major A in whole
    tiles."""
    a = rand((batch, k, m)).transpose(0, 2, 1) if transposed else rand((batch, m, k))
    b = rand((k, n))
    expect(a, b, hopmm.matmul(a, b))
    run = SimulatedLaunch.last
    assert run.block_x == 256                 # one consumer warpgroup: 64-row tiles
    a_box = run.templates[0][3]
    expected = 64 if transposed or m > 32 else 32
    assert a_box[1] == expected
    assert "schedule: split_k_parallel" in hopmm.explain(a, b)


@pytest.mark.parametrize("m,k,n,transposed", [(30, 1000, 264, False), (48, 4480, 5632, True)])
def test_simulated_few_rows_take_the_64x128_tile(simulated_gpu, m, k, n, transposed):
    """At most 64 rows in one wave of 64 x 128 tiles, unsplit on the persistent kernel: one
    consumer warpgroup, A in boxes of 64 rows (those past M zero-filled), no workspace."""
    a = rand((1, k, m)).transpose(0, 2, 1) if transposed else rand((1, m, k))
    b = rand((k, n))
    expect(a, b, hopmm.matmul(a, b))
    run = SimulatedLaunch.last
    assert run.block_x == 256 and len(run.templates) == 3     # no split-K workspace
    name = _kernel_name(run.function)
    assert name.startswith("hopmm_persistent_") and "_64x128x64_" in name
    text = hopmm.explain(a, b)
    assert "schedule: persistent\n" in text and "streaming B sets the pace" in text


@pytest.mark.parametrize("case", ["row_major", "both_transposed", "batched", "broadcast_b"])
def test_simulated_transposed_product(simulated_gpu, monkeypatch, case):
    """A product the heuristic computes as C^T = B^T A^T (KernelConfig.trans_c): the kernel
    gets B^T as its A and A^T as its B (views, no copies: one launch), and its transposed
    tiles land in C as they lie; a repeat on new operands takes the remembered launches,
    which swap them again."""
    m, k, n = 1920, 1280, 1600

    def operands():
        if case == "both_transposed":
            return rand((k, m)).T, rand((n, k)).T
        batch = {"batched": (2,), "broadcast_b": (3,)}.get(case, ())
        return rand(batch + (m, k)), rand((2, k, n) if case == "batched" else (k, n))

    a, b = operands()
    text = hopmm.explain(a, b)
    assert "stored transposed" in text and "_ct_" in text, text
    planned = []
    real_plan = api.plan
    monkeypatch.setattr(api, "plan", lambda *args: planned.append(1) or real_plan(*args))
    for _ in range(2):
        a, b = operands()
        expect(a, b, hopmm.matmul(a, b))
        assert "_ct_" in _kernel_name(SimulatedLaunch.last.function)
    assert SimulatedLaunch.copies == 0 and len(planned) == 1   # the repeat plans nothing


def _bench_module(filename):
    """A bench/ script as a module (bench/ is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / filename
    spec = importlib.util.spec_from_file_location(f"hopmm_{path.stem}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_matmul_ab_plans_each_rule_afresh(simulated_gpu):
    """bench/matmul_ab.py: the same call planned under the current constants and under
    --old's remembers a recipe for each, each computing the product on new operands, its plan
    line naming that rule's kernel; the constants are the current ones afterwards."""
    matmul_ab = _bench_module("matmul_ab.py")
    current = heuristics.GEMV_M_MAJOR_A_ROW_COST
    sets = [(rand((4096, 4096)), rand((4096, 16))) for _ in range(2)]
    new = matmul_ab.planned(sets, {})
    old = matmul_ab.planned(sets, {"GEMV_M_MAJOR_A_ROW_COST": 0.0})
    assert "schedule: persistent" in new[1] and "schedule: gemv" in old[1], (new[1], old[1])
    for recipe, _ in (new, old):
        for a, b in sets:
            expect(a, b, recipe.run(a, b, None))
    assert heuristics.GEMV_M_MAJOR_A_ROW_COST == current
    assert "schedule: persistent" in matmul_ab.plan_line(*sets[0])


def test_pick_ab_times_its_contestants_beside_cupy(simulated_gpu, monkeypatch):
    """bench/pick_ab.py's timed_beside_cublas (pick_ab's and matmul_ab's timing): every
    contestant and cupy.matmul run on every input set, TFLOP/s from the medians, the faster
    cuBLAS as the reference, ok only where every error is below MAX_REL_ERR."""
    pick_ab = _bench_module("pick_ab.py")
    from hopmm import timing

    ran = []

    def medians(contestants, inputs, rounds, warmup_s):
        for name, run in contestants.items():
            for args in inputs:
                run(*args)
                ran.append((name, args))
        return {name: (1e-3 if name == "cupy" else 5e-4) for name in contestants}

    monkeypatch.setattr(timing, "interleaved_medians", medians)
    # No torch beside the simulated GPU (its tensors would take the fake arrays through DLPack).
    monkeypatch.setitem(sys.modules, "torch", None)
    sets = [(rand((64, 32)), rand((32, 16))) for _ in range(2)]
    got = pick_ab.timed_beside_cublas({"new": lambda i: None}, sets, 2e9, {"new": 1e-3})
    assert {name for name, _ in ran} == {"new", "cupy"} and "torch" not in got["tflops"]
    assert {args for _, args in ran} == {(0,), (1,)}
    assert got["tflops"]["new"] == pytest.approx(4.0) and got["cublas_tflops"] == pytest.approx(2.0)
    assert got["ok"] and not pick_ab.timed_beside_cublas({}, sets, 2e9, {"new": 1.0})["ok"]
