"""CPU: torch tensors at hopmm's public functions, where no GPU is needed: torch is never
imported by hopmm, CPU tensors, tensors requiring grad and torch mixed with cupy are refused
with errors naming the argument. (tests/test_gpu_torch.py runs CUDA tensors.)"""
import subprocess
import sys

import numpy as np
import pytest

import hopmm
from hopmm import interop

torch = pytest.importorskip("torch")

PUBLIC = [hopmm.matmul, hopmm.explain, hopmm.plan]


def _host_cupy(shape):
    """A cupy array over host memory: its type is all these tests read (never launched)."""
    import cupy

    host = np.zeros(shape, np.float16)
    memory = cupy.cuda.UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=0)
    # (the memory object holds `host`, the owner, alive)
    return cupy.ndarray(shape, np.float16, memptr=cupy.cuda.MemoryPointer(memory, 0))


def test_importing_hopmm_does_not_import_torch():
    run = subprocess.run([sys.executable, "-c",
                          "import sys, hopmm; assert 'torch' not in sys.modules"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_no_tensor_is_looked_for_while_torch_is_not_loaded(monkeypatch):
    t = torch.ones(2)
    assert interop.has_tensor([1, t])
    monkeypatch.delitem(sys.modules, "torch")
    assert not interop.has_tensor([1, t])


@pytest.mark.parametrize("func", PUBLIC, ids=lambda f: f.__name__)
@pytest.mark.parametrize("where", ["a", "b", "out"])
def test_cpu_tensors_are_refused_naming_the_argument(func, where):
    """The one tensor among the arguments is named (the others are not arrays at all)."""
    args = {"a": 2.0, "b": 3.0, "out": None}
    args[where] = torch.ones(2, 2, dtype=torch.float16)
    with pytest.raises(TypeError, match=f"{where} is a torch tensor on cpu.*{where}.cuda()"):
        func(args["a"], args["b"], out=args["out"])


def test_the_first_cpu_tensor_is_named():
    with pytest.raises(TypeError, match="hopmm.matmul: a is a torch tensor on cpu"):
        hopmm.matmul(torch.ones(2, 2), torch.ones(2, 2))


@pytest.mark.parametrize("func", PUBLIC, ids=lambda f: f.__name__)
def test_tensors_requiring_grad_are_refused_while_grad_is_on(func):
    w = torch.ones(3, 4, requires_grad=True)
    with pytest.raises(ValueError, match="b requires grad.*torch.no_grad()"):
        func(2.0, w)
    with torch.no_grad():   # read through .detach(): on to the next check (the device)
        with pytest.raises(TypeError, match="b is a torch tensor on cpu"):
            func(2.0, w)


@pytest.mark.parametrize("func", PUBLIC, ids=lambda f: f.__name__)
def test_torch_mixed_with_cupy_is_refused(func):
    x = _host_cupy((3, 4))
    with pytest.raises(TypeError, match="b is a cupy.ndarray but a is a torch.Tensor; mixed"):
        func(torch.ones(2, 3), x)
    with pytest.raises(TypeError, match="a is a cupy.ndarray but b is a torch.Tensor; mixed"):
        func(_host_cupy((2, 3)), torch.ones(3, 4))
    with pytest.raises(TypeError, match="out is a cupy.ndarray .* mixed"):
        func(torch.ones(2, 3), torch.ones(3, 4), out=_host_cupy((2, 4)))


def test_keyword_array_arguments_are_converted_too():
    """The wrapper converts every array argument: a later keyword (e.g. bias=) included."""
    @interop.accepts_torch
    def fused(a, b, *, bias=None):
        return "called"

    assert fused(1, 2, bias=None) == "called"
    with pytest.raises(TypeError, match="hopmm.fused: bias is a torch tensor on cpu"):
        fused(1, 2, bias=torch.ones(3))
    with pytest.raises(TypeError, match="bias is a cupy.ndarray but a is a torch.Tensor"):
        fused(torch.ones(2), 2, bias=_host_cupy((3,)))


def test_a_plain_call_never_reaches_the_torch_path(monkeypatch):
    """Without a torch tensor among the arguments the function runs as it is."""
    monkeypatch.setattr(interop, "call_with_tensors",
                        lambda *args: pytest.fail("took the torch path"))
    with pytest.raises(TypeError, match="must be a cupy.ndarray"):
        hopmm.plan(np.ones((2, 2)), np.ones((2, 2)))
