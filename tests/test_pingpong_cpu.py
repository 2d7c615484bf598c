"""CPU: the ping-pong schedule's shared-memory plan, selection, and the turn-taking as it is
compiled (SASS order of the named-barrier waits and arrivals around the wgmmas)."""
import os
from dataclasses import replace
import re
import subprocess
import sys

import pytest

from hopmm import compile as compiler
from hopmm import heuristics, sass, tuning
from hopmm.device import H100_SXM
from hopmm.problem import Problem
from hopmm.schedules import (C_BOX_BYTES, ELEM_BYTES, MBARRIER_BYTES, MIN_C_BUFFERS,
                             SMEM_ALIGN, KernelConfig, PersistentSchedule, PingPongSchedule)

SMEM = H100_SXM.smem_per_block_optin
CONFIGS = PingPongSchedule.configs(SMEM)
TURN_THREADS = 2 * 128       # the waiting consumer and the passing one
EPILOGUE_THREADS = 128
TURN_BARRIER_OF_CONSUMER_0 = 4   # kBarrierTurnBase: after __syncthreads' 0 and the epilogue's 1-3


def problem(m=8192, n=8192, k=8192, batch=1):
    return Problem(m, n, k, batch, "bfloat16", "k", "n")


def test_every_dtype_and_layout_has_a_128_wide_config():
    assert len(CONFIGS) == 2 * 4
    assert {(c.dtype, c.trans_a, c.trans_b) for c in CONFIGS} == {
        (d, ta, tb) for d in ("bfloat16", "float16") for ta in (False, True)
        for tb in (False, True)}
    assert all(c.block_m == 128 and c.block_n == 128 and c.consumers == 2 for c in CONFIGS)


def test_stages_capped_and_the_whole_tile_staged():
    """Ping-pong is capped at 5 stages (6 measured slower); beside 5 stages each consumer's
    whole 128 x 128 tile (4 staging boxes of 64 x 64) fits, so there is no ring to wrap."""
    cfg = CONFIGS[0]
    assert cfg.stages == PingPongSchedule.stage_cap == 5
    assert PingPongSchedule.max_stages(replace(cfg, c_buffers=MIN_C_BUFFERS), SMEM) == 6
    assert PingPongSchedule.c_boxes(cfg) == cfg.c_buffers == 4
    assert PingPongSchedule.epilogue_bytes(cfg) == 2 * 4 * C_BOX_BYTES
    stage = (cfg.block_m + cfg.block_n) * cfg.block_k * ELEM_BYTES
    assert PingPongSchedule.smem_bytes(cfg) == (cfg.stages * (stage + 2 * MBARRIER_BYTES)
                                                + 2 * 4 * C_BOX_BYTES + SMEM_ALIGN) <= SMEM
    assert PingPongSchedule.smem_note(cfg).startswith("separate epilogue staging, the whole tile")


def test_rendered_config_says_who_owns_which_rows():
    cfg = CONFIGS[0]
    assert "static constexpr int kConsumerRows = 128;" in PingPongSchedule.render(cfg).source
    as_persistent = replace(cfg, c_buffers=PersistentSchedule.c_boxes(cfg))  # 64 x 128 each
    assert "static constexpr int kConsumerRows = 64;" in PersistentSchedule.render(
        as_persistent).source
    assert "hopmm::pingpong_gemm<Config" in PingPongSchedule.render(cfg).source


def test_a_256_wide_tile_is_refused():
    wide = KernelConfig(dtype="bfloat16", block_n=256, stages=2, trans_a=False, trans_b=True)
    with pytest.raises(ValueError, match="block_n must be one of"):
        PingPongSchedule.render(wide)


def test_forced_pingpong_takes_128_wide_tiles_on_a_persistent_grid():
    c = heuristics.choose(problem(), H100_SXM, "pingpong")
    assert c.schedule is PingPongSchedule and c.config.block_n == 128
    assert "pingpong" in c.reason
    assert c.schedule.grid(problem(), c.config, 1, H100_SXM.sm_count) == (H100_SXM.sm_count, 1, 1)
    one = problem(m=100, n=128)
    assert c.schedule.grid(one, c.config, 1, H100_SXM.sm_count) == (1, 1, 1)
    batched = problem(m=300, n=260, batch=7)   # 3 x 3 tiles per slice
    assert c.schedule.grid(batched, c.config, 7, H100_SXM.sm_count) == (63, 1, 1)


def test_pingpong_is_never_the_default():
    """Measured slower than the persistent kernels (bench/NOTES.md v0.5, v0.6): selectable and
    an autotune candidate only."""
    for m, n, k in [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 8192, 1024), (512, 512, 512)]:
        c = heuristics.choose(problem(m, n, k), H100_SXM)
        assert c.schedule is not PingPongSchedule
        assert issubclass(c.schedule, PersistentSchedule)


def test_an_autotuned_pingpong_entry_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("HOPMM_CACHE_DIR", str(tmp_path))
    p = problem(4096, 4096, 4096)
    tuning.record({tuning.problem_key(p, H100_SXM): tuning.TunedEntry(
        "pingpong", 128, 4, 8, 700.0, "2026-11-22")})
    choice = tuning.lookup(p, H100_SXM)
    assert choice.schedule is PingPongSchedule and choice.config.stages == 4
    tuning.record({tuning.problem_key(p, H100_SXM): tuning.TunedEntry(
        "pingpong", 256, 2, 8, 700.0, "2026-11-22")})
    assert tuning.lookup(p, H100_SXM) is None     # not a ping-pong width


def test_selectable_through_the_environment():
    code = "import hopmm.api as api; print(api._schedule_override)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "HOPMM_SCHEDULE": "pingpong"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "pingpong"


# -- the compiled turn-taking ---------------------------------------------------------------

# BAR.SYNC / BAR.ARV id[, thread count]; without a count (__syncthreads) the whole CTA.
_BAR = re.compile(r"\bBAR\.(SYNC|ARV)\S*\s+([^,;\s]+)(?:,\s*(0x[0-9a-f]+))?")
_HGMMA = re.compile(r"\bHGMMA\.")
_FLUSH = re.compile(r"\bWARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b")


@pytest.fixture(scope="module", params=CONFIGS, ids=[c.tag for c in CONFIGS])
def listing(request, kernel_matrix):
    tool = sass.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    kernel = compiler.compile_kernel(PingPongSchedule.render(request.param))
    return sass.cached_listing(kernel.cubin_path, tool).splitlines()


def _where(lines, pattern):
    return [i for i, line in enumerate(lines) if pattern.search(line)]


def test_named_barriers_have_matching_thread_counts(listing):
    """Turn barriers count both consumers (256 threads) on both sides, epilogue barriers one
    warpgroup (128); nothing else but __syncthreads uses a barrier."""
    counts = {}
    for line in listing:
        m = _BAR.search(line)
        if m:
            threads = int(m.group(3), 16) if m.group(3) else "cta"
            counts.setdefault(threads, set()).add(m.group(1))
    assert counts == {"cta": {"SYNC"}, TURN_THREADS: {"SYNC", "ARV"},
                      EPILOGUE_THREADS: {"SYNC"}}


def test_turns_surround_the_main_loop(listing):
    """Consumer 1 hands over the first turn before any wgmma; a consumer waits for its turn
    before its first wgmma and passes it after its last commit but before its wait_group 0
    flush, so its flush and epilogue overlap the other consumer's wgmmas."""
    turn = [i for i in _where(listing, _BAR)
            if _BAR.search(listing[i]).group(3) == hex(TURN_THREADS)]
    waits = [i for i in turn if "BAR.SYNC" in listing[i]]
    arrives = [i for i in turn if "BAR.ARV" in listing[i]]
    hgmma, flush = _where(listing, _HGMMA), _where(listing, _FLUSH)
    assert len(waits) == 1 and len(arrives) == 2 and len(flush) == 1
    hand_over, pass_turn = arrives
    assert hand_over < waits[0] < hgmma[0]
    assert hgmma[-1] < pass_turn < flush[0]
    assert f"{hex(TURN_BARRIER_OF_CONSUMER_0)}," in listing[hand_over]
