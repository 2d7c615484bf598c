"""CPU: every registered schedule x config renders, compiles for sm_90a through NVRTC and
keeps its resource promises; the cubin cache can never serve a stale kernel."""
from dataclasses import replace

import pytest

from hopmm import compile as compiler
from hopmm import render, report, sass
from hopmm.device import H100_SXM
from hopmm.schedules import BLOCK_M, TALL_BLOCK_M, is_phased

CASES = report.kernel_matrix(H100_SXM)
IDS = [sched.kernel_name(cfg) for sched, cfg in CASES]
REGISTER_FILE = 65536


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def compiled(request, kernel_matrix):
    sched, cfg = request.param
    return sched, cfg, compiler.compile_kernel(sched.render(cfg))


def cuobjdump() -> str:
    tool = sass.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    return tool


def sass_summary(kernel) -> sass.SassSummary:
    """The opcode counts of the kernel's SASS listing (read once per session into the kernel
    cache, counted once per process)."""
    return sass.cached_summary(kernel.cubin_path, cuobjdump())


def test_resources(compiled):
    sched, cfg, kernel = compiled
    r = kernel.report
    assert r.spill_stores == r.spill_loads == r.stack_frame == 0, kernel.name
    assert sched.smem_bytes(cfg) <= H100_SXM.smem_per_block_optin
    assert r.problems(sched.smem_bytes(cfg), H100_SXM.smem_per_block_optin) == []
    # setmaxnreg needs a register cap at entry: 65536 / threads, rounded down to its step of
    # 8 (384 threads: 168; 512: 128).
    assert r.registers <= REGISTER_FILE // sched.threads(cfg) // 8 * 8


def test_sass(compiled):
    sched, _, kernel = compiled
    s = sass_summary(kernel)
    assert s.arch == "sm_90a"
    assert s.counts["hgmma"] > 0 and s.counts["tma_load"] > 0 and s.counts["tma_store"] > 0
    # The split-K reductions stage rows they added up from fp32 partials (st.shared), not
    # accumulator fragments.
    assert (s.counts["stmatrix"] > 0) == sched.fragment_epilogue
    assert s.counts["setmaxnreg"] == 2
    assert s.counts["local_memory"] == 0


def test_no_global_access_before_the_dependency_wait(compiled):
    """Launches are programmatic (launch.programmatic_launch): a kernel may be running while
    the previous kernel of its stream finishes, so nothing may read or write global memory
    before griddepcontrol.wait. No kernel lets the next one be scheduled before its CTAs
    exit: an earlier trigger slowed grids of 68-107 CTAs (ptx.cuh, NOTES v0.64)."""
    _, _, kernel = compiled
    s = sass_summary(kernel)
    assert s.counts["dependency_wait"] == 1 and s.counts["launch_dependents"] == 0
    listing = sass.cached_listing(kernel.cubin_path, cuobjdump())
    assert sass.global_access_before_dependency_wait(listing) == []


def test_global_access_check_sees_an_early_load():
    listing = ("        /*0010*/                   LDG.E R2, desc[UR4][R2.64] ;\n"
               "        /*0018*/              @!P1 SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [R12+URZ] ;\n"
               "        /*0020*/                   ACQBULK ;\n"
               "        /*0030*/               @P0 UTMALDG.3D [UR8], [UR4] ;\n")
    assert sass.global_access_before_dependency_wait(listing) == [
        "/*0010*/                   LDG.E R2, desc[UR4][R2.64] ;"]
    assert sass.global_access_before_dependency_wait(listing.replace("ACQBULK", "NOP")) == [
        "/*0010*/                   LDG.E R2, desc[UR4][R2.64] ;",
        "/*0030*/               @P0 UTMALDG.3D [UR8], [UR4] ;"]


def test_cluster_sass(compiled):
    """A cluster kernel multicasts its shared operand (UTMALDG.MULTICAST), arrives on its
    peer's empty barriers and meets its peer at two cluster barriers (after the mbarrier init,
    before exit); split_k_cluster meets its peers at two barriers from each warpgroup's code
    and does neither of the others; the other kernels do none of that."""
    from hopmm.report import CLUSTER_BARRIERS, LAUNCH_CLUSTER_BARRIERS, cluster_problems

    sched, _, kernel = compiled
    s = sass_summary(kernel)
    assert cluster_problems(sched, s) == []
    if sched.cluster_size > 1:
        assert s.counts["tma_multicast"] > 0 and s.counts["remote_arrive"] > 0
        assert s.counts["cluster_barrier"] == 2 * CLUSTER_BARRIERS
        # A is still loaded by each CTA on its own.
        assert s.counts["tma_load"] > s.counts["tma_multicast"]
    if sched.cluster_at_launch:
        # The producer's and the consumers' arrives and waits, inlined apart.
        assert s.counts["cluster_barrier"] >= 2 * 2 * LAUNCH_CLUSTER_BARRIERS
        assert s.counts["tma_multicast"] == 0 and s.counts["remote_arrive"] == 0
    elif sched.cluster_size == 1:
        assert s.counts["cluster_barrier"] == 0


def test_pipeline_structure(compiled):
    """Seed 000: one commit per k-block and a single wait_group 0 flush; seed 004: the proxy
    fence sits in straight-line code before the epilogue barrier."""
    sched, cfg, _ = compiled
    src = sched.render(cfg).source
    consumer = src[src.index("struct WgmmaConsumer"):src.index("// ---- epilogue_tma_store.cuh")]
    assert consumer.count("wgmma_commit_group();") == 1
    assert consumer.count("wgmma_wait_group<1>();") == 1
    assert consumer.count("wgmma_wait_group<0>();") == 1
    epilogue = src[src.index("static void store_boxes("):]
    body = epilogue[:epilogue.index("tma_store_3d(")]
    fence, stage = body.index("fence_proxy_async_smem();"), body.index("stage_box<BOX>(acc")
    assert stage < fence < body.rindex("named_barrier_sync(")

    def indent(i):
        return i - body.rindex("\n", 0, i) - 1

    assert indent(fence) == indent(stage), "the fence must not sit under a predicate"


def test_cluster_reduction_structure():
    """split_k_cluster: the partial is staged before the release arrive that publishes it
    (the only cluster-scope release), the peers are read after the wait; seed 004: the fence
    before the TMA store runs in every thread, unconditionally, before the barrier."""
    from hopmm.schedules import SplitKClusterSchedule as Sched

    cfg = Sched.configs(H100_SXM.smem_per_block_optin)[0]
    src = Sched.render(cfg).source
    body = src[src.index("static void store(", src.index("struct SplitKClusterEpilogue")):]
    body = body[:body.index("static void finish(")]
    order = [body.index(x) for x in ("Partial::stage(", "cluster_arrive();", "cluster_wait();",
                                     "reduce_group(", "cluster_arrive_relaxed();",
                                     "fence_proxy_async_smem();", "named_barrier_sync(",
                                     "Groups::store(")]   # ReducedGroups: the TMA stores
    assert order == sorted(order)
    assert body.count("cluster_arrive();") == 1
    fence = body.index("fence_proxy_async_smem();")
    line_start = body.rindex("\n", 0, fence) + 1
    assert body[line_start:fence].strip() == "", "the fence must not sit under a predicate"
    assert body[line_start:fence] == " " * 8, "the fence sits at the function's top level"


def test_rendered_source_names_snippet_hashes():
    sched, cfg = CASES[0]
    kernel = sched.render(cfg)
    for name, digest in kernel.snippet_hashes.items():
        assert f"{name}@{digest[:16]}" in kernel.source.splitlines()[0]
    assert set(kernel.snippet_hashes) >= set(sched.snippets())


def test_cache_key_changes_when_a_snippet_changes(tmp_path, monkeypatch):
    sched, cfg = CASES[0]
    before = sched.render(cfg)
    copy = tmp_path / "hopmm"
    copy.mkdir()
    for f in render.snippet_dir().iterdir():
        (copy / f.name).write_text(f.read_text())
    (copy / "ptx.cuh").write_text((copy / "ptx.cuh").read_text() + "\n// edited\n")
    monkeypatch.setattr(render, "snippet_dir", lambda: copy)
    after = sched.render(cfg)
    assert before.snippet_hashes["ptx.cuh"] != after.snippet_hashes["ptx.cuh"]
    assert compiler.cache_key(before) != compiler.cache_key(after)


def test_resource_report_flags_problems():
    log = ("ptxas info    : Used 168 registers, used 16 barriers\n"
           "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions "
           "are serialized due to ...\n")
    report = compiler.ResourceReport.parse(log)
    problems = report.problems(smem_bytes=300000, smem_limit=232448)
    assert any("local memory" in p for p in problems)
    assert any("exceeds" in p for p in problems)
    assert any("wgmma serialized" in p for p in problems)


def test_real_ignored_setmaxnreg_is_caught():
    """ptxas itself, through NVRTC: setmaxnreg with no register cap at entry is ignored, and
    the check must see the diagnostic (printed at "info" level)."""
    from hopmm import nvrtc

    src = """extern "C" __global__ void k(float* o) {
      if (threadIdx.x < 128) { asm volatile("setmaxnreg.dec.sync.aligned.u32 40;"); }
      else { asm volatile("setmaxnreg.inc.sync.aligned.u32 232;"); o[threadIdx.x] = 1.f; }
    }"""
    log = nvrtc.compile_cubin(src, "uncapped.cu", compiler.NVRTC_OPTIONS).log
    problems = compiler.ResourceReport.parse(log).problems(smem_bytes=0, smem_limit=232448)
    assert any("setmaxnreg ignored" in p and "C7508" in p for p in problems), log


def test_compile_error_carries_the_log():
    from hopmm import nvrtc

    with pytest.raises(nvrtc.CompileError, match="undefined"):
        nvrtc.compile_cubin("__global__ void k() { undefined_thing(); }", "bad.cu",
                            compiler.NVRTC_OPTIONS)


@pytest.mark.parametrize("damage", ["empty_log", "no_cubin", "empty_cubin"])
def test_damaged_cache_entry_is_recompiled(tmp_path, monkeypatch, damage):
    """A partial or foreign cache entry is rebuilt, never trusted or fatal."""
    monkeypatch.setenv("HOPMM_CACHE_DIR", str(tmp_path))
    compiler.clear_memo()
    sched, cfg = CASES[0]
    first = compiler.compile_kernel(sched.render(cfg))
    log = first.cubin_path.with_suffix(".log")
    {"empty_log": lambda: log.write_text(""),
     "no_cubin": lambda: first.cubin_path.unlink(),
     "empty_cubin": lambda: first.cubin_path.write_bytes(b"")}[damage]()
    compiler.clear_memo()
    with pytest.warns(compiler.kernel_cache.CacheWarning, match="damaged"):
        again = compiler.compile_kernel(sched.render(cfg))
    assert again.report == first.report and again.cubin_path.stat().st_size > 0
    assert compiler.ResourceReport.parse(log.read_text(), first.name) == first.report
    compiler.clear_memo()


def test_a_compile_served_from_nvrtcs_own_cache_still_gets_its_report(tmp_path, monkeypatch):
    """NVRTC answers a program it compiled before with the cubin and an empty log (seen on the
    GPU machine): hopmm compiles a program new to NVRTC for the report, keeps the first cubin,
    and reads the report of its own kernel, not of the extra one."""
    monkeypatch.setenv("HOPMM_CACHE_DIR", str(tmp_path))
    compiler.clear_memo()
    sched, cfg = CASES[0]
    rendered = sched.render(cfg)
    # Where NVRTC has compiled this source before (the GPU machine), the reference itself
    # needs the fallback: only its report is compared, and its cubin is the first compile's.
    reference = compiler._compile_with_report(rendered.name, rendered.source)
    real, sources = compiler.nvrtc.compile_cubin, []

    def first_call_hits_nvrtcs_cache(source, name, options):
        result = real(source, name, options)
        sources.append(source)
        return compiler.nvrtc.CompileResult(result.cubin, "") if len(sources) == 1 else result

    monkeypatch.setattr(compiler.nvrtc, "compile_cubin", first_call_hits_nvrtcs_cache)
    kernel = compiler.compile_kernel(rendered)
    compiler.clear_memo()
    assert len(sources) == 2 and sources[0] == rendered.source != sources[1]
    assert kernel.report == compiler.ResourceReport.parse(reference.log, rendered.name)
    assert kernel.cubin_path.read_bytes() == reference.cubin
    assert compiler.cache_key(rendered) in kernel.cubin_path.name  # keyed by the real source


def _tiny_cubin(path, name: str):
    """A one-line kernel called `name`, compiled for sm_90a into `path`."""
    from hopmm import nvrtc

    src = f'extern "C" __global__ void {name}(int* o) {{ o[threadIdx.x] = 1; }}'
    path.write_bytes(nvrtc.compile_cubin(src, "tiny.cu", compiler.NVRTC_OPTIONS).cubin)
    return path


def test_a_cached_listing_belongs_to_the_cubin_it_was_read_from(tmp_path, monkeypatch):
    tool = sass.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    cubin = _tiny_cubin(tmp_path / "k.cubin", "first_kernel")
    first = sass.cached_listing(cubin, tool)
    assert first == sass.disassemble(cubin, tool) and "Function : first_kernel" in first
    assert len(list(tmp_path.glob("k.*.sass"))) == 1
    summary = sass.cached_summary(cubin, tool)
    assert summary == sass.summarize_listing(first) and summary.arch == "sm_90a"
    assert sass.cached_summary(cubin, tool) is summary       # counted once
    real = sass.disassemble
    monkeypatch.setattr(sass, "disassemble", lambda *args: pytest.fail("read again"))
    assert sass.cached_listing(cubin, tool) == first        # from the file beside the cubin
    _tiny_cubin(cubin, "second_kernel")                     # another kernel, same file name
    monkeypatch.setattr(sass, "disassemble", real)
    second = sass.cached_listing(cubin, tool)
    assert "second_kernel" in second and "first_kernel" not in second
    assert len(list(tmp_path.glob("k.*.sass"))) == 2


def test_fill_cache_compiles_in_worker_processes_for_the_callers_cache(tmp_path, monkeypatch):
    """The pool's workers compile into the cache directory of the caller's environment; the
    caller's own compile of the same kernels is then a cache hit, its listing a file read."""
    monkeypatch.setenv("HOPMM_CACHE_DIR", str(tmp_path))
    compiler.clear_memo()
    persistent = [case for case in CASES if case[0].name == "persistent"]
    cases, other = persistent[:2], persistent[2]
    assert compiler.cached_cubin(other[0].render(other[1])) is None
    report.fill_cache(cases, workers=2)
    assert len(list(tmp_path.glob("*.cubin"))) == len(list(tmp_path.glob("*.log"))) == 2
    if sass.find_cuobjdump():
        assert len(list(tmp_path.glob("*.sass"))) == 2
    assert all(compiler.cached_cubin(sched.render(cfg)) for sched, cfg in cases)
    assert compiler.cached_cubin(other[0].render(other[1])) is None
    monkeypatch.setattr(compiler, "_compile_with_report",
                        lambda *args: pytest.fail("compiled again"))
    # What is in the cache is not given to workers again.
    monkeypatch.setattr(report, "ProcessPoolExecutor", lambda *args, **kw: pytest.fail("pool"))
    report.fill_cache(cases, workers=2)
    for sched, cfg in cases:
        kernel = compiler.compile_kernel(sched.render(cfg))
        assert kernel.report.registers > 0 and kernel.cubin_path.parent == tmp_path
    compiler.clear_memo()


def test_report_is_read_for_the_named_kernel():
    log = ("ptxas info    : Compiling entry function 'other' for 'sm_90a'\n"
           "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 4 registers, used 0 barriers\n"
           "ptxas info    : Compiling entry function 'mine' for 'sm_90a'\n"
           "ptxas         .     8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 16 barriers\n")
    mine = compiler.ResourceReport.parse(log, "mine")
    assert (mine.registers, mine.stack_frame, mine.spill_stores, mine.spill_loads) == (168, 8, 8, 4)
    assert compiler.ResourceReport.parse(log).registers == 4


def test_tall_tiles_trade_the_second_staging_box_for_a_fourth_stage():
    """192 x 192 tiles (48 KB a stage): a ring of two boxes per consumer leaves 3 stages, a ring
    of one leaves 4 (DEEP_STAGES), and the stage wins; 128-row tiles keep their two boxes."""
    from hopmm.schedules import DEEP_STAGES, PersistentClusterSchedule as Cluster

    smem = H100_SXM.smem_per_block_optin
    tall = Cluster.deepest("bfloat16", 192, False, True, smem, TALL_BLOCK_M)
    assert (tall.block_m, tall.consumers, tall.stages, tall.c_buffers) == (192, 3, DEEP_STAGES, 1)
    assert Cluster.smem_bytes(tall) <= smem < Cluster.smem_bytes(replace(tall, c_buffers=2))
    assert Cluster.max_stages(replace(tall, c_buffers=2), smem) == DEEP_STAGES - 1
    assert Cluster.threads(tall) == 4 * 128
    # where a ring of two leaves DEEP_STAGES or more, a ring of one is never taken
    # (phased configs trade the ring for stages beside their raw buffers: not deepest's)
    assert all(cfg.c_buffers >= 2 for sched, cfg in CASES if cfg.block_m == BLOCK_M
               and sched.c_boxes(cfg) >= 2 and not is_phased(cfg))


def test_epilogue_ring_leaves_room_for_stages():
    """128 x 256 tiles stage through a ring of 2 of a consumer's 4 boxes and get a 4th stage
    (a whole staged tile would leave 3); where the whole tile fits beside the deepest ring the
    ring is the whole tile; no config stages more boxes than its tile has."""
    from hopmm.schedules import MIN_C_BUFFERS, PersistentSchedule

    smem = H100_SXM.smem_per_block_optin
    wide = PersistentSchedule.deepest("bfloat16", 256, False, True, smem)
    assert (wide.stages, wide.c_buffers, PersistentSchedule.c_boxes(wide)) == (4, 2, 4)
    whole = replace(wide, stages=3, c_buffers=4)
    assert PersistentSchedule.smem_bytes(whole) <= smem < PersistentSchedule.smem_bytes(
        replace(whole, stages=4))
    mid = PersistentSchedule.deepest("bfloat16", 192, False, True, smem)
    assert (mid.stages, mid.c_buffers) == (4, PersistentSchedule.c_boxes(mid))
    for sched, cfg in CASES:
        floor = (min(MIN_C_BUFFERS, sched.c_boxes(cfg))
                 if cfg.block_m == BLOCK_M and not is_phased(cfg) else 1)
        assert floor <= cfg.c_buffers <= sched.c_boxes(cfg), sched.kernel_name(cfg)
        with pytest.raises(ValueError, match="staging boxes"):
            sched.render(replace(cfg, c_buffers=sched.c_boxes(cfg) + 1))
