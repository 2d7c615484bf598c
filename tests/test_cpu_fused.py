"""CPU: fused epilogues (matmul's bias / activation / alpha / beta / c keywords): every chain
renders, one kernel per schedule with the fullest chain compiles for sm_90a without spills,
the keywords are validated before anything runs, and whole calls run against the simulated
GPU of test_cpu_simulated_launch (whose kernel stand-in applies the chain from nothing but the
kernel's arguments), including repeats through remembered launches."""
import math
from dataclasses import replace

import numpy as np
import pytest

import hopmm
from hopmm import api, compile as compiler, device, epilogue, launch, sass
from hopmm.device import H100_SXM
from hopmm.epilogue import ACTIVATIONS, EpilogueSpec
from hopmm.schedules import SCHEDULES, PersistentSchedule
from test_cpu_simulated_launch import (BF16, FakeArray, SimulatedDirectRepeat,  # noqa: F401
                                       SimulatedLaunch, fake, rand, simulated_gpu)

FULLEST = EpilogueSpec("gelu_tanh", bias=True, c=True)


def _config(sched, dtype="bfloat16"):
    """One representative config of a schedule: its widest tile, plain layout."""
    cfgs = [c for c in sched.configs(H100_SXM.smem_per_block_optin)
            if c.dtype == dtype and not c.trans_a and not c.trans_b]
    return max(cfgs, key=lambda c: (c.block_m * c.block_n, c.stages))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("has_c", [False, True])
def test_every_chain_renders_into_name_and_config(activation, bias, has_c):
    spec = EpilogueSpec(activation, bias, has_c)
    cfg = replace(_config(PersistentSchedule), epilogue=spec)
    kernel = PersistentSchedule.render(cfg)
    assert spec.tag in kernel.name and kernel.name.endswith("_NT")
    src = kernel.source
    assert f"kActivation = {ACTIVATIONS.index(activation)};" in src
    assert f"kHasBias = {'true' if bias else 'false'};" in src
    assert f"kHasC = {'true' if has_c else 'false'};" in src
    assert "kEpilogue = true;" in src and "float alpha, float beta" in src
    plain = PersistentSchedule.render(_config(PersistentSchedule))
    assert "kEpilogue = false;" in plain.source and "epilogue_bias" not in plain.source
    assert plain.name != kernel.name and plain.source_hash != kernel.source_hash


def test_unknown_activation_in_a_spec_is_refused():
    with pytest.raises(ValueError, match="unknown activation"):
        EpilogueSpec("tanh")


# Each activation's closed form in float64, the truth the fp32 references are held to.
EXACT_ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * np.vectorize(math.erfc)(-x / math.sqrt(2)),
    # 0.5 * (1 + tanh(u)) as 1 / (1 + exp(-2u)): even float64 cancels the first form to 0
    "gelu_tanh": lambda x: x / (1 + np.exp(-2 * math.sqrt(2 / math.pi)
                                           * (x + 0.044715 * x ** 3))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


@pytest.mark.parametrize("activation", [a for a in ACTIVATIONS if a])
def test_reference_activations_keep_their_tails_in_fp32(activation):
    """The fp32 chain (the CuPy path's and the tests' reference) is relatively accurate far
    into the negative tail, where 1 + erf or 1 + tanh would cancel to nothing (at x = -5 that
    form of gelu is off by 30 %), and overflows nowhere."""
    x = np.linspace(-9.0, 9.0, 3601, dtype=np.float32)
    with np.errstate(all="raise"):
        got = epilogue.activate(np, x, activation).astype(np.float64)
        exact = EXACT_ACTIVATIONS[activation](x.astype(np.float64))
    nonzero = np.abs(exact) > 1e-30
    assert np.max(np.abs(got - exact)[nonzero] / np.abs(exact[nonzero])) < 1e-4
    assert np.all(got[~nonzero] == 0)


def _kernel_gelu_constants():
    """gelu_erf's constants in epilogue_functors.cuh: the two named ones and P's coefficients,
    highest power first."""
    import re

    from hopmm import render

    source = render.read_snippet("epilogue_functors.cuh")
    body = source[source.index("static float gelu_erf"):]
    body = body[:body.index("return x *")]
    named = dict(re.findall(r"constexpr float (k\w+) = (-?[0-9.e]+)f;", body))
    horner = [float(v) for v in re.findall(r"float p = (-?[0-9.e]+)f;", body)]
    horner += [float(v) for v in re.findall(r"p = fmaf\(p, t, (-?[0-9.e]+)f\);", body)]
    return float(named["kHalfRsqrt2"]), float(named["kMinusHalfLog2e"]), horner


def test_kernel_gelu_meets_its_accuracy_in_fp32():
    """The kernel's GELU (erf), its constants read from the snippet and its steps emulated in
    float32: within 2e-5 of x * Phi(x) relative, the negative tail included, far inside a
    16-bit rounding (2^-11 for float16)."""
    half_rsqrt2, minus_half_log2e, horner = _kernel_gelu_constants()
    assert len(horner) == 6   # the degree-5 fit
    f32 = np.float32
    x = np.linspace(-9.0, 9.0, 72001, dtype=np.float32)
    t = (f32(1) / (np.abs(x) * f32(half_rsqrt2) + f32(1))).astype(np.float32)
    p = np.full_like(t, f32(horner[0]))
    for coefficient in horner[1:]:
        p = (p * t + f32(coefficient)).astype(np.float32)
    q = (t * np.exp2((x * f32(minus_half_log2e)) * x + p)).astype(np.float32)
    got = (x * np.where(x >= 0, f32(1) - q, q)).astype(np.float64)
    exact = EXACT_ACTIVATIONS["gelu"](x.astype(np.float64))
    nonzero = np.abs(exact) > 1e-30
    assert np.max(np.abs(got - exact)[nonzero] / np.abs(exact[nonzero])) < 2e-5


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_fullest_chain_compiles_without_spills(name):
    sched = SCHEDULES[name]
    dtype = "float16" if name == "persistent" else "bfloat16"  # both conversions of c/bias
    cfg = replace(_config(sched, dtype), epilogue=FULLEST)
    kernel = compiler.compile_kernel(sched.render(cfg))
    r = kernel.report
    assert r.spill_stores == r.spill_loads == r.stack_frame == 0, kernel.name
    # No call left in the kernel (ptxas then serializes the wgmmas: warning C7510).
    assert not any("C7510" in w for w in r.warnings), r.warnings
    assert r.problems(sched.smem_bytes(cfg), H100_SXM.smem_per_block_optin) == []
    tool = sass.find_cuobjdump()
    if tool is not None:
        s = sass.summarize(kernel.cubin_path, tool)
        assert s.counts["local_memory"] == 0
        listing = sass.disassemble(kernel.cubin_path, tool)
        # bias and c are read in the epilogue, after the dependency wait like every access
        assert sass.global_access_before_dependency_wait(listing) == []


# ---- validation (nothing runs, nothing is written to out) ----

def _nan_out(shape, dtype=BF16):
    return fake(np.full(shape, np.nan, dtype=dtype))


class _OtherDevice:
    id = 1


class OtherDeviceArray(FakeArray):
    @property
    def device(self):
        return _OtherDevice()


BAD = {
    "bias_length": (dict(bias=lambda: rand((33,))), ValueError, "bias has shape"),
    "bias_2d_row": (dict(bias=lambda: rand((1, 48))), ValueError, "bias has shape"),
    "bias_dtype": (dict(bias=lambda: rand((48,), np.float16)), TypeError, "bias has dtype"),
    "bias_numpy": (dict(bias=lambda: np.ones(48, BF16)), TypeError, "bias must be a cupy"),
    "bias_device": (dict(bias=lambda: rand((48,)).view(OtherDeviceArray)), ValueError,
                    "bias is on device 1"),
    "c_shape": (dict(c=lambda: rand((40, 48)), beta=1.0), ValueError, "c has shape"),
    "c_dtype": (dict(c=lambda: rand((64, 48), np.float16), beta=1.0), TypeError,
                "c has dtype"),
    "c_device": (dict(c=lambda: rand((64, 48)).view(OtherDeviceArray), beta=1.0), ValueError,
                 "c is on device 1"),
    "activation": (dict(activation=lambda: "tanh"), ValueError, "unknown activation"),
    "activation_type": (dict(activation=lambda: 3), TypeError, "activation must be"),
    "beta_without_c": (dict(beta=lambda: 0.5), ValueError, "beta = 0.5 needs c"),
    "alpha_type": (dict(alpha=lambda: "2"), TypeError, "alpha must be a real number"),
    "alpha_nan": (dict(alpha=lambda: float("nan")), ValueError, "alpha must be finite"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_keywords_raise_and_leave_out_untouched(simulated_gpu, case):
    keywords, error, message = BAD[case]
    kw = {k: (v() if callable(v) else v) for k, v in keywords.items()}
    a, b = rand((64, 32)), rand((32, 48))
    out = _nan_out((64, 48))
    with pytest.raises(error, match=message):
        hopmm.matmul(a, b, out=out, **kw)
    with pytest.raises(error, match=message):
        hopmm.explain(a, b, **kw)
    assert np.isnan(np.asarray(out, np.float32)).all()
    assert SimulatedLaunch.launches == 0


def test_integer_operands_with_an_epilogue_are_refused(simulated_gpu):
    a = fake(np.ones((4, 4), np.int32))
    with pytest.raises(TypeError, match="floating-point"):
        hopmm.matmul(a, a, activation="relu")


# ---- whole calls on the simulated GPU ----

def _reference(a, b, *, bias=None, activation=None, alpha=1.0, beta=0.0, c=None):
    acc = np.matmul(np.asarray(a, np.float32), np.asarray(b, np.float32))
    shapes = api.layout.matmul_shapes(a.shape, b.shape)
    acc = acc.reshape(shapes.batch_shape + (shapes.m, shapes.n))
    c3 = None
    if c is not None and beta != 0:
        c3 = np.asarray(epilogue.c_view(fake(np.asarray(c)), shapes)[0], np.float32)
    y = epilogue.reference(np, acc, bias=None if bias is None else np.asarray(bias, np.float32),
                           activation=activation, alpha=alpha, beta=beta, c=c3)
    return y.reshape(shapes.out_shape)


def _close(got, ref, dtype=BF16):
    got = np.asarray(got, np.float32)
    assert got.shape == ref.shape and not np.isnan(got).any()
    tol = 1e-2 if dtype == BF16 else 2e-3
    assert np.linalg.norm(got - ref) <= tol * max(np.linalg.norm(ref), 1e-30)


CALLS = {
    "relu_bias_n": lambda: ((rand((200, 96)), rand((96, 136))),
                            dict(bias=rand((136,)), activation="relu")),
    "gelu_bias_m_transposed_a": lambda: ((rand((96, 200)).T, rand((96, 136))),
                                         dict(bias=rand((200, 1)), activation="gelu")),
    "alpha_beta_c_full": lambda: ((rand((72, 64)), rand((64, 80))),
                                  dict(c=rand((72, 80)), alpha=0.5, beta=-2.0)),
    "c_row_broadcast_strided_bias": lambda: ((rand((72, 64)), rand((64, 80))),
                                             dict(c=rand((80,)), beta=1.0,
                                                  bias=rand((160,))[::2], activation="silu")),
    "batched_c_over_batch": lambda: ((rand((3, 40, 64)), rand((3, 64, 24))),
                                     dict(c=rand((40, 24)), beta=1.0, bias=rand((24,)),
                                          activation="sigmoid")),
    "c_not_collapsing": lambda: ((rand((2, 3, 40, 64)), rand((64, 24))),
                                 dict(c=rand((2, 1, 40, 24)), beta=1.0)),
    "c_transposed_view": lambda: ((rand((72, 64)), rand((64, 80))),
                                  dict(c=rand((80, 72)).T, beta=0.25, activation="relu")),
    "c_and_bias_at_odd_offsets": lambda: ((rand((72, 64)), rand((64, 80))),
                                          dict(c=rand((72, 81))[:, 1:], beta=1.0,
                                               bias=rand((81,))[1:], activation="gelu")),
    "vector_b": lambda: ((rand((2, 40, 64)), rand((64,))),
                         dict(bias=rand((40, 1)), activation="gelu_tanh")),
    "fp16": lambda: ((rand((72, 64), np.float16), rand((64, 48), np.float16)),
                     dict(bias=rand((48,), np.float16), activation="relu")),
}


@pytest.mark.parametrize("case", CALLS, ids=list(CALLS))
def test_fused_calls_on_the_simulated_gpu(simulated_gpu, case):
    (a, b), kw = CALLS[case]()
    got = hopmm.matmul(a, b, **kw)
    _close(got, _reference(a, b, **kw), a.dtype)
    assert SimulatedLaunch.launches == 1   # one kernel: the chain is fused
    assert SimulatedLaunch.last.epilogue_spec is not None
    assert "epilogue:" in hopmm.explain(a, b, **kw) and "fused into the kernel" in \
        hopmm.explain(a, b, **kw)


def test_out_may_be_c_itself(simulated_gpu):
    a, b = rand((72, 64)), rand((64, 80))
    c = rand((72, 80))
    ref = _reference(a, b, c=c, beta=1.0, bias=None, activation="relu")
    assert hopmm.matmul(a, b, out=c, c=c, beta=1.0, activation="relu") is c
    _close(c, ref)


def test_out_overlapping_c_reads_a_copy(simulated_gpu):
    a, b = rand((64, 64)), rand((64, 64))
    big = rand((64, 65))
    c, out = big[:, :64], big[:, 1:]
    ref = _reference(a, b, c=c, beta=1.0)
    hopmm.matmul(a, b, out=out, c=c, beta=1.0)
    _close(out, ref)


@pytest.mark.parametrize("schedule", ["split_k", "split_k_cluster", "split_k_parallel"])
def test_split_k_applies_the_chain_once(simulated_gpu, schedule):
    hopmm.use_schedule(schedule)
    a, b = rand((64, 2048)), rand((2048, 128))
    kw = dict(bias=rand((128,)), c=rand((64, 128)), beta=1.0, alpha=0.5, activation="relu")
    _close(hopmm.matmul(a, b, **kw), _reference(a, b, **kw))
    assert SimulatedLaunch.last.grid[1] > 1 or schedule == "split_k"


def test_repeats_reuse_launches_with_new_bias_and_c(simulated_gpu, monkeypatch):
    planned = []
    real_plan = api.plan
    monkeypatch.setattr(api, "plan", lambda *args, **kw: planned.append(1) or
                        real_plan(*args, **kw))
    for _ in range(3):
        a, b = rand((80, 64)), rand((64, 48))
        kw = dict(bias=rand((48,)), c=rand((80, 48)), beta=0.5, activation="relu")
        _close(hopmm.matmul(a, b, **kw), _reference(a, b, **kw))
    assert len(planned) == 1 and SimulatedLaunch.launches == 3
    # Another alpha, or no epilogue at all: other keys, planned again, right results.
    kw["alpha"] = 2.0
    _close(hopmm.matmul(a, b, **kw), _reference(a, b, **kw))
    _close(hopmm.matmul(a, b), _reference(a, b))
    assert len(planned) == 3


def test_fused_repeats_run_in_one_direct_call_and_decline_overlaps(simulated_gpu):
    """A repeat of a fused call that read and stored in place is one DirectRepeat run with
    the new bias and c: out may be c itself, while an out over the new bias is declined and
    the full path computes from a copy of it."""
    a, b = rand((64, 64)), rand((64, 80))
    for _ in range(3):   # out is c itself: planned once, then two direct repeats
        c = rand((64, 80))
        kw = dict(bias=rand((80,)), c=c, beta=1.0, activation="relu")
        ref = _reference(a, b, **kw)
        assert hopmm.matmul(a, b, out=c, **kw) is c
        _close(c, ref)
    assert SimulatedDirectRepeat.calls == [True, True]
    big = rand((65, 80))
    out, bias = big[1:], big[10]   # the key's layouts, bias within out's bytes
    kw = dict(bias=bias, c=rand((64, 80)), beta=1.0, activation="relu")
    ref = _reference(a, b, **{**kw, "bias": fake(np.array(bias))})
    hopmm.matmul(a, b, out=out, **kw)
    _close(out, ref)
    assert SimulatedDirectRepeat.calls == [True, True, False]


def test_beta_zero_ignores_c_and_runs_the_plain_kernel(simulated_gpu):
    a, b = rand((64, 64)), rand((64, 64))
    c = fake(np.full((64, 64), np.nan, dtype=BF16))
    _close(hopmm.matmul(a, b, c=c), _reference(a, b))
    assert SimulatedLaunch.last.epilogue_spec is None


@pytest.mark.parametrize("keywords", [dict(alpha=1), dict(beta=float("0")),
                                      dict(alpha=np.float32(1), beta=0, bias=None)])
def test_default_keywords_given_as_other_objects_run_the_plain_kernel(simulated_gpu, keywords):
    """alpha and beta equal to the defaults but not the default objects themselves (an int,
    a float made elsewhere) ask for no epilogue: the plain product (the 10-minute soak of
    v0.23 found such calls raising AttributeError)."""
    a, b = rand((64, 64)), rand((64, 64))
    _close(hopmm.matmul(a, b, **keywords), _reference(a, b))
    assert SimulatedLaunch.last.epilogue_spec is None


def test_other_dtypes_compute_the_chain_with_cupy(simulated_gpu):
    a = fake(np.random.standard_normal((24, 16)).astype(np.float32))
    b = fake(np.random.standard_normal((16, 8)).astype(np.float32))
    bias = fake(np.random.standard_normal(8).astype(np.float32))
    out = fake(np.full((24, 8), np.nan, np.float32))
    assert hopmm.matmul(a, b, out=out, bias=bias, activation="silu") is out
    ref = _reference(a, b, bias=bias, activation="silu")
    assert np.allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)
    assert SimulatedLaunch.launches == 0
    assert "computed with CuPy" in hopmm.explain(a, b, bias=bias, activation="silu")


def test_fused_bench_table_and_arguments():
    """bench/fused.py's pure parts: the table gives each baseline's time over hopmm's and marks
    a wrong result; the defaults time both dtypes at the issue's shapes."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "fused.py"
    spec = importlib.util.spec_from_file_location("fused_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = [{"case": "bias+relu", "shape": "4096x4096x4096", "dtype": "bf16", "hopmm_us": 200.0,
             "rel_err": 1e-3, "ok": True, "torch relu(addmm)": 250.0},
            {"case": "bias+gelu", "shape": "4096x4096x4096", "dtype": "fp16", "hopmm_us": 100.0,
             "rel_err": 1.0, "ok": False, "cupy matmul+ew": 150.0}]
    table = module.format_table(rows).splitlines()
    assert table[2].endswith("| torch relu(addmm) | 250.0 | 1.25x |")
    assert "WRONG" in table[3] and table[3].endswith("| 1.50x |")
    args = module.parse_args([])
    assert args.dtypes == ["bf16", "fp16"] and not args.quick
    assert (4096, 14336, 4096) in module.BIAS_SHAPES and (8192, 8192, 1024) in module.C_SHAPES


def test_a_row_store_that_drops_its_wave_tail_keeps_the_chain(simulated_gpu, monkeypatch):
    """C rows of 60 bytes from B's line copy: the wave tail (split-K, no row store) is dropped
    and stream-K on the narrow tile runs the whole product (heuristics.wave_tail_choice);
    that kernel applies the chain too."""
    for module in (device, launch):
        monkeypatch.setattr(module, "query", lambda device_id: device.H100_SXM_CLUSTERS)
    a, b = rand((17418, 4096)), rand((4096, 30))
    kw = dict(bias=rand((30,)), activation="relu")
    text = hopmm.explain(a, b, **kw)
    assert "schedule: stream_k\n" in text and "the epilogue stores the rows itself" in text
    _close(hopmm.matmul(a, b, **kw), _reference(a, b, **kw))
    assert SimulatedLaunch.last.epilogue_spec is not None
