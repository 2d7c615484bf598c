"""CPU: torch calls that repeat through remembered launches, on the simulated GPU of
test_cpu_simulated_launch with a torch stand-in whose tensors are NumPy memory. The first call
of a shape goes through DLPack views and the full path; a repeat launches straight from the
tensors' pointers (interop._direct_repeat for plain calls, _direct_fused_repeat for calls with
epilogue keywords, which passes the new bias and c), and every result is right. Calls a
direct repeat must not take (an out overlapping an operand, a changed schedule) take the full
path."""
import contextlib
import sys
import types

import numpy as np
import pytest

import hopmm
from hopmm import epilogue, fastpath, interop
from test_cpu_simulated_launch import (BF16, FakeArray, SimulatedLaunch, _Device,  # noqa: F401
                                       rand, simulated_gpu)


class FakeTensor:
    """What hopmm reads of a CUDA torch tensor, over a NumPy array's memory."""
    requires_grad = False
    is_cuda = True
    device = "cuda:0"

    def __init__(self, array):
        self.array = np.asarray(array).view(FakeArray)

    @property
    def shape(self):
        return tuple(self.array.shape)

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def T(self):
        return FakeTensor(self.array.T)

    def stride(self):
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def data_ptr(self):
        return self.array.__array_interface__["data"][0]

    def element_size(self):
        return self.array.itemsize

    def is_contiguous(self):
        return self.array.flags.c_contiguous

    def numel(self):
        return self.array.size

    def get_device(self):
        return 0

    def detach(self):
        return self


class FakeParameter(FakeTensor):
    """A model's weight or bias (torch.nn.Parameter): a Tensor of its own memory that
    requires grad."""
    requires_grad = True


class FakeSubclass(FakeTensor):
    """Some other Tensor subclass (one that may dispatch its operations elsewhere)."""


@pytest.fixture
def torch_on_simulated_gpu(simulated_gpu, monkeypatch):
    """A torch stand-in on the simulated GPU; returns the list of tensors converted to cupy
    views (the full path converts, a direct repeat does not)."""
    converted = []
    fake_torch = types.ModuleType("torch")
    fake_torch.Tensor = FakeTensor
    fake_torch.nn = types.SimpleNamespace(Parameter=FakeParameter)
    fake_torch.is_grad_enabled = lambda: True
    # torch.empty's two forms: the sizes one by one, or one tuple of them.
    fake_torch.empty = lambda *size, dtype=None, device=None: FakeTensor(np.empty(
        size[0] if len(size) == 1 and isinstance(size[0], tuple) else size, dtype))
    fake_torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 0)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    cupy = sys.modules["cupy"]
    monkeypatch.setattr(cupy.cuda, "Device", lambda *args: _Device())

    def to_cupy(x, torch, cupy):
        converted.append(x)
        return x.array

    monkeypatch.setattr(interop, "tensor_to_cupy", to_cupy)
    monkeypatch.setattr(interop, "cupy_to_tensor", lambda x, torch, cupy: FakeTensor(x))
    monkeypatch.setattr(interop, "_external_stream",
                        lambda torch, cupy, device: contextlib.nullcontext())
    monkeypatch.setattr(interop, "_direct", fastpath.Remembered(fastpath.MAX_RECIPES))
    return converted


def tensor(shape):
    return FakeTensor(rand(shape))


def _close(got, ref):
    got = np.asarray(got.array, np.float32)
    assert got.shape == ref.shape and not np.isnan(got).any()
    assert np.linalg.norm(got - ref) <= 2e-2 * max(np.linalg.norm(ref), 1e-30)


def _f32(t):
    return np.asarray(t.array, np.float32)


def test_plain_repeats_launch_straight_from_the_tensors(torch_on_simulated_gpu):
    converted = torch_on_simulated_gpu
    a, w = tensor((200, 96)), tensor((136, 96))
    for i in range(3):
        y = hopmm.matmul(a, w.T)
        assert isinstance(y, FakeTensor)
        _close(y, _f32(a) @ _f32(w).T)
        a = tensor((200, 96))   # new values, same shape: the same recipe
    assert len(converted) == 2   # the first call's a and w only


KEYWORDS = {
    "bias_gelu": lambda m, n: dict(bias=tensor((n,)), activation="gelu"),
    "bias_m_relu": lambda m, n: dict(bias=tensor((m, 1)), activation="relu"),
    "alpha_beta_c": lambda m, n: dict(c=tensor((m, n)), alpha=0.5, beta=2.0),
    "c_row_silu": lambda m, n: dict(c=tensor((n,)), beta=1.0, bias=tensor((n,)),
                                    activation="silu"),
}


def _reference(a, b, kw):
    acc = _f32(a) @ _f32(b)
    bias = kw.get("bias")
    c = kw.get("c")
    return epilogue.reference(np, acc, bias=None if bias is None else _f32(bias),
                              activation=kw.get("activation"), alpha=kw.get("alpha", 1.0),
                              beta=kw.get("beta", 0.0), c=None if c is None else _f32(c))


@pytest.mark.parametrize("case", KEYWORDS, ids=list(KEYWORDS))
def test_fused_repeats_launch_straight_from_the_tensors(torch_on_simulated_gpu, case):
    """Each repeat gets new operands, bias and c of the same shapes: the launches read the
    new ones through their pointers."""
    converted = torch_on_simulated_gpu
    m, n, k = 130, 72, 96
    for i in range(3):
        a, w = tensor((m, k)), tensor((n, k))
        kw = KEYWORDS[case](m, n)
        y = hopmm.matmul(a, w.T, **kw)
        _close(y, _reference(a, w.T, kw))
        if i == 0:
            first = len(converted)
    assert first >= 3 and len(converted) == first   # the repeats converted nothing


def test_a_residual_added_in_place_repeats_directly(torch_on_simulated_gpu):
    converted = torch_on_simulated_gpu
    a, w = tensor((256, 128)), tensor((128, 320))
    r = tensor((256, 320))
    for _ in range(3):
        expected = _f32(a) @ _f32(w) + _f32(r)
        assert hopmm.matmul(a, w, c=r, beta=1.0, out=r) is r
        _close(r, expected)
    assert len(converted) == 4   # a, w, r (as c) and r (as out), once


def test_an_out_overlapping_an_operand_takes_the_full_path(torch_on_simulated_gpu):
    converted = torch_on_simulated_gpu
    a, w, bias = tensor((64, 64)), tensor((64, 64)), tensor((64,))
    out = tensor((64, 64))
    hopmm.matmul(a, w, out=out, bias=bias, activation="relu")
    before = len(converted)
    expected = np.maximum(_f32(out) @ _f32(w) + _f32(bias), 0)
    hopmm.matmul(out, w, out=out, bias=bias, activation="relu")   # out is also A
    assert len(converted) > before
    _close(out, expected)


def test_beta_zero_leaves_c_unread_on_repeats(torch_on_simulated_gpu):
    a, w = tensor((64, 64)), tensor((64, 64))
    for _ in range(2):
        c = FakeTensor(np.full((64, 64), np.nan, BF16))
        y = hopmm.matmul(a, w, c=c, beta=0.0, alpha=2.0)
        _close(y, 2 * _f32(a) @ _f32(w))


def test_a_new_schedule_is_not_bypassed_by_remembered_launches(torch_on_simulated_gpu):
    converted = torch_on_simulated_gpu
    a, w, bias = tensor((256, 128)), tensor((128, 256)), tensor((256,))
    hopmm.matmul(a, w, bias=bias)
    hopmm.use_schedule("pingpong")
    before = len(converted)
    y = hopmm.matmul(a, w, bias=bias)
    assert len(converted) > before
    _close(y, _f32(a) @ _f32(w) + _f32(bias))
    assert "_pingpong_" in next(reversed(
        __import__("test_cpu_simulated_launch")._KERNEL_NAMES))


def test_split_k_repeats_take_the_full_path(torch_on_simulated_gpu):
    """Split-K launches look up their stream's workspace in Python: no direct repeat."""
    converted = torch_on_simulated_gpu
    a, w, bias = tensor((32, 8192)), tensor((8192, 80)), tensor((80,))   # one tile: K splits
    for _ in range(2):
        y = hopmm.matmul(a, w, bias=bias)
        _close(y, _f32(a) @ _f32(w) + _f32(bias))
    assert "split_k" in hopmm.explain(a.array, w.array, bias=bias.array)
    assert len(converted) == 6 and not interop._direct


def test_keys_hold_the_device_where_the_repeat_reads_it(torch_on_simulated_gpu):
    a, b = tensor((16, 32)), tensor((32, 8))
    k = interop._tensor_key(a, b, None)
    assert k[interop.TENSOR_KEY_DEVICE] == a.get_device() == 0
    kw = dict(bias=tensor((8,)), c=None, activation="relu", alpha=1.0, beta=0.0)
    fused = interop._fused_tensor_key(a, b, None, **kw)
    assert fused[0] == "fused" and fused[interop.FUSED_KEY_DEVICE] == 0
    assert fused[1:len(k) + 1] == k


def test_torch_a_goes_to_interop_before_the_cupy_fast_path(torch_on_simulated_gpu,
                                                           monkeypatch):
    cupy_path = fastpath.repeat_fused

    def cupy_only(a, *args):
        # The full path converts the tensors and calls matmul again with cupy views.
        assert not isinstance(a, FakeTensor), "the cupy fast path was asked about a tensor"
        return cupy_path(a, *args)

    monkeypatch.setattr(fastpath, "repeat_fused", cupy_only)
    a, w, bias = tensor((40, 24)), tensor((24, 16)), tensor((16,))
    for _ in range(2):
        y = hopmm.matmul(a, w, bias=bias, activation="relu")
        _close(y, np.maximum(_f32(a) @ _f32(w) + _f32(bias), 0))


def test_parameters_under_no_grad_repeat_directly(torch_on_simulated_gpu, monkeypatch):
    """A weight and a bias that are Parameters (requiring grad) read under no_grad: repeats
    launch straight from their pointers like plain tensors', with the right results."""
    converted = torch_on_simulated_gpu
    monkeypatch.setattr(sys.modules["torch"], "is_grad_enabled", lambda: False)
    w, bias = FakeParameter(rand((96, 136))), FakeParameter(rand((136,)))
    for _ in range(3):
        a = tensor((200, 96))
        _close(hopmm.matmul(a, w), _f32(a) @ _f32(w))
        y = hopmm.matmul(a, w, bias=bias, activation="relu")
        _close(y, np.maximum(_f32(a) @ _f32(w) + _f32(bias), 0))
    assert len(converted) == 5   # the first plain call's a and w, the first fused call's three


def test_parameters_with_grad_on_are_refused_after_a_repeat_was_remembered(
        torch_on_simulated_gpu, monkeypatch):
    """The remembered launches never bypass the grad rule: with grad mode on, a Parameter
    operand is refused on every call, as on the first."""
    grad = [False]
    monkeypatch.setattr(sys.modules["torch"], "is_grad_enabled", lambda: grad[0])
    a, w, bias = tensor((64, 96)), FakeParameter(rand((96, 128))), FakeParameter(rand((128,)))
    hopmm.matmul(a, w)
    hopmm.matmul(a, w, bias=bias)
    grad[0] = True
    for _ in range(2):
        with pytest.raises(ValueError, match="b requires grad"):
            hopmm.matmul(a, w)
        with pytest.raises(ValueError, match="bias requires grad"):
            hopmm.matmul(a, tensor((96, 128)), bias=bias)


def test_other_tensor_subclasses_are_converted_on_every_call(torch_on_simulated_gpu):
    converted = torch_on_simulated_gpu
    a, w = FakeSubclass(rand((64, 96))), tensor((96, 128))
    for _ in range(2):
        _close(hopmm.matmul(a, w), _f32(a) @ _f32(w))
    assert len(converted) == 4


# ---- swiglu and matmul_shared_a: the one kernel's launches from the tensors' pointers ----

def test_one_kernel_calls_repeat_straight_from_the_tensors(torch_on_simulated_gpu):
    """A torch swiglu or matmul_shared_a call of the one kernel (a small product:
    heuristics.dual_b_pays) repeats its launches from the tensors' pointers: nothing is
    converted after the first call, results are torch tensors and right."""
    from hopmm import shared_a

    converted = torch_on_simulated_gpu
    shared_a._torch_dual.clear()
    launches = []
    for i in range(3):
        a, g, u = tensor((16, 64)), tensor((64, 128)), tensor((64, 128))
        y = hopmm.swiglu(a, g, u)
        assert isinstance(y, FakeTensor)
        _close(y, epilogue.activate(np, _f32(a) @ _f32(g), "silu") * (_f32(a) @ _f32(u)))
        y0, y1 = hopmm.matmul_shared_a(a, [g, u], activation="relu")
        _close(y0, epilogue.activate(np, _f32(a) @ _f32(g), "relu"))
        _close(y1, epilogue.activate(np, _f32(a) @ _f32(u), "relu"))
        launches.append(SimulatedLaunch.launches)
    assert len(converted) == 6          # the first swiglu's and the first pair's operands
    assert len(shared_a._torch_dual) == 2
    assert launches == [2, 4, 6]        # one kernel per call


def test_one_kernel_torch_repeats_follow_the_forced_schedule(torch_on_simulated_gpu):
    """The key holds a forced schedule: forcing another one takes the full path (composed,
    two launches) instead of the remembered one kernel."""
    converted = torch_on_simulated_gpu
    a, g, u = tensor((16, 64)), tensor((64, 128)), tensor((64, 128))
    hopmm.swiglu(a, g, u)
    hopmm.swiglu(a, g, u)
    assert len(converted) == 3
    hopmm.use_schedule("persistent")
    SimulatedLaunch.launches = 0
    y = hopmm.swiglu(a, g, u)
    assert len(converted) == 6 and SimulatedLaunch.launches == 2
    _close(y, epilogue.activate(np, _f32(a) @ _f32(g), "silu") * (_f32(a) @ _f32(u)))


def test_wrong_one_kernel_calls_still_raise_their_own_errors(torch_on_simulated_gpu):
    a, g = tensor((16, 64)), tensor((64, 128))
    with pytest.raises(TypeError, match="w_up"):
        hopmm.swiglu(a, g)
    with pytest.raises(ValueError, match="bias"):
        hopmm.matmul_shared_a(a, [g, g], bias=[None])
