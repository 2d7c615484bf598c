"""torch.Tensor arguments for hopmm's public functions, zero-copy through DLPack.

A call given CUDA torch tensors runs on cupy views of the same memory (`cupy.from_dlpack`:
strides, offsets and dtype, bfloat16 included, are kept), on the current torch stream of their
device (a cupy ExternalStream of it, so the kernels are queued where the caller's torch work
is), and answers in torch: a new cupy result comes back as a torch view of it
(`torch.from_dlpack`), an argument the function wrote and returned (`out=`) as the caller's own
tensor. Every array-valued argument is converted, positional or keyword, so functions with more
array arguments compose with the same wrapper.

torch stays optional: hopmm never imports it. A torch tensor can only exist once torch has been
imported, so `sys.modules` says whether there is anything to look for.

Decisions:
- torch tensors and cupy arrays mixed in one call are refused (TypeError): which type the
  result should have, and which stream the call should run on, would be a guess.
- CPU tensors are refused (TypeError naming the argument), like numpy arrays are.
- A tensor that requires grad while grad mode is on is refused (ValueError): hopmm has no
  backward, and a result silently cut from the autograd graph would train wrong. Under
  `torch.no_grad()` or `torch.inference_mode()` such tensors are read through `.detach()`.
- A repeated call reads torch.Tensor and torch.nn.Parameter operands (a model's weights and
  biases) straight through their pointers (_direct_repeat; shared_a's one-kernel repeats);
  other Tensor subclasses, which may dispatch elsewhere, are converted through DLPack on every
  call.
"""
from __future__ import annotations

import functools
import sys

from . import fastpath
from .layout import TMA_ALIGN

# cupy ExternalStream wrappers kept per (device, stream pointer): a process uses a handful of
# torch streams, and a wrapper costs a few microseconds to make. Past this many the cache is
# dropped rather than grown (streams are created and destroyed by some programs).
MAX_STREAMS = 64
_streams: dict = {}
# Torch calls that repeat through direct launches: _tensor_key -> fastpath.DirectRecipe (or
# _fused_tensor_key -> fastpath.FusedDirectRecipe).
_direct = fastpath.Remembered(fastpath.MAX_RECIPES)
# Where the device index sits in _tensor_key's tuple, and in _fused_tensor_key's ("fused"
# first).
TENSOR_KEY_DEVICE = 8
FUSED_KEY_DEVICE = TENSOR_KEY_DEVICE + 1


def _tensor_type():
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def is_tensor(x) -> bool:
    """Whether `x` is exactly a torch.Tensor (False, cheaply, when torch is not loaded)."""
    tensor = _tensor_type()
    return tensor is not None and type(x) is tensor


def has_tensor(values) -> bool:
    """Whether any of `values` is a torch.Tensor (False, cheaply, when torch is not loaded)."""
    tensor = _tensor_type()
    return tensor is not None and any(isinstance(x, tensor) for x in values)


def _flat(values) -> list:
    """`values` with the items of each list or tuple among them in its place (arguments such
    as matmul_shared_a's `bs` hold arrays one level down)."""
    out = []
    for x in values:
        if isinstance(x, (list, tuple)):
            out.extend(x)
        else:
            out.append(x)
    return out


def accepts_torch(func=None, *, repeat=None, remember=None):
    """`func` taking cupy arrays (also in list or tuple arguments), made to take torch
    tensors as well (see the module). `repeat(*args, **kwargs)`, where given, is asked first
    on a call with torch tensors: its result, or None for the full path; `remember(args,
    kwargs, cupy_args, cupy_kwargs, cupy_result)` is told of each call the full path ran (so
    that a repeat can find it)."""
    if func is None:
        return functools.partial(accepts_torch, repeat=repeat, remember=remember)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if has_tensor(_flat(args)) or has_tensor(_flat(kwargs.values())):
            if repeat is not None:
                result = repeat(*args, **kwargs)
                if result is not None:
                    return result
            after = None if remember is None else functools.partial(remember, args, kwargs)
            return call_with_tensors(func, args, kwargs, after=after)
        return func(*args, **kwargs)

    return wrapper


def _positional_names(func, count: int) -> list[str]:
    code = func.__code__
    names = list(code.co_varnames[:code.co_argcount])
    return names[:count] + [f"argument {i}" for i in range(len(names), count)]


def matmul_tensors(matmul, a, b, out):
    """hopmm.matmul of torch tensors: a repeat of a call that launched straight from and into
    its operands goes through its remembered launches (`_direct_repeat`); any other call is
    converted through DLPack (call_with_tensors), and remembered where it can so repeat."""
    result = _direct_repeat(a, b, out)
    if result is not None:
        return result

    def remember(cupy_args, cupy_kwargs, cupy_result):
        recipe = fastpath.lookup(fastpath.key(*cupy_args))
        if isinstance(recipe, fastpath.DirectRecipe):
            _direct.put(_tensor_key(a, b, out), recipe)

    return call_with_tensors(matmul, (a, b, out), {}, after=remember)


def fused_tensors(matmul, a, b, out, bias, activation, alpha, beta, c):
    """hopmm.matmul with epilogue keywords and torch tensors: a repeat of a call whose plain
    launches read the tensors in place and stored into the result goes straight to them
    (_direct_fused_repeat); any other call is converted through DLPack (call_with_tensors),
    and remembered where it can so repeat. The keywords come one by one: a repeat makes no
    dict of them."""
    result = _direct_fused_repeat(a, b, out, bias, activation, alpha, beta, c)
    if result is not None:
        return result

    def remember(cupy_args, cupy_kwargs, cupy_result):
        k = fastpath.fused_key(*cupy_args, cupy_kwargs)
        recipe = None if k is None else fastpath.lookup(k)
        if isinstance(recipe, fastpath.FusedDirectRecipe):
            try:
                _direct.put(_fused_tensor_key(a, b, out, bias, activation, alpha, beta, c),
                            recipe)
            except TypeError:   # an unhashable keyword: such calls are never remembered
                pass

    keywords = dict(bias=bias, activation=activation, alpha=alpha, beta=beta, c=c)
    return call_with_tensors(matmul, (a, b, out), keywords, after=remember)


def _fused_tensor_key(a, b, out, bias, activation, alpha, beta, c):
    """_tensor_key for a call with epilogue keywords: every keyword's type and value, and
    bias's and c's shapes, strides and dtypes (fastpath.keywords_key); None where such a call
    is not repeated directly (a bias or c that _direct_operand declines, an unhashable
    keyword)."""
    k = _tensor_key(a, b, out)
    if k is None:
        return None
    torch, device = sys.modules["torch"], k[TENSOR_KEY_DEVICE]
    direct = _direct_types(torch)
    bias_key = _epilogue_operand_key(bias, torch, direct, device)
    c_key = _epilogue_operand_key(c, torch, direct, device)
    if bias_key is False or c_key is False:
        return None
    # Not hashed here: the lookup (_remembered_fused) hashes it once, and takes an
    # unhashable keyword's TypeError as "not remembered".
    return ("fused", *k, *fastpath.keywords_key(activation, alpha, beta, bias_key, c_key))


def _epilogue_operand_key(x, torch, direct: tuple, device: int):
    """fastpath._epilogue_operand_key of a torch bias or c: None for none, False where a
    direct repeat may not read it (_direct_operand), else its shape, strides and dtype."""
    if x is None:
        return None
    if not _direct_operand(x, torch, direct, device):
        return False
    return (x.shape, x.stride(), x.dtype)


def _remembered_fused(k):
    """The recipe remembered under fused key k; None where there is none or k holds an
    unhashable keyword (the full path says what is wrong with it)."""
    try:
        return _direct.get(k)
    except TypeError:
        return None


def _empty(torch, shape, dtype, device: int):
    """A new CUDA tensor on device `device`. The index stands for the device (torch reads an
    ordinal as one of the current accelerator's): making the a.device object costs about as
    much as the rest of a direct repeat's checks. The sizes go one by one: torch parses a
    tuple of them about 1 us slower (an H100 host, NOTES v0.46)."""
    if not shape:
        return torch.empty((), dtype=dtype, device=device)
    return torch.empty(*shape, dtype=dtype, device=device)


def _direct_fused_repeat(a, b, out, bias, activation, alpha, beta, c):
    """The result of a fused repeat through its remembered launches (its DirectRepeat), on
    the current torch stream, with the new bias and c pointers; None where the call takes the
    full path (no recipe, or an out that overlaps A, B, bias or c other than being c)."""
    k = _fused_tensor_key(a, b, out, bias, activation, alpha, beta, c)
    recipe = _remembered_fused(k)
    if recipe is None:
        return None
    torch = sys.modules["torch"]
    device = k[FUSED_KEY_DEVICE]
    result = out if out is not None else _empty(torch, recipe.out_shape, a.dtype, device)
    if recipe.repeat.run_fused(_raw_stream(torch, device), a.data_ptr(), b.data_ptr(),
                               result.data_ptr(), 0 if bias is None else bias.data_ptr(),
                               0 if c is None else c.data_ptr()):
        return result
    return None


def _tensor_key(a, b, out):
    """What fastpath.key holds, of torch tensors on the current device (None otherwise): a
    tensor's strides in elements stand for cupy's in bytes, since the dtype is in the key.
    None too for a tensor requiring grad while grad mode is on, which call_with_tensors
    refuses (under no_grad it reads the same memory, detached)."""
    torch = sys.modules["torch"]
    direct = _direct_types(torch)
    if type(a) not in direct or type(b) not in direct:
        return None
    if (a.requires_grad or b.requires_grad) and torch.is_grad_enabled():
        return None
    device = a.get_device()
    if device < 0 or b.get_device() != device or device != _current_device():
        return None
    k = (a.shape, a.stride(), a.dtype, a.data_ptr() % TMA_ALIGN == 0,
         b.shape, b.stride(), b.dtype, b.data_ptr() % TMA_ALIGN == 0, device)
    if out is not None:
        if not _direct_operand(out, torch, direct, device):
            return None
        k += (out.shape, out.stride(), out.dtype, out.data_ptr() % TMA_ALIGN == 0)
    return k


def _direct_operand(x, torch, direct: tuple, device: int) -> bool:
    """Whether a direct repeat may read or write tensor x (not A or B) through its pointer: one
    of the `direct` types on `device`, not requiring grad while grad mode is on."""
    return (type(x) in direct and not (x.requires_grad and torch.is_grad_enabled())
            and x.get_device() == device)


# (torch module, its direct types), made once per torch module.
_direct_types_of = (None, ())


def _direct_types(torch) -> tuple:
    """torch.Tensor and torch.nn.Parameter, the types a direct repeat reads through their
    pointers (a Parameter is a Tensor of its own memory)."""
    global _direct_types_of
    module, types = _direct_types_of
    if module is not torch:
        nn = getattr(torch, "nn", None)
        types = (torch.Tensor,) + ((nn.Parameter,) if nn is not None else ())
        _direct_types_of = (torch, types)
    return types


def _current_device() -> int:
    cupy = fastpath._cupy or fastpath._bind_cupy()
    return cupy.cuda.runtime.getDevice()


def _raw_stream(torch, device: int) -> int:
    """The handle of torch's current stream on `device`: torch's raw accessor where it has one
    (the one its own compiled kernels use: no Stream object is made), else the public API."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device)
    return torch.cuda.current_stream(device).cuda_stream


def _direct_repeat(a, b, out):
    """The result of a repeat through its remembered direct launches, on the current torch
    stream, into a new torch tensor or `out`; None where the call takes the full path."""
    k = _tensor_key(a, b, out)
    recipe = _direct.get(k)
    if recipe is None:
        return None
    torch = sys.modules["torch"]
    device = k[TENSOR_KEY_DEVICE]
    result = out if out is not None else _empty(torch, recipe.out_shape, a.dtype, device)
    if recipe.repeat.run(_raw_stream(torch, device), a.data_ptr(), b.data_ptr(),
                         result.data_ptr()):
        return result
    return None


def call_with_tensors(func, args: tuple, kwargs: dict, after=None):
    """func(*args, **kwargs) with every torch tensor replaced by a cupy view of it, run on
    the tensors' current torch stream; cupy arrays in the result come back as torch tensors.
    `after(cupy_args, cupy_kwargs, cupy_result)`, where given, sees the call as it ran."""
    import cupy

    torch = sys.modules["torch"]
    fname = f"hopmm.{func.__name__}"
    named = _named_items(list(zip(_positional_names(func, len(args)), args))
                         + list(kwargs.items()))
    tensors = [(name, x) for name, x in named if isinstance(x, torch.Tensor)]
    for name, x in named:
        if isinstance(x, cupy.ndarray):
            raise TypeError(f"{fname}: {name} is a cupy.ndarray but {tensors[0][0]} is a "
                            f"torch.Tensor; mixed torch and cupy arguments are refused: pass "
                            f"all of them as torch tensors or all as cupy arrays "
                            f"(torch.from_dlpack / cupy.from_dlpack convert without a copy)")
    grad = torch.is_grad_enabled()
    for name, x in tensors:
        if grad and x.requires_grad:
            raise ValueError(f"{fname}: {name} requires grad, and hopmm has no backward: call "
                             f"it under torch.no_grad() or pass {name}.detach()")
        if not x.is_cuda:
            raise TypeError(f"{fname}: {name} is a torch tensor on {x.device}; hopmm runs on "
                            f"CUDA tensors: move it there with {name}.cuda()")
    devices = {x.get_device() for _, x in tensors}
    if len(devices) > 1:
        where = ", ".join(f"{name} on cuda:{x.get_device()}" for name, x in tensors)
        raise ValueError(f"{fname}: tensors are on different devices ({where})")
    device = devices.pop()
    with cupy.cuda.Device(device), _external_stream(torch, cupy, device):
        views = {}   # id of a cupy view -> the tensor it views

        def to_cupy(x):
            if isinstance(x, (list, tuple)):
                return type(x)(to_cupy(item) for item in x)
            if not isinstance(x, torch.Tensor):
                return x
            view = tensor_to_cupy(x.detach() if x.requires_grad else x, torch, cupy)
            views[id(view)] = x
            return view

        cupy_args = [to_cupy(x) for x in args]
        cupy_kwargs = {name: to_cupy(x) for name, x in kwargs.items()}
        result = func(*cupy_args, **cupy_kwargs)
        if after is not None:
            after(cupy_args, cupy_kwargs, result)
        return _to_torch(result, views, torch, cupy)


def _named_items(named: list) -> list:
    """(name, value) of every argument, the items of a list or tuple argument as
    `name[i]`."""
    out = []
    for name, x in named:
        if isinstance(x, (list, tuple)):
            out.extend((f"{name}[{i}]", item) for i, item in enumerate(x))
        else:
            out.append((name, x))
    return out


def tensor_to_cupy(x, torch, cupy):
    """The cupy view of CUDA tensor x, of its dtype (bfloat16 through an int16 view where a
    DLPack exchange does not carry bfloat16)."""
    if x.dtype == torch.bfloat16:
        try:
            view = cupy.from_dlpack(x)
            if view.dtype.name == "bfloat16":
                return view
        except (TypeError, ValueError, BufferError):
            pass
        return cupy.from_dlpack(x.view(torch.int16)).view(_bfloat16())
    return cupy.from_dlpack(x)


def cupy_to_tensor(x, torch, cupy):
    """The torch view of cupy array x, of its dtype (bfloat16 as in tensor_to_cupy)."""
    if x.dtype.name == "bfloat16":
        try:
            t = torch.from_dlpack(x)
            if t.dtype == torch.bfloat16:
                return t
        except (TypeError, ValueError, BufferError, RuntimeError):
            pass
        return torch.from_dlpack(x.view(cupy.int16)).view(torch.bfloat16)
    return torch.from_dlpack(x)


def _bfloat16():
    """NumPy's bfloat16 (ml_dtypes', as CuPy uses)."""
    import ml_dtypes

    return ml_dtypes.bfloat16


def _external_stream(torch, cupy, device: int):
    """The cupy stream object of the current torch stream on `device`."""
    ptr = torch.cuda.current_stream(device).cuda_stream
    key = (device, ptr)
    stream = _streams.get(key)
    if stream is None:
        if len(_streams) >= MAX_STREAMS:
            _streams.clear()
        stream = _streams[key] = cupy.cuda.ExternalStream(ptr, device)
    return stream


def _to_torch(result, views: dict, torch, cupy):
    """cupy arrays in `result` (itself, or the items of a list or tuple) as torch tensors: the
    caller's own tensor where the function returned the view of one (out=), else a torch view
    of the new array."""
    if isinstance(result, cupy.ndarray):
        original = views.get(id(result))
        return original if original is not None else cupy_to_tensor(result, torch, cupy)
    if isinstance(result, (list, tuple)):
        return type(result)(_to_torch(x, views, torch, cupy) for x in result)
    return result
