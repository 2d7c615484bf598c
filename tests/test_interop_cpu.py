"""CPU: torch tensors at hopmm's public functions, where no GPU is needed: torch is never
imported by hopmm, CPU tensors, tensors requiring grad and torch mixed with cupy are refused
with errors naming the argument. (tests/test_gpu_torch.py runs CUDA tensors.)"""
import subprocess
import sys
import types

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


class _FakeTensor:
    """What interop reads of a CUDA torch tensor."""
    is_cuda = True
    dtype = "float16"

    def __init__(self, device=0, requires_grad=False):
        self.device = f"cuda:{device}"
        self._index, self.requires_grad = device, requires_grad

    def get_device(self):
        return self._index

    def detach(self):
        return _FakeTensor(self._index)


class _Context:
    def __init__(self, log, what):
        self.log, self.what = log, what

    def __enter__(self):
        self.log.append(("enter",) + self.what)

    def __exit__(self, *exc):
        self.log.append(("exit",) + self.what)


@pytest.fixture
def fake_cuda_torch(monkeypatch):
    """A torch of CUDA tensors (interop's view of it), and cupy's stream, device and DLPack
    entry points recording what interop asks of them."""
    import cupy

    log = []
    fake = types.ModuleType("torch")
    fake.Tensor, fake.bfloat16 = _FakeTensor, "bfloat16"
    fake.is_grad_enabled = lambda: True
    fake.cuda = types.SimpleNamespace(
        current_stream=lambda device: types.SimpleNamespace(cuda_stream=0x5000 + device))
    fake.from_dlpack = lambda x: ("torch view", x)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(interop, "_streams", {})

    def from_dlpack(t):
        log.append(("from_dlpack", t))
        return _host_cupy((2, 2))

    monkeypatch.setattr(cupy, "from_dlpack", from_dlpack)
    monkeypatch.setattr(cupy.cuda, "Device", lambda device: _Context(log, ("device", device)))

    def external_stream(ptr, device):
        log.append(("new stream", ptr, device))
        return _Context(log, ("stream", ptr))

    monkeypatch.setattr(cupy.cuda, "ExternalStream", external_stream)
    return log


def test_every_tensor_argument_is_converted_on_the_torch_stream(fake_cuda_torch):
    import cupy

    log = fake_cuda_torch
    seen = {}

    @interop.accepts_torch
    def fused(a, b, out=None, *, bias=None, scale=1.0):
        seen.update(a=a, b=b, out=out, bias=bias, scale=scale, log=list(log))
        return out if out is not None else [_host_cupy((1,)), "text"]

    a, b, out, bias = (_FakeTensor(1) for _ in range(4))
    assert fused(a, b, out, bias=bias, scale=2.0) is out   # out= comes back as the caller's
    assert all(isinstance(seen[k], cupy.ndarray) for k in ("a", "b", "out", "bias"))
    assert seen["scale"] == 2.0
    # The call ran inside the device and the stream of the current torch stream of cuda:1.
    assert seen["log"][:3] == [("enter", "device", 1), ("new stream", 0x5001, 1),
                               ("enter", "stream", 0x5001)]
    assert log[-1] == ("exit", "device", 1) and ("exit", "stream", 0x5001) in log
    assert sum(1 for e in log if e[0] == "from_dlpack") == 4
    # A new cupy result becomes a torch view; other results pass; the stream is reused.
    result = fused(a, b)
    assert result[0][0] == "torch view" and result[1] == "text"
    assert sum(1 for e in log if e[0] == "new stream") == 1


def test_tensors_on_two_devices_are_refused(fake_cuda_torch):
    with pytest.raises(ValueError, match=r"different devices \(a on cuda:0, b on cuda:1\)"):
        hopmm.plan(_FakeTensor(0), _FakeTensor(1))


def test_a_tensor_requiring_grad_is_read_detached_under_no_grad(fake_cuda_torch, monkeypatch):
    log = fake_cuda_torch
    w = _FakeTensor(0, requires_grad=True)

    @interop.accepts_torch
    def f(a):
        return "ran"

    with pytest.raises(ValueError, match="a requires grad"):
        f(w)
    monkeypatch.setattr(sys.modules["torch"], "is_grad_enabled", lambda: False)
    assert f(w) == "ran"
    converted = [e[1] for e in log if e[0] == "from_dlpack"]
    assert len(converted) == 1 and converted[0] is not w and not converted[0].requires_grad


def test_the_raw_stream_accessor_is_used_where_torch_has_one():
    from hopmm import interop

    calls = []
    public = types.SimpleNamespace(cuda_stream=7)
    fake = types.SimpleNamespace(
        _C=types.SimpleNamespace(_cuda_getCurrentRawStream=lambda d: calls.append(d) or 42),
        cuda=types.SimpleNamespace(current_stream=lambda d: public))
    assert interop._raw_stream(fake, 1) == 42 and calls == [1]
    del fake._C._cuda_getCurrentRawStream
    assert interop._raw_stream(fake, 1) == 7


def test_shared_a_functions_name_the_tensor_inside_a_list():
    """matmul_shared_a's `bs` and `bias` hold arrays one level down: a CPU tensor or a cupy
    array among torch tensors there is named by its index."""
    a = torch.ones(2, 3)
    with pytest.raises(TypeError, match=r"hopmm.matmul_shared_a: a is a torch tensor on cpu"):
        hopmm.matmul_shared_a(a, [torch.ones(3, 4)])
    with pytest.raises(TypeError, match=r"bs\[1\] is a torch tensor on cpu"):
        hopmm.matmul_shared_a(2.0, [3.0, torch.ones(3, 4)])
    with pytest.raises(TypeError, match=r"bs\[0\] is a cupy.ndarray but a is a torch.Tensor"):
        hopmm.matmul_shared_a(a, (_host_cupy((3, 4)),))
    with pytest.raises(TypeError, match=r"bias\[0\] is a torch tensor on cpu"):
        hopmm.matmul_shared_a(2.0, [3.0], bias=[torch.ones(4)])
    with pytest.raises(TypeError, match="hopmm.swiglu: w_up is a torch tensor on cpu"):
        hopmm.swiglu(2.0, 3.0, torch.ones(3, 4))


def test_tensors_in_a_list_argument_are_converted(fake_cuda_torch):
    import cupy

    seen = {}

    @interop.accepts_torch
    def several(a, bs):
        seen.update(a=a, bs=bs)
        return [_host_cupy((1,)) for _ in bs]

    result = several(_FakeTensor(0), (_FakeTensor(0), _FakeTensor(0)))
    assert isinstance(seen["bs"], tuple) and len(seen["bs"]) == 2
    assert all(isinstance(x, cupy.ndarray) for x in (seen["a"], *seen["bs"]))
    # A list of new cupy results comes back as a list of torch views.
    assert isinstance(result, list) and all(r[0] == "torch view" for r in result)
