"""NVRTC through ctypes: CUDA C++ source -> sm_90a cubin, on machines with or without a GPU.

CuPy's own compile path asks the device for its architecture (so it cannot run without a GPU)
and its `getCUBIN` wrapper returns the cubin one byte short; calling NVRTC directly avoids both
and gives the ptxas log (registers, spills, warnings) that the resource checks read.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import dataclass

NVRTC_SUCCESS = 0
_LIBRARY_NAMES = ("libnvrtc.so.13", "libnvrtc.so")


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries the compiler log, also in `log`."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class CompileResult:
    cubin: bytes
    log: str


def _find_library() -> ctypes.CDLL:
    try:  # the nvidia-cuda-nvrtc wheel, found the way CuPy finds it
        from cuda import pathfinder

        return ctypes.CDLL(pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path)
    except Exception:
        pass
    errors = []
    for name in _LIBRARY_NAMES + tuple(filter(None, [ctypes.util.find_library("nvrtc")])):
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise RuntimeError(
        "NVRTC not found: install it with `pip install nvidia-cuda-nvrtc==13.0.*` "
        f"({'; '.join(errors)})"
    )


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    lib = _find_library()
    p, c, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(p), c, c, ctypes.c_int, p, p]
    lib.nvrtcCompileProgram.argtypes = [p, ctypes.c_int, ctypes.POINTER(c)]
    lib.nvrtcGetCUBINSize.argtypes = [p, ctypes.POINTER(sz)]
    lib.nvrtcGetCUBIN.argtypes = [p, c]
    lib.nvrtcGetProgramLogSize.argtypes = [p, ctypes.POINTER(sz)]
    lib.nvrtcGetProgramLog.argtypes = [p, c]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(p)]
    lib.nvrtcGetErrorString.restype = c
    lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    return lib


def version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(_lib().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def _check(status: int, what: str) -> None:
    if status != NVRTC_SUCCESS:
        raise CompileError(f"{what}: {_lib().nvrtcGetErrorString(status).decode()}")


def _read(prog, size_fn, get_fn) -> bytes:
    size = ctypes.c_size_t()
    _check(size_fn(prog, ctypes.byref(size)), size_fn.__name__)
    buf = ctypes.create_string_buffer(size.value)
    _check(get_fn(prog, buf), get_fn.__name__)
    return buf.raw[: size.value]


def compile_cubin(source: str, name: str, options: tuple[str, ...]) -> CompileResult:
    """Compiles `source` to a cubin. Raises CompileError with the log on failure."""
    lib = _lib()
    prog = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = lib.nvrtcCompileProgram(prog, len(options), opts)
        log = _read(prog, lib.nvrtcGetProgramLogSize, lib.nvrtcGetProgramLog).rstrip(b"\0").decode()
        if status != NVRTC_SUCCESS:
            raise CompileError(f"{name}: {lib.nvrtcGetErrorString(status).decode()}\n{log}", log)
        cubin = _read(prog, lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN)
        return CompileResult(cubin=cubin, log=log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
