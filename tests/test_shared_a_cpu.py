"""CPU: matmul_shared_a and swiglu. The shared-A kernels (kernel_dual_b.cuh) render with a
stage of A and two Bs and compile for sm_90a without spills, both products' wgmmas in one
group; the arguments are validated (for every B) before anything runs; and whole calls run on
the simulated GPU of test_cpu_simulated_launch, composed and on the forced one-kernel path,
whose stand-in reads the second B and C through the maps and addresses the real kernel gets."""
from dataclasses import replace

import numpy as np
import pytest

import hopmm
from hopmm import compile as compiler, epilogue, fastpath, sass
from hopmm.device import H100_SXM
from hopmm.epilogue import EpilogueSpec
from hopmm.schedules import (DUAL_B_SCHEDULES, ELEM_BYTES, SharedASchedule, SwigluSchedule,
                             TMA_BOX_ELEMS)
from test_cpu_simulated_launch import BF16, SimulatedLaunch, fake, rand, simulated_gpu  # noqa: F401

KERNEL_STEPS = TMA_BOX_ELEMS // 16  # wgmma k16 steps of one k-block


def _config(sched, dtype="bfloat16", trans_b=False):
    return next(c for c in sched.configs(H100_SXM.smem_per_block_optin)
                if c.dtype == dtype and not c.trans_a and c.trans_b == trans_b)


@pytest.mark.parametrize("name", sorted(DUAL_B_SCHEDULES))
def test_a_stage_holds_a_and_both_bs(name):
    sched = DUAL_B_SCHEDULES[name]
    cfg = _config(sched)
    assert sched.stage_bytes(cfg) == (cfg.block_m + 2 * cfg.block_n) * cfg.block_k * ELEM_BYTES
    assert sched.stage_load_bytes(cfg) == sched.stage_bytes(cfg)
    assert sched.smem_bytes(cfg) <= H100_SXM.smem_per_block_optin and cfg.stages >= 4
    src = sched.render(cfg).source
    assert "kBOperands = 2;" in src and f"kDualStore = {sched.dual_store};" in src
    # The consumers keep two 64 x 128 sets and still fetch a whole box of operands at once.
    assert sched.epilogue_fetches_boxes(cfg) and "kAccumulatorSets = 2;" in src
    # The plain schedules render one B per stage.
    assert "kBOperands = 1;" in hopmm.schedules.PersistentSchedule.render(
        replace(cfg, stages=4)).source


@pytest.mark.parametrize("name", sorted(DUAL_B_SCHEDULES))
@pytest.mark.parametrize("m,block_m", [(1, 64), (16, 64), (64, 64), (65, 128), (4096, 128)])
def test_few_rows_take_the_64_row_tile(name, m, block_m):
    """At most SHORT_TILE_MAX_M rows: one consumer on a 64-row tile computes no row past M and
    puts twice the CTAs to streaming the Bs; its two sets fit that consumer's registers."""
    from hopmm import heuristics
    from hopmm.problem import Problem

    sched = DUAL_B_SCHEDULES[name]
    c = heuristics.dual_b_choice(sched, Problem(m, 14336, 4096, 1, "bfloat16"), H100_SXM)
    assert (c.config.block_m, c.config.block_n) == (block_m, 128)
    assert c.config.consumers == block_m // 64 and c.config.stages >= 4
    assert sched.smem_bytes(c.config) <= H100_SXM.smem_per_block_optin
    assert "1 warpgroup computes each" in sched.consumer_roles(c.config) or block_m == 128


def test_swiglu_has_no_other_epilogue_and_shared_a_an_activation_only():
    with pytest.raises(ValueError, match="swiglu"):
        SwigluSchedule.render(replace(_config(SwigluSchedule), epilogue=EpilogueSpec("relu")))
    shared = _config(SharedASchedule)
    for spec in (EpilogueSpec("relu", bias=True), EpilogueSpec(None, c=True)):
        with pytest.raises(ValueError, match="activation only"):
            SharedASchedule.render(replace(shared, epilogue=spec))
    assert "kActivation = 1;" in SharedASchedule.render(
        replace(shared, epilogue=EpilogueSpec("relu"))).source


@pytest.mark.parametrize("name, spec, trans_b", [("swiglu", None, True),
                                                 ("swiglu", None, False),
                                                 ("shared_a", None, True),
                                                 ("shared_a", EpilogueSpec("gelu_tanh"), False),
                                                 ("shared_a", EpilogueSpec("gelu"), True)])
def test_one_group_of_wgmmas_per_k_block_and_no_spills(name, spec, trans_b):
    sched = DUAL_B_SCHEDULES[name]
    cfg = replace(_config(sched, "float16", trans_b=trans_b), epilogue=spec)
    kernel = compiler.compile_kernel(sched.render(cfg))
    r = kernel.report
    assert r.spill_stores == r.spill_loads == r.stack_frame == 0, kernel.name
    assert not any("C7510" in w for w in r.warnings), r.warnings   # no serialized wgmma
    tool = sass.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    listing = sass.disassemble(kernel.cubin_path, tool)
    hgmma = [line for line in listing.splitlines() if "HGMMA." in line]
    # A k-block: per k16 step one m64n256k16 wgmma that reads both B tiles (side by side in
    # the stage), and a single wait token (gsb0) on its last: both products in one commit
    # group. ptxas may unroll the k-block loop, so the listing holds whole k-blocks of these.
    assert hgmma and len(hgmma) % KERNEL_STEPS == 0
    assert all("64x256x16.F32" in line for line in hgmma)
    assert [("gsb0" in line) for line in hgmma] == (
        [False] * (KERNEL_STEPS - 1) + [True]) * (len(hgmma) // KERNEL_STEPS)
    assert sass.summarize(kernel.cubin_path, tool).counts["local_memory"] == 0


# ---- validation: nothing runs ----

BAD_SHARED_A = {
    "bs_not_a_list": (lambda a, b: dict(bs=b), TypeError, "bs must be a list"),
    "bs_empty": (lambda a, b: dict(bs=[]), ValueError, "bs is empty"),
    "b_shape": (lambda a, b: dict(bs=[b, rand((40, 48))]), ValueError, r"bs\[1\]"),
    "b_numpy": (lambda a, b: dict(bs=[b, np.ones((32, 48), BF16)]), TypeError, r"bs\[1\]"),
    "b_dtype": (lambda a, b: dict(bs=[rand((32, 48), np.float16)]), TypeError, "bs\\[0\\]"),
    "bias_count": (lambda a, b: dict(bs=[b, b], bias=[None]), ValueError,
                   "bias has 1 entries for 2 Bs"),
    "bias_not_a_list": (lambda a, b: dict(bs=[b], bias=rand((48,))), TypeError,
                        "bias must be a list"),
    "bias_shape": (lambda a, b: dict(bs=[b, b], bias=[None, rand((47,))]), ValueError,
                   r"bs\[1\]: .*bias has shape"),
    "activation": (lambda a, b: dict(bs=[b], activation="tanh"), ValueError,
                   "unknown activation"),
}


@pytest.mark.parametrize("case", BAD_SHARED_A, ids=list(BAD_SHARED_A))
def test_bad_shared_a_arguments_raise_before_any_launch(simulated_gpu, case):
    make, error, message = BAD_SHARED_A[case]
    a, b = rand((64, 32)), rand((32, 48))
    with pytest.raises(error, match=message):
        hopmm.matmul_shared_a(a, **make(a, b))
    assert SimulatedLaunch.launches == 0


@pytest.mark.parametrize("w_gate, w_up, error, message", [
    ((32, 48), (32, 40), ValueError, "one shape"),
    ((32, 48), (31, 48), ValueError, "w_up"),
    ((16, 48), (16, 48), ValueError, "w_gate"),
])
def test_bad_swiglu_arguments_raise_before_any_launch(simulated_gpu, w_gate, w_up, error,
                                                      message):
    with pytest.raises(error, match=message):
        hopmm.swiglu(rand((64, 32)), rand(w_gate), rand(w_up))
    assert SimulatedLaunch.launches == 0


def test_a_shared_a_schedule_is_forced_on_its_own_calls_only(simulated_gpu):
    """Forcing shared_a or swiglu leaves matmul to the heuristic (matmul_shared_a's products
    that its kernel cannot take are matmul calls); the heuristic itself refuses them."""
    a, b = rand((64, 32)), rand((32, 48))
    for name in DUAL_B_SCHEDULES:
        hopmm.use_schedule(name)
        _close(hopmm.matmul(a, b), _f32(a) @ _f32(b))
        assert f"schedule: {name}" not in hopmm.explain(a, b)
        with pytest.raises(ValueError, match="not hopmm.matmul"):
            hopmm.heuristics.choose(hopmm.Problem(64, 48, 32, 1, "bfloat16"), H100_SXM, name)


# ---- the one kernel or the composed path: heuristics.dual_b_pays ----

def _pays(sched, m, n, k, batch=1):
    return hopmm.heuristics.dual_b_pays(sched, hopmm.Problem(m, n, k, batch, "bfloat16"),
                                        H100_SXM)


@pytest.mark.parametrize("sched, pays", [(SwigluSchedule, True), (SharedASchedule, False)])
def test_compute_bound_products_weigh_the_saved_passes_against_the_tile(sched, pays):
    """4096 rows: the dual 128 x 128 tile does a 128 x 256 tile's work at its speed; swiglu
    saves two products' passes and the gating pass, matmul_shared_a only A's second read,
    less than the plain schedules' better waves."""
    from hopmm import heuristics

    got, why = _pays(sched, 4096, 14336, 4096)
    assert got is pays and sched.name in why
    problem = hopmm.Problem(4096, 14336, 4096, 1, "bfloat16")
    assert heuristics.dual_b_choice(sched, problem, H100_SXM).config.block_m == 128


@pytest.mark.parametrize("sched", [SwigluSchedule, SharedASchedule])
@pytest.mark.parametrize("m", [1, 16, 64])
def test_few_rows_over_many_columns_take_the_one_kernel(sched, m):
    """Decode rows: both products stream their Bs from DRAM either way; the one kernel's 112
    tiles of 64 x 128 stream both in one wave and save a launch, a tail (and swiglu's gating
    pass)."""
    from hopmm import heuristics

    got, why = _pays(sched, m, 14336, 4096)
    assert got and why.endswith("one kernel")
    problem = hopmm.Problem(m, 14336, 4096, 1, "bfloat16")
    assert heuristics.dual_b_choice(sched, problem, H100_SXM).config.block_m == 64
    assert heuristics._dual_b_us(sched, problem, H100_SXM) < \
        heuristics._composed_us(sched, problem, H100_SXM)


@pytest.mark.parametrize("m,n,k", [(73, 2752, 13632), (103, 1280, 8384), (2, 1152, 14080)])
def test_few_tiles_over_a_long_k_stay_composed(m, n, k):
    """The one kernel cannot split K: 9-22 tiles walk every k-block alone, where the composed
    products split K over the SMs (NOTES v0.48: 0.58-0.85 x the composed time)."""
    for sched in DUAL_B_SCHEDULES.values():
        got, why = _pays(sched, m, n, k)
        assert not got and "composed" in why.rsplit(":", 1)[1]


def test_small_products_are_paced_by_the_host():
    """GPU time under the repeats' host time: the one kernel's one repeat beats the composed
    path's two products and gating pass."""
    from hopmm import heuristics

    got, why = _pays(SwigluSchedule, 32, 1152, 1152)
    assert got
    assert f"composed {heuristics.COMPOSED_HOST_US['swiglu']:.1f} us" in why


def test_more_rows_and_k_blocks_move_the_choice_the_right_way():
    from hopmm import heuristics

    # Many tiles: the one kernel; a batch scales both sides alike.
    assert _pays(SwigluSchedule, 2048, 4096, 4096)[0]
    assert _pays(SwigluSchedule, 2048, 4096, 4096, batch=8)[0]
    # Few rows: a longer K over the same few tiles tips it to the composed splits.
    p = [hopmm.Problem(48, 2048, k, 1, "bfloat16") for k in (2048, 32768)]
    ratio = [heuristics._dual_b_us(SwigluSchedule, x, H100_SXM)
             / heuristics._composed_us(SwigluSchedule, x, H100_SXM) for x in p]
    assert ratio[1] > ratio[0]
    assert not _pays(SwigluSchedule, 48, 2048, 32768)[0]


def test_unforced_swiglu_takes_the_one_kernel_where_it_pays(simulated_gpu):
    m, n, k = 2048, 2560, 4096   # 4.7 ridge points, ~107 us of compute
    a, g, u = rand((m, k)), rand((k, n)), rand((k, n))
    assert _pays(SwigluSchedule, m, n, k)[0]
    y = hopmm.swiglu(a, g, u)
    assert SimulatedLaunch.launches == 1
    _close(y, _silu(_f32(a) @ _f32(g)) * (_f32(a) @ _f32(u)))
    # Forcing another schedule keeps the composed path.
    SimulatedLaunch.launches = 0
    hopmm.use_schedule("persistent")
    hopmm.swiglu(a, g, u)
    assert SimulatedLaunch.launches == 2


# ---- whole calls on the simulated GPU ----

def _f32(x):
    return np.asarray(x, np.float32)


def _close(got, ref, tol=2e-2):
    got = _f32(got)
    assert got.shape == ref.shape and not np.isnan(got).any()
    assert np.linalg.norm(got - ref) <= tol * max(np.linalg.norm(ref), 1e-30)


def _silu(x):
    return epilogue.activate(np, x, "silu")


LAYOUTS = {
    "row_major": lambda: (rand((200, 96)), rand((96, 136)), rand((96, 136))),
    "b_transposed": lambda: (rand((200, 96)), rand((136, 96)).T, rand((136, 96)).T),
    "a_transposed": lambda: (rand((96, 200)).T, rand((96, 136)), rand((96, 136))),
    "batched_b_broadcast": lambda: (rand((3, 40, 64)), rand((64, 24)), rand((64, 24))),
    "vector_a": lambda: (rand((64,)), rand((64, 72)), rand((64, 72))),
    "both_misaligned": lambda: (rand((64, 64)), rand((64, 130))[:, 1:129],
                                rand((64, 130))[:, 1:129]),
}


@pytest.mark.parametrize("forced", [False, True])
@pytest.mark.parametrize("case", LAYOUTS, ids=list(LAYOUTS))
def test_swiglu(simulated_gpu, case, forced):
    a, g, u = LAYOUTS[case]()
    if forced:
        hopmm.use_schedule("swiglu")
    y = hopmm.swiglu(a, g, u)
    _close(y, _silu(_f32(a) @ _f32(g)) * (_f32(a) @ _f32(u)))
    assert y.dtype == BF16
    # The one kernel computes both products and their gating in one launch: forced, or by
    # itself on these small products, whose repeats the host paces (dual_b_pays).
    assert SimulatedLaunch.launches == 1


@pytest.mark.parametrize("forced", [False, True])
@pytest.mark.parametrize("case", LAYOUTS, ids=list(LAYOUTS))
def test_shared_a_pair(simulated_gpu, case, forced):
    a, b0, b1 = LAYOUTS[case]()
    if forced:
        hopmm.use_schedule("shared_a")
    y0, y1 = hopmm.matmul_shared_a(a, [b0, b1], activation="gelu_tanh")
    for y, b in ((y0, b0), (y1, b1)):
        _close(y, epilogue.activate(np, _f32(a) @ _f32(b), "gelu_tanh"))
    assert SimulatedLaunch.launches == 1


def test_shared_a_with_three_bs_and_biases(simulated_gpu):
    """Three Bs: a pair shares one launch where forced, the third runs alone; a bias keeps
    its product off the shared kernel."""
    a = rand((100, 64))
    bs = [rand((64, 48)), rand((64, 48)), rand((64, 48))]
    biases = [None, None, rand((48,))]
    hopmm.use_schedule("shared_a")
    ys = hopmm.matmul_shared_a(a, bs, bias=biases, activation="relu")
    assert SimulatedLaunch.launches == 2
    for y, b, bias in zip(ys, bs, biases):
        acc = _f32(a) @ _f32(b) + (0 if bias is None else _f32(bias))
        _close(y, np.maximum(acc, 0))
    SimulatedLaunch.launches = 0
    hopmm.matmul_shared_a(a, bs[:2], bias=[bs[0][0], None])   # a bias: composed
    assert SimulatedLaunch.launches == 2


def test_repeated_calls_reuse_their_plans_and_still_validate(simulated_gpu, monkeypatch):
    """A repeated call skips planning (api.plan) but not its checks: new shapes, a bad B, a
    forced schedule each plan again, and results stay right."""
    from hopmm import api, shared_a

    shared_a._plans.clear()
    shared_a._dual_launches.clear()
    planned = []
    plan = api.plan
    monkeypatch.setattr(api, "plan", lambda *a, **k: planned.append(1) or plan(*a, **k))
    a, g, u = rand((16, 64)), rand((64, 128)), rand((64, 128))
    ref = _silu(_f32(a) @ _f32(g)) * (_f32(a) @ _f32(u))
    for _ in range(3):
        _close(hopmm.swiglu(a, g, u), ref)
    # One plan on the first call only: the Bs' layouts are one key, and the one kernel
    # (dual_b_pays: a small product) runs both products.
    assert len(planned) == 1 and len(shared_a._dual_launches) == 1
    hopmm.swiglu(a, rand((64, 128)), rand((64, 128)))   # new arrays, same layout: remembered
    assert len(planned) == 1
    hopmm.swiglu(a, rand((64, 136)), rand((64, 136)))   # new shapes: planned
    assert len(planned) == 2
    fastpath.clear()                               # as autotune does: choices may have moved
    hopmm.swiglu(a, g, u)
    assert len(planned) == 3
    with pytest.raises(ValueError, match="w_up"):
        hopmm.swiglu(a, g, rand((32, 128)))
    hopmm.use_schedule("swiglu")                   # a forced schedule plans again
    _close(hopmm.swiglu(a, g, u), ref)
    assert len(planned) > 3 and SimulatedLaunch.launches >= 1
    # Remembered plans hold no bias array.
    hopmm.use_schedule(None)
    hopmm.matmul_shared_a(a, [g, u], bias=[rand((128,)), None])
    assert all(p.epilogue is None for p in shared_a._plans.values())


def test_a_second_b_of_the_same_layout_shares_the_first_ones_key(simulated_gpu):
    """_check reuses a B's plan key for the next B where _same_key_layout says their keys
    are equal: it must say so exactly where fastpath.fused_key's keys are."""
    from hopmm import shared_a

    a = rand((16, 64))
    base = rand((64, 130))
    first = base[:, :128]
    others = [rand((64, 130))[:, :128],                       # same layout, another array
              rand((64, 128)),                                # other strides
              base[:, 1:129],                                 # off 16 bytes
              fake(np.asarray(rand((64, 130))[:, :128], np.float16)),   # other dtype
              rand((64, 120))]                                # other shape
    for other in others:
        same = shared_a._plan_key(a, first, None, None) == shared_a._plan_key(a, other, None, None)
        assert shared_a._same_key_layout(other, first) is same
    assert shared_a._same_key_layout(others[0], first)


def test_repeats_launch_the_remembered_one_kernel_on_new_operands(simulated_gpu, monkeypatch):
    """A repeat of the one kernel builds nothing: its remembered launches take the new
    operands' and results' addresses (the stand-in reads them through the maps it was built
    with). Operands it reads from copies are never remembered."""
    from hopmm import launch, shared_a

    shared_a._dual_launches.clear()
    builds = []
    build = launch.build_launches
    monkeypatch.setattr(launch, "build_launches",
                        lambda *a, **k: builds.append(1) or build(*a, **k))
    for _ in range(3):
        a, g, u = rand((16, 64)), rand((64, 128)), rand((64, 128))
        _close(hopmm.swiglu(a, g, u), _silu(_f32(a) @ _f32(g)) * (_f32(a) @ _f32(u)))
        y0, y1 = hopmm.matmul_shared_a(a, [g, u], activation="relu")
        _close(y0, epilogue.activate(np, _f32(a) @ _f32(g), "relu"))
        _close(y1, epilogue.activate(np, _f32(a) @ _f32(u), "relu"))
    assert len(builds) == 2 and len(shared_a._dual_launches) == 2
    # Bs whose rows start off 16 bytes are read from aligned copies: built on every call.
    builds.clear()
    for _ in range(2):
        a = rand((16, 64))
        g, u = rand((64, 130))[:, 1:129], rand((64, 130))[:, 1:129]
        _close(hopmm.swiglu(a, g, u), _silu(_f32(a) @ _f32(g)) * (_f32(a) @ _f32(u)))
    assert len(builds) == 2 and len(shared_a._dual_launches) == 2


def test_products_the_model_composes_run_as_two(simulated_gpu):
    """Few tiles over a long K: the composed path's two products, whose splits fill the SMs
    (dual_b_pays), and the gating pass."""
    a, g, u = rand((2, 14080)), rand((14080, 1152)), rand((14080, 1152))
    assert not _pays(SwigluSchedule, 2, 1152, 14080)[0]
    _close(hopmm.swiglu(a, g, u), _silu(_f32(a) @ _f32(g)) * (_f32(a) @ _f32(u)))
    assert SimulatedLaunch.launches >= 2


def test_a_composed_repeat_does_not_ask_the_model_again(simulated_gpu, monkeypatch):
    """A pair the model composed is remembered as composed under its key: its repeats (new
    arrays of the same layout) skip _one_kernel and stay right; a new layout, a forced
    schedule or fastpath.clear() ask again."""
    from hopmm import shared_a

    shared_a._composed.clear()
    asked = []
    one_kernel = shared_a._one_kernel
    monkeypatch.setattr(shared_a, "_one_kernel",
                        lambda *a, **k: asked.append(1) or one_kernel(*a, **k))

    def operands(n=1152):
        return rand((2, 14080)), rand((14080, n)), rand((14080, n))

    for _ in range(3):   # few tiles over a long K: composed (as the test above)
        a, g, u = operands()
        _close(hopmm.swiglu(a, g, u), _silu(_f32(a) @ _f32(g)) * (_f32(a) @ _f32(u)))
        y0, y1 = hopmm.matmul_shared_a(a, [g, u])
        _close(y0, _f32(a) @ _f32(g))
        _close(y1, _f32(a) @ _f32(u))
    assert len(asked) == 2 and len(shared_a._composed) == 2
    hopmm.swiglu(*operands(1024))                  # another layout
    assert len(asked) == 3
    fastpath.clear()                               # choices may have moved
    hopmm.swiglu(*operands())
    assert len(asked) == 4
    hopmm.use_schedule("swiglu")                   # forced: one kernel, not the memo
    try:
        SimulatedLaunch.launches = 0
        a, g, u = operands()
        _close(hopmm.swiglu(a, g, u), _silu(_f32(a) @ _f32(g)) * (_f32(a) @ _f32(u)))
        assert len(asked) == 5 and SimulatedLaunch.launches == 1
    finally:
        hopmm.use_schedule(None)


def test_bs_of_different_layouts_are_composed(simulated_gpu):
    a = rand((64, 64))
    b0, b1 = rand((64, 128)), rand((128, 64)).T
    hopmm.use_schedule("shared_a")
    y0, y1 = hopmm.matmul_shared_a(a, (b0, b1))
    assert SimulatedLaunch.launches == 2
    _close(y0, _f32(a) @ _f32(b0))
    _close(y1, _f32(a) @ _f32(b1))


def test_one_b_is_one_matmul(simulated_gpu):
    a, b = rand((64, 32)), rand((32, 48))
    (y,) = hopmm.matmul_shared_a(a, [b])
    _close(y, _f32(a) @ _f32(b))
    assert SimulatedLaunch.launches == 1


def _cuda_include() -> str | None:
    """The CUDA toolkit's include directory (cuda_fp16.h), where one is installed."""
    import glob
    import os

    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    roots += sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    return next((os.path.join(r, "include") for r in roots
                 if r and os.path.isfile(os.path.join(r, "include", "cuda_fp16.h"))), None)


def test_the_composed_gating_compiles_for_cupys_16_bit_types():
    """swiglu's composed path gates through a cupy.ElementwiseKernel: its operation, as CuPy
    instantiates it for float16, bfloat16 and float32, compiles for sm_90a."""
    import os

    import cupy

    from hopmm import nvrtc
    from hopmm.shared_a import GATED_PRODUCT

    cuda_include = _cuda_include()
    if cuda_include is None:
        pytest.skip("no CUDA toolkit headers (cuda_fp16.h) to compile CuPy's types with")
    kernels = "\n".join(
        f'extern "C" __global__ void k_{t}(const {t}* g, const {t}* u, {t}* out) '
        f'{{ gated(g[threadIdx.x], u[threadIdx.x], out[threadIdx.x]); }}'
        for t in ("float16", "bfloat16", "float"))
    source = ("#include <cupy/float16.cuh>\n#include <cupy/bfloat16.cuh>\n"
              "template <class T> __device__ void gated(const T& gate, const T& up, T& y) "
              f"{{ {GATED_PRODUCT}; }}\n{kernels}\n")
    include = os.path.join(os.path.dirname(cupy.__file__), "_core", "include")
    result = nvrtc.compile_cubin(source, "gated_product",
                                 ("--gpu-architecture=sm_90a", f"-I{include}",
                                  f"-I{cuda_include}", "-std=c++17"))
    assert result.cubin


def test_a_launch_takes_the_shared_a_kernels_five_maps():
    """A, B, C, the second B and the second C: five tensor maps, parsed without a driver."""
    from hopmm import _tensormap, launch

    a = fake(np.zeros((256, 128), BF16))
    template = launch._map_template(launch.matrix_spec(a.reshape(1, 256, 128), "cols", 64))
    five = _tensormap.KernelLaunch(0, (1, 1, 1), 384, 0, [template] * 5, [1, 2], 2, False,
                                   (1, 1, 1))
    # One base address per map, then the pointers: 7, checked before anything is launched.
    with pytest.raises(ValueError, match="one base address per tensor map, then 2 pointer"):
        five.launch(0, *range(1, 7))
    with pytest.raises(ValueError, match="at most 20 tensor maps"):
        _tensormap.KernelLaunch(0, (1, 1, 1), 384, 0, [template] * 21, [], 0, False, (1, 1, 1))
