"""Problem -> (schedule, config): a pure function of the problem and the device description,
so it is tested without a GPU (gemv's split count reads its kernel's registers, compiled by
NVRTC, which needs none)."""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from . import occupancy
from .compile import compile_schedule
from .device import H100_SXM, DeviceInfo
from .problem import LINE_BYTES, Problem
from .layout import MAX_GRID_Z, padded
from .schedules import (BLOCK_M, DUAL_B_SCHEDULES, ELEM_BYTES, F32_BYTES, GEMV_MMA_ROWS, GEMV_VEC,
                        HALF_BOX_BLOCK_N, MIN_STAGES, NARROW_BLOCK_N, PHASED_MIN_STAGES,
                        SCHEDULES, TALL_BLOCK_M, TMA_BOX_ELEMS, WGMMA_M, GemvConfig,
                        GemvSchedule, KernelConfig,
                        PersistentClusterOverlapSchedule, PersistentClusterQuadSchedule,
                        PersistentClusterSchedule, PersistentOverlapSchedule, PersistentSchedule,
                        SplitKClusterSchedule, SplitKParallelSchedule, SplitKSchedule,
                        StreamKSchedule, transposed_problem)

# Every DRAM rate below (the *_DRAM_TBPS and COPY_TBPS) was measured on an H100 SXM, whose HBM3
# peaks at REFERENCE_DRAM_TBPS; on another device it is scaled by that device's peak over this
# (dram_scale): the time a stream takes follows the memory's bandwidth, the SMs' clock and L2
# being alike across Hopper parts. An H200 (4.81 TB/s peak, 1.44 x) copied at 4.24 TB/s where
# the H100 copied at 3.00 (1.41 x); its picks under the scaled rates ran 1.06 x those under the
# H100's (bench/NOTES.md v0.52).
REFERENCE_DRAM_TBPS = H100_SXM.dram_tbps


def dram_scale(device: DeviceInfo) -> float:
    """The factor on the DRAM rates for `device` (above): 1 where its bandwidth is unknown."""
    return device.dram_tbps / REFERENCE_DRAM_TBPS if device.dram_tbps else 1.0


# M-tiles per raster group (tile_raster.cuh walks a group column by column). The tiles a wave
# of CTAs runs at once share the k-slices of A and B they read through L2, so a group is chosen
# by the wave's footprint: the rows of A and columns of B its tiles cover (_wave_footprint).
# Where N has many tiles, a wave of 132 CTAs covers 16 x ~8 tiles of 128 x 256 in groups of 16,
# the smallest footprint (groups of 4 read B again on every wave: bench/NOTES.md v0.14). Where a
# wave spans whole groups (few N-tiles), every group size covers the same rows and columns, and
# the smallest group ran fastest: the N-tiles that share an A tile then run close together
# rather than on either side of a wave's end (persistent 128 x 128: 23488 x 256 x 24064 1.17 x
# the speed of groups of 16, 5760 x 1728 x 16576 1.21 x; bench/NOTES.md v0.26). The
# candidates are RASTER_GROUPS, the smallest taken among equal footprints. The kernels whose
# clusters load B once for two M-tiles ran fastest with RASTER_GROUP_M on those same problems
# (v0.26) and keep it.
RASTER_GROUP_M = 16
# The narrow tile (NARROW_BLOCK_N) walks one M-tile at a time: the N-tiles that read the same
# A tile run side by side, so that A comes from DRAM once for them (128 columns: 1.02-1.10 x
# the speed of groups of 4; one column of tiles: the same; bench/NOTES.md v0.31).
NARROW_RASTER_GROUP = 1
RASTER_GROUPS = (4, 8, 16, 32)
# Where the whole grid runs in one round (a CTA for every tile and split at once), no tile
# waits for a later wave: groups of 4 M-tiles ran up to 18 % faster than 16 on such problems
# with several N-tiles, and within 2 % of the best group on each of the 12 such problems
# autotune timed (bench/NOTES.md v0.23).
ONE_ROUND_RASTER_GROUP = 4

# Split-K (SplitKSchedule) gives idle SMs slices of K where the output has too few tiles and
# K is long; each split costs a serial hand-off, so the split count is the minimum of a time
# model fitted to H100 timings (bench/NOTES.md "Split-K", v0.11):
#   time(s) = max(ceil(k_blocks / s) * kblock_us(CTAs),  A's and B's bytes / DRAM_TBPS,
#                 all CTAs' operand tiles / L2_TBPS)  +  (s - 1) * HANDOFF_US
# kblock_us: one 128x128x64 k-block on one SM, KBLOCK_US when few SMs run, longer by
# KBLOCK_LOAD x the share of the SMs that run at once (split_k_kblock_us: the clock falls as
# more SMs draw power and share L2; split_k ran 0.31 us a k-block with 32 CTAs and 0.37-0.40
# with 96-108, bench/NOTES.md v0.26); DRAM_TBPS: A and B are read at least once, whatever the
# split; L2_TBPS: the operand tiles every CTA streams share L2; HANDOFF_US: one hand-off
# (semaphore, bulk reduce of the partial, release).
SPLIT_K_KBLOCK_US = 0.28
SPLIT_K_KBLOCK_LOAD = 0.45
SPLIT_K_DRAM_TBPS = 3.0
SPLIT_K_L2_TBPS = 16.0
SPLIT_K_HANDOFF_US = 3.7
# Products of at most NARROW_BLOCK_N columns run 64-wide tiles (NARROW_BLOCK_N) on the
# unclustered 128-row schedules: a 128-wide tile computes as many columns again that no store
# writes, and its B stage leaves 5-6 stages where the narrow tile has 8. Its k-block ran this
# much of the 128 x 128 one's time on 13-26 CTAs (0.217-0.228 us; not half: at that load a
# k-block waits on its loads as much as on its wgmmas) (bench/NOTES.md v0.31).
NARROW_KBLOCK_SCALE = 0.78
# Split-K in clusters (SplitKClusterSchedule): the same model, but the splits of a tile add
# their partials through distributed shared memory all at once, and the grid runs in waves of
# the clusters the device holds at once (cluster_capacity):
#   time(s) = max(waves * ceil(k_blocks / s) * kblock_us(CTAs),  DRAM term,  L2 term)
#             + waves * CLUSTER_REDUCE_US
# CLUSTER_REDUCE_US: two cluster barriers and the partials read from the peers; with it the
# model picks the fastest measured split count of either schedule (bench/NOTES.md v0.13).
# In clusters of CLUSTER_LOADED_SPLITS or more CTAs the k-block time grows faster with the
# CTAs running, by CLUSTER_KBLOCK_LOAD: 0.32-0.36 us with 24-32 CTAs, 0.41 with 48, 0.54-0.63
# with 64-95, where split_k_parallel ran 0.45-0.51 with 64-76 (cause not established; clusters
# of 2 ran as split_k did). With SPLIT_K_KBLOCK_LOAD, the value whose picks came nearest the
# fastest of the candidates autotune timed on 41 problems (bench/NOTES.md v0.26).
SPLIT_K_CLUSTER_REDUCE_US = 2.0
CLUSTER_LOADED_SPLITS = 3
CLUSTER_KBLOCK_LOAD = 0.9
# ... and a cluster's k-blocks run this much longer than split_k's at the same CTA count: on 90
# problems split two ways, split_k_cluster ran 0.80-0.97 x split_k from ~150 k-blocks a split,
# where its cheaper reduction no longer pays (bench/NOTES.md v0.29).
CLUSTER_KBLOCK_PREMIUM = 1.05
# Taken only when the model predicts at least this gain over one split.
SPLIT_K_MIN_GAIN = 1.1
# Every split keeps at least this many k-blocks: shorter splits lost time the model does not
# see (bench/NOTES.md v0.11).
SPLIT_K_MIN_K_BLOCKS = 24
SPLIT_K_MAX_SPLITS = 16
# split_k_cluster has no serial chain, so it pays down to splits of this many k-blocks
# (bench/NOTES.md v0.17).
CLUSTER_SPLIT_MIN_K_BLOCKS = 8
# Split-K reduced in parallel (SplitKParallelSchedule): one hand-off per split instead of a
# chain, so as many splits as the co-residency bound allows, each of at least
# PARALLEL_MIN_K_BLOCKS k-blocks. Its model (ParallelModel below):
#   time(s) = max(ceil(k_blocks / s) * k-block,  bytes of A, B and C / dram_tbps,
#                 all CTAs' operand tiles / l2_tbps)
#             +  handoff_us  +  partials * (partial_us + s * add_us)
#   k-block = (kblock_us[tile] + ZERO_ROW_US * zero-filled rows of the worst tile)
#             * (1 + load / dram_scale * the share of the SMs the CTAs take)
# The k-block times are those of a CTA streaming alone; with every SM busy each takes
# 1 + load times as long on the H100 (L2 and DRAM shared), a share of it that a faster DRAM
# relieves: load / dram_scale. A row TMA zero-fills past the problem's edge costs far less than
# a loaded one. The DRAM rate is what the kernel's TMA loads of B reach; the L2 term binds
# where many CTAs load narrow tiles. The hand-off grows with the fp32 partial tile (`partials`:
# its size over PARALLEL_PARTIAL_TILE's): a CTA stores its own, waits for the tile's other
# splits and adds up its share of all of them. One column of 64 x 192 tiles covers 129-192
# columns, where 128-wide tiles compute a second column a quarter full and read A twice.
PARALLEL_MIN_K_BLOCKS = 4
PARALLEL_PARTIAL_TILE = (WGMMA_M, 128)


@dataclass(frozen=True)
class ParallelModel:
    """split_k_parallel's time model's constants (above)."""
    kblock_us: dict
    load: float
    dram_tbps: float
    l2_tbps: float
    handoff_us: float
    partial_us: float
    add_us: float


# Problems of more than SHORT_TILE_MAX_M rows: fitted to 1,231 timings of every tile and split
# count on problems of 1-3392 rows, 344 on an H100 and 887 on an H200; on the 747 of more than
# 64 rows 6 % rms where v0.29's constants left 11 % (bench/NOTES.md v0.67; first fitted in
# v0.17).
PARALLEL_MODEL = ParallelModel(
    kblock_us={(WGMMA_M, 128): 0.151, (WGMMA_M, 192): 0.216, (WGMMA_M, 256): 0.293,
               (BLOCK_M, 128): 0.252},
    load=0.68, dram_tbps=2.6, l2_tbps=16.0, handoff_us=2.0, partial_us=3.0, add_us=0.024)
# At most SHORT_TILE_MAX_M rows (A's tiles trimmed to them): v0.29's fit to 857 H100 timings.
# The refit above picked worse there on an H200 (0.98 x these picks on 113 decode and 68
# few-row draws): it split short main loops the persistent kernels run faster, into more
# splits (NOTES v0.67).
FEW_ROWS_PARALLEL_MODEL = ParallelModel(
    kblock_us={(WGMMA_M, 128): 0.15, (WGMMA_M, 256): 0.28},
    load=0.8, dram_tbps=2.6, l2_tbps=10.0, handoff_us=5.0, partial_us=0.0, add_us=0.1)
ZERO_ROW_US = 0.0005
# Where the DRAM term binds, more splits ran faster than the model's one rate says: the most
# splits within this factor of the best estimate are taken (bench/NOTES.md v0.17).
PARALLEL_FILL_SLACK = 1.03
# Problems of at most this many rows that split K run on split_k_parallel's 64-row tiles: a
# 128-row tile computes as many rows again that are never stored, at the cost of loaded ones
# (bench/NOTES.md v0.17). Unsplit, the persistent kernels' tiles streamed B faster than
# split_k_parallel's one split (1.06-1.67 x on three such problems, bench/NOTES.md v0.23); their
# 64 x 128 tile (FEW_ROWS_TILE) where it fits one wave, else their 128-row tiles.
SHORT_TILE_MAX_M = 64
# The tile width the unsplit baseline of the split-K models is rated on.
UNSPLIT_BLOCK_N = 128
# The persistent kernel's unsplit 128 x 128 tiles in one wave, what a split must beat, fitted
# to H100 timings of 84 such problems (bench/NOTES.md v0.29, 5 % rms):
#   time = max(k_blocks * UNSPLIT_KBLOCK_US * (1 + UNSPLIT_LOAD * the share of the SMs busy),
#              bytes of A, B and C / UNSPLIT_DRAM_TBPS)  +  UNSPLIT_EPILOGUE_US
UNSPLIT_KBLOCK_US = 0.275
UNSPLIT_LOAD = 0.4
UNSPLIT_DRAM_TBPS = 2.8
UNSPLIT_EPILOGUE_US = 2.0
# At most SHORT_TILE_MAX_M rows (a long main loop, more columns than the narrow tile's), B's
# stream sets the pace of an unsplit product: where its 64 x 128 tiles fit one wave, the
# persistent kernels run it on them, which puts the most CTAs to streaming B with the deepest
# ring (on 49 such problems 0.95-1.21 x v0.33's 128-row tiles or split, geomean 1.03; past one
# wave the last wave's few CTAs stream too slowly: 0.86-0.94 x on long main loops; NOTES
# v0.34). Their time, fitted to 78 problems (3.2 % rms):
#   time = max(k_blocks * FEW_ROWS_KBLOCK_US * (1 + FEW_ROWS_LOAD * the share of SMs busy),
#              bytes of A, B and C / FEW_ROWS_DRAM_TBPS)  +  FEW_ROWS_FIXED_US
FEW_ROWS_TILE = (WGMMA_M, 128)
FEW_ROWS_KBLOCK_US = 0.15
FEW_ROWS_LOAD = 1.2
FEW_ROWS_DRAM_TBPS = 2.95
FEW_ROWS_FIXED_US = 3.0
# That rate is scaled by the device's DRAM (dram_scale) past one wave. One wave of these tiles
# streams at most FEW_ROWS_WAVE_TBPS, so few CTAs, not the memory, cap it where the DRAM is
# faster (an H200's 59-89 CTAs of 32-64 rows streamed 3.1-3.9 TB/s where its copies ran 4.24;
# NOTES v0.55); and at most FEW_ROWS_DRAM_TBPS over at most FEW_ROWS_UNSCALED_MAX_M rows, whose
# A boxes are mostly zero-filled (the H200's one wave streamed 8192 x 8192 at 2.8-3.0 TB/s over
# 1-16 rows, as the H100's did; NOTES v0.52).
FEW_ROWS_WAVE_TBPS = 3.85
FEW_ROWS_UNSCALED_MAX_M = 16


def _few_rows_dram_tbps(tiles: int, rows: int, device: DeviceInfo) -> float:
    """FEW_ROWS_DRAM_TBPS on `device` for `tiles` of FEW_ROWS_TILE over `rows` rows: scaled,
    and capped as above where they fit one wave."""
    scaled = FEW_ROWS_DRAM_TBPS * dram_scale(device)
    if tiles > device.sm_count:
        return scaled
    cap = FEW_ROWS_DRAM_TBPS if rows <= FEW_ROWS_UNSCALED_MAX_M else FEW_ROWS_WAVE_TBPS
    return min(scaled, cap)


@dataclass(frozen=True)
class Choice:
    schedule: type
    config: KernelConfig
    reason: str
    raster_group: int = 1   # M-tiles per group of the tile order (see tile_raster.cuh)
    splits: int = 1         # CTAs per output tile along K (split_k only)
    # The tiles past the last whole wave, run after this choice's kernel as a problem of their
    # own (wave_tail_choice); this choice then covers the rest of the problem only.
    tail: Tail | None = None
    # The persistent or split-K choice a sub-wave stream-K choice displaced (_sub_wave_stream_k):
    # what operands read in place through phase maps, which stream-K lacks, run on (phaseable).
    instead: Choice | None = None


@dataclass(frozen=True)
class Tail:
    """The last rows (axis "m") or columns (axis "n") of a problem from `start` on, computed
    by `choice` after the rest; `whole` is the choice that covers the problem alone (the
    pick the tail was weighed against, or the stream-K that displaces it: wave_tail_choice)."""
    axis: str
    start: int
    choice: Choice
    whole: Choice

    def problems(self, problem: Problem) -> tuple[Problem, Problem]:
        """(the main part, the tail) of `problem` (tail_problems)."""
        return tail_problems(problem, self.axis, self.start)


def with_epilogue(choice: Choice, spec) -> Choice:
    """`choice` with the fused epilogue `spec` in its config, and in its tail's and the choice
    it displaced."""
    out = replace(choice, config=replace(choice.config, epilogue=spec),
                  instead=choice.instead and with_epilogue(choice.instead, spec))
    if choice.tail is None:
        return out
    tail = replace(choice.tail, choice=with_epilogue(choice.tail.choice, spec),
                   whole=with_epilogue(choice.tail.whole, spec))
    return replace(out, tail=tail)


def tail_problems(problem: Problem, axis: str, start: int) -> tuple[Problem, Problem]:
    """`problem`'s rows (axis "m") or columns (axis "n") before `start`, and from it on."""
    extent = getattr(problem, axis)
    return (replace(problem, **{axis: start}), replace(problem, **{axis: extent - start}))


# Relative main-loop speed of one SM per tile shape (block_m, block_n): a narrower tile reads
# more of A and B per flop but leaves room for more stages; fitted to autotune tables and
# sustained runs on an H100 (bench/NOTES.md v0.5, v0.6, v0.10, v0.14).
TILE_SPEED = {(BLOCK_M, 256): 1.0, (BLOCK_M, 192): 1.01, (BLOCK_M, 128): 0.90,
              (TALL_BLOCK_M, 192): 1.0}
# The half-box tile (schedules.HALF_BOX_BLOCK_N) loads B in whole boxes, 192 columns for its
# 160: as many operand bytes per flop as 128 x 128 (320 against 256 rows of a k-block for 1.25 x
# the outputs), in one stage fewer. Rated just below that tile, it takes products from 128 x
# 128 only where it saves more than its area in waves (4 waves of it against 5 of 128 x 128:
# not), and from the 192-wide tiles where it fills a wave they leave idle. Of 71 products of
# draws 1806-1809 moved at 0.96 (its speed against 128 x 192 in one or two waves), 5 from
# 128 x 128 ran 0.92-0.96 x; at this rating the 17 it takes ran 1.069 x (NOTES v0.66).
TILE_SPEED[BLOCK_M, HALF_BOX_BLOCK_N] = 0.89
# Where one row of tiles streams B past every SM (at most BLOCK_M rows) those loads set the
# pace: there it ran 0.84-0.95 x the 192-wide tile on 14 of 18 products (NOTES v0.66).
HALF_BOX_MIN_M = BLOCK_M + 1
# The narrow tile: half the 128 x 128 tile's area in NARROW_KBLOCK_SCALE of its k-block time.
# Offered only to products of at most NARROW_BLOCK_N columns (_offered_shapes), where it is
# the only width that computes no column past N.
TILE_SPEED[BLOCK_M, NARROW_BLOCK_N] = (TILE_SPEED[BLOCK_M, 128] * NARROW_BLOCK_N / 128
                                       / NARROW_KBLOCK_SCALE)
# The 64-row tiles of the persistent kernels (one consumer warpgroup), fitted to their timings
# against the 128-row tiles' on 17 problems of few tiles (bench/NOTES.md v0.33). Their speeds
# there spread by about 5 %, so they are taken only where the tile-time model puts them
# SHORT_TILE_MIN_GAIN ahead of the best 128-row tile (_fastest_tile): where half-area tiles
# fill the SMs that 128-row tiles leave idle in their last (or only) wave.
TILE_SPEED.update({(WGMMA_M, 128): 0.75, (WGMMA_M, 192): 0.93, (WGMMA_M, 256): 0.94})
SHORT_TILE_MIN_GAIN = 1.05
# Where the 64 x 128 tiles run in one round (a CTA for every tile at once) over a main loop of
# at most ONE_ROUND_SHORT_MAX_K_BLOCKS, a split must beat their wave model by
# ONE_ROUND_SHORT_GAIN, not SPLIT_K_MIN_GAIN, and the narrow tile does not take the problem
# from them. On the 39 problems of the tuning seeds that this moved (from a split, or from the
# narrow tile) the 64 x 128 tiles ran 1.081 x faster (geomean; 0.89-1.39, 26 faster by 3 %+,
# 6 slower): the split models' estimates were 1.06-1.3 x ahead of the wave model's where
# these won, a split's hand-off and reduction being a large share of a short main loop; past
# that many k-blocks a split's extra CTAs streamed faster (bench/NOTES.md v0.38).
ONE_ROUND_SHORT_GAIN = 1.3
ONE_ROUND_SHORT_MAX_K_BLOCKS = 224
# Neither bar holds a split whose CTAs outnumber the 64-row tiles by SPLIT_MORE_CTAS over a
# main loop of at least SPLIT_MORE_CTAS_MIN_K_BLOCKS: the 64-row tiles of a grid below one
# wave keep that many SMs idle, and a 128-row split in three or four puts them to work. Two
# splits of 128-row tiles run about as many CTAs as the 64-row tiles, each a k-block twice as
# long: no faster, and the bars stand. The split models read these splits 1.05-1.2 x ahead
# where they ran 1.1-1.5 x ahead (bench/NOTES.md v0.51).
# That main loop is for the H100's DRAM, and shorter in proportion on faster memory
# (_split_more_ctas_min_k_blocks), where one round of 64-row tiles waits on its CTAs' stages
# rather than on DRAM: on an H200, splits over 96-127 k-blocks ran 1.08 x those tiles (64-95: 1.04
# x; NOTES v0.56); never longer than on the H100 (slower memory was not measured).
SPLIT_MORE_CTAS = 1.4
SPLIT_MORE_CTAS_MIN_K_BLOCKS = 128
# The epilogue of a tile on a kernel that does not overlap it, in k-blocks of its main loop,
# and the main-loop speed of the overlap kernels (two accumulator sets) relative to TILE_SPEED:
# fitted together to sustained runs at the power limit, the regime of long runs of large GEMMs
# (bench/NOTES.md v0.14; in short interleaved timings the overlap kernel reads faster).
EXPOSED_EPILOGUE_K_BLOCKS = 1.0
OVERLAP_SPEED = 0.95
# N-major B whose rows are not multiples of 128 bytes (Problem.b_pitch_aligned): each 128-byte
# TMA box row then spans two cache lines, which costs the unclustered kernels about a quarter
# of their speed; clusters of two CTAs load half of every B tile each and multicast it, and the
# tile is ranked by waves of clusters (bench/NOTES.md v0.6).
UNALIGNED_B_SCHEDULE = PersistentClusterSchedule
# The cluster kernel's speed per tile shape on such rows, relative to 128 x 192: the main loop
# runs at the rate of the cache lines a CTA requests, so tiles that request fewer box rows per
# output element gain more than on aligned rows (fitted on nine shapes, bench/NOTES.md v0.10).
UNALIGNED_B_TILE_SPEED = {(BLOCK_M, 256): 1.05, (BLOCK_M, 192): 1.0, (BLOCK_M, 128): 0.84,
                          (TALL_BLOCK_M, 192): 1.04}
# Clusters of four load a quarter of each B tile per CTA: for tall products of few columns,
# whose 64-row tiles (or 128-row ones of one column of tiles) each read all of B, that cuts the
# L2 -> SM traffic that bounds them. Its speeds on the same scale (fitted with the pair's held,
# on 12 tall products of 104-296 columns: the wave model then ranked the measured fastest
# first on 11; bench/NOTES.md v0.39). Offered where the device reports how many clusters of
# four run at once (an H100 SXM: 30, not 33).
UNALIGNED_B_QUAD_SCHEDULE = PersistentClusterQuadSchedule
UNALIGNED_B_QUAD_MAX_N = 320   # the fitted products' widths; wider B tiles are a smaller share
UNALIGNED_B_QUAD_TILE_SPEED = {(BLOCK_M, 256): 1.16, (BLOCK_M, 192): 1.06, (BLOCK_M, 128): 0.92,
                               (WGMMA_M, 256): 0.91, (WGMMA_M, 192): 0.83, (WGMMA_M, 128): 0.71}

# Where the persistent schedule's width is one of these, its tiles run on persistent_overlap
# (two accumulator sets, the epilogue under the next tile's first k-block): 128 x 192 gained,
# 128 x 128 did not, and 128 x 256 has no registers for a second set (bench/NOTES.md v0.6).
OVERLAP_WIDTHS = (192,)
# Of those, the tile heights that run on it: a 64-row tile has one consumer warpgroup, which
# holding two 64 x 192 sets lost more than its hidden epilogue gained (NOTES v0.35, v0.36).
# The tile-time model still ranks 64 x 192 as the overlap kernel would run it: ranked as the
# single-set kernel runs it, it took over from 128 x 256 where it then ran slower (v0.36).
OVERLAP_BLOCK_MS = (BLOCK_M,)
# Tiles of fewer k-blocks than this stay on the persistent kernel: their main loop is too short
# to hide the next epilogue behind, and the overlap kernel's slower main loop then costs more
# than it hides (bench/NOTES.md v0.17).
OVERLAP_MIN_K_BLOCKS = 16

# Aligned rows: the cluster kernel's 192 x 192 tile where its waves are fuller than any 128-row
# tile's, rated at TILE_SPEED[192 x 192] and taken only where the model puts it ahead by this
# factor, since at equal waves the persistent kernels ran ahead of the cluster ones on aligned
# rows (bench/NOTES.md v0.8, v0.11).
TALL_CLUSTER_MIN_GAIN = 1.03
TALL_TILE = (TALL_BLOCK_M, PersistentClusterSchedule.tall_block_ns[0])

# Aligned rows, long runs of 128 x 256 tiles: the same tile on the cluster kernel, whose pairs
# of CTAs load each B tile once (a third less L2 -> SM traffic per k-block), which at the power
# limit is more work per joule; it ran ahead alone from CLUSTER_MIN_WAVES waves of tiles and
# CLUSTER_MIN_K_BLOCKS k-blocks a tile, behind below (bench/NOTES.md v0.15).
CLUSTER_MIN_WAVES = 5.0
CLUSTER_MIN_K_BLOCKS = 64
CLUSTER_WIDTHS = (256,)

# Stages below which a main loop waits on its loads (two k-blocks of latency cover too little
# of an L2 round trip): such a width is taken only where no width gets this many.
FAST_STAGES = 3


def _tiles(problem: Problem, block_m: int, block_n: int) -> int:
    return -(-problem.m // block_m) * -(-problem.n // block_n) * problem.batch


def _narrow(problem: Problem) -> bool:
    """A product of at most NARROW_BLOCK_N columns: the narrow tile's (NARROW_KBLOCK_SCALE)."""
    return problem.n <= NARROW_BLOCK_N


def _few_rows(problem: Problem, device: DeviceInfo) -> bool:
    """A product the persistent kernels run on FEW_ROWS_TILE: at most SHORT_TILE_MAX_M rows, a
    long main loop (_long_main_loop), not narrow (_narrow), its tiles in one wave."""
    return (problem.m <= SHORT_TILE_MAX_M and _long_main_loop(problem)
            and not _narrow(problem) and _tiles(problem, *FEW_ROWS_TILE) <= device.sm_count)


def _few_rows_us(problem: Problem, device: DeviceInfo) -> float:
    """The unsplit FEW_ROWS_TILE model's time (above), in microseconds."""
    return _one_wave_us(problem, device, FEW_ROWS_TILE, FEW_ROWS_KBLOCK_US, FEW_ROWS_LOAD,
                        _few_rows_dram_tbps(_tiles(problem, *FEW_ROWS_TILE), problem.m, device),
                        FEW_ROWS_FIXED_US)


def _one_wave_us(problem: Problem, device: DeviceInfo, tile: tuple[int, int],
                 kblock_us: float, load: float, dram_tbps: float, fixed_us: float) -> float:
    """The unsplit models' form (_unsplit_wave_us, _few_rows_us), for tiles of `tile` in one
    wave: the longer of a tile's k-blocks, each slower by `load` x the share of the SMs busy,
    and the DRAM bytes at `dram_tbps` (the device's); then `fixed_us`."""
    tiles = _tiles(problem, *tile)
    compute = _k_blocks(problem) * kblock_us * (1 + load * tiles / device.sm_count)
    return max(compute, _dram_bytes(problem) / (dram_tbps * 1e6)) + fixed_us


def _short_tiles_fit(problem: Problem) -> bool:
    """Whether the 64-row tiles are offered: not where the main loop is short
    (_long_main_loop), since one consumer warpgroup hides no tile's epilogue behind another's
    main loop (4-12 k-blocks: 0.85-0.95 x the 128-row tiles); not to problems of at most 64
    rows, which take FEW_ROWS_TILE alone where it fits one wave (_few_rows) and the 128-row
    tiles, loading only their rows, past it; not to narrow ones (_narrow), which the narrow
    tile computes without columns past N (NOTES v0.33, v0.34)."""
    return _long_main_loop(problem) and problem.m > WGMMA_M and not _narrow(problem)


def _offered_shapes(sched, problem: Problem, device: DeviceInfo, short: bool = True,
                    transposed: bool = False) -> list[tuple[int, int]]:
    """`sched`'s tile shapes for `problem`: FEW_ROWS_TILE alone where `short` and _few_rows
    (if `sched` has it); else the NARROW_BLOCK_N-wide tile only where the problem is that
    narrow (_narrow), the 64-row tiles where `short` and _short_tiles_fit; for a result
    stored `transposed` (KernelConfig.trans_c), whole boxes only (no HALF_BOX_BLOCK_N)."""
    if short and _few_rows(problem, device) and FEW_ROWS_TILE in sched.tile_shapes():
        return [FEW_ROWS_TILE]
    short = short and _short_tiles_fit(problem)
    return [t for t in sched.tile_shapes() if (t[1] != NARROW_BLOCK_N or _narrow(problem))
            and (t[0] != WGMMA_M or short)
            and (t[1] != HALF_BOX_BLOCK_N or _half_box_fits(problem, transposed))]


def _half_box_fits(problem: Problem, transposed: bool) -> bool:
    """Whether the half-box tile is offered: not for a result stored `transposed` (its
    kernels stage a half box of C only as it lies: KernelConfig.transposable), nor where the
    product has fewer than HALF_BOX_MIN_M rows."""
    return not transposed and problem.m >= HALF_BOX_MIN_M


def _split_width(problem: Problem) -> int:
    """The tile width of split_k and split_k_cluster, and of the unsplit tile they are weighed
    against: NARROW_BLOCK_N for a narrow product, else UNSPLIT_BLOCK_N."""
    return NARROW_BLOCK_N if _narrow(problem) else UNSPLIT_BLOCK_N


def _kblock_scale(block_n: int) -> float:
    """A k-block's time on a tile `block_n` wide relative to the 128-wide tile's."""
    return NARROW_KBLOCK_SCALE if block_n == NARROW_BLOCK_N else 1.0


def _k_blocks(problem: Problem) -> int:
    """The k-blocks of one tile's main loop."""
    return -(-problem.k // TMA_BOX_ELEMS)


def _long_main_loop(problem: Problem) -> bool:
    """A main loop long enough to hide a tile's epilogue behind (OVERLAP_MIN_K_BLOCKS); below
    it, a tile's store sets the pace as much as its loads."""
    return _k_blocks(problem) >= OVERLAP_MIN_K_BLOCKS


def _overlap_widths(problem: Problem, device: DeviceInfo, epilogue_reads: bool) -> tuple:
    """The widths of OVERLAP_WIDTHS whose tiles run on the overlap kernel: none on a short main
    loop, nor for an epilogue that reads bias or c where that kernel would fetch it one pair
    at a time."""
    if not _long_main_loop(problem):
        return ()
    return tuple(w for w in OVERLAP_WIDTHS
                 if not (epilogue_reads and _fetches_by_pair(PersistentOverlapSchedule, problem,
                                                             device, w, BLOCK_M)))


def _workers(sched, device: DeviceInfo) -> tuple[int, str]:
    """What takes one (group of cluster_size) tile(s) at a time: SMs, or the clusters of them
    that run at once (resident_ctas)."""
    workers = sched.resident_ctas(device) // sched.cluster_size
    return workers, ("SMs" if sched.cluster_size == 1 else f"clusters of {sched.cluster_size}")


def _tile_groups(sched, problem: Problem, shape: tuple[int, int]) -> int:
    """Units of work: tiles, or groups of cluster_size vertically adjacent tiles."""
    tiles_m = -(-problem.m // shape[0])
    tiles_n = -(-problem.n // shape[1])
    return -(-tiles_m // sched.cluster_size) * tiles_n * problem.batch


def _waves(sched, problem: Problem, device: DeviceInfo, shape: tuple[int, int]) -> int:
    """Waves of `shape` tiles (or of cluster_size groups of them), the last one counted whole."""
    workers, _ = _workers(sched, device)
    return -(-_tile_groups(sched, problem, shape) // workers)


def _relative_time(sched, problem: Problem, device: DeviceInfo, shape: tuple[int, int],
                   speeds: dict, overlap_widths: tuple = ()) -> float:
    """Waves of tiles (the last one counts whole: its idle SMs still cost time) x the time of
    one tile of this shape: its main loop, and its epilogue unless the tile runs on the overlap
    kernel (widths in `overlap_widths` of the persistent kernel, or the overlap schedules). A
    cluster takes cluster_size vertically adjacent tiles at once."""
    waves = _waves(sched, problem, device, shape)
    overlapped = (issubclass(sched, (PersistentOverlapSchedule, PersistentClusterOverlapSchedule))
                  or shape[1] in overlap_widths)
    k_blocks = _k_blocks(problem)
    if overlapped:
        tile_time = k_blocks / (speeds[shape] * OVERLAP_SPEED)
    else:
        tile_time = (k_blocks + EXPOSED_EPILOGUE_K_BLOCKS) / speeds[shape]
    return waves * shape[0] * shape[1] * tile_time / k_blocks


def split_k_kblock_us(ctas: int, sm_count: int, cluster_splits: int = 1) -> float:
    """A k-block's time on one SM while `ctas` CTAs run at once (the models above): clusters
    of CLUSTER_LOADED_SPLITS or more CTAs load it by CLUSTER_KBLOCK_LOAD."""
    load = (CLUSTER_KBLOCK_LOAD if cluster_splits >= CLUSTER_LOADED_SPLITS
            else SPLIT_K_KBLOCK_LOAD)
    return SPLIT_K_KBLOCK_US * (1 + load * min(ctas, sm_count) / sm_count)


def split_k_estimate_us(tiles: int, k_blocks: int, splits: int, stage_bytes: int,
                        operand_bytes: int, clusters: int | None = None, *,
                        sm_count: int, dram_scale: float, block_n: int = UNSPLIT_BLOCK_N) -> float:
    """The time models above, in microseconds, on a device of `sm_count` SMs and DRAM rates
    `dram_scale` x the H100's: split_k's, or with `clusters` (clusters of `splits` CTAs the
    device holds at once) split_k_cluster's; tiles `block_n` wide."""
    dram = operand_bytes / (SPLIT_K_DRAM_TBPS * dram_scale * 1e6)
    l2 = tiles * k_blocks * stage_bytes / (SPLIT_K_L2_TBPS * 1e6)
    scale = _kblock_scale(block_n)
    if clusters is None:
        per_cta = -(-k_blocks // splits) * scale * split_k_kblock_us(tiles * splits, sm_count)
        return max(per_cta, dram, l2) + (splits - 1) * SPLIT_K_HANDOFF_US
    per_cta = (-(-k_blocks // splits) * CLUSTER_KBLOCK_PREMIUM * scale
               * split_k_kblock_us(min(tiles, clusters) * splits, sm_count, splits))
    waves = -(-tiles // clusters)
    reduce = SPLIT_K_CLUSTER_REDUCE_US if splits > 1 else 0.0
    return max(waves * per_cta, dram, l2) + waves * reduce


def _past_edge(extent: int, tile_rows: int, box_rows: int) -> int:
    """Rows the last tile's loads zero-fill past `extent`: the rest of its last box that
    holds any of the operand's rows (the boxes wholly past the edge are not loaded:
    producer_tma.cuh)."""
    held = extent % tile_rows or tile_rows
    return -(-held // box_rows) * box_rows - held


def zero_filled_rows(problem: Problem, cfg: KernelConfig) -> int:
    """Rows of A and B tiles TMA zero-fills past the problem's edges in its worst tile (the
    one at both edges): the A rows loaded past M and the B rows past N."""
    a_box = min(TMA_BOX_ELEMS, cfg.a_load_rows)
    return (_past_edge(problem.m, cfg.a_load_rows, a_box)
            + _past_edge(problem.n, cfg.block_n, TMA_BOX_ELEMS))


def parallel_split_estimate_us(k_blocks: int, splits: int, tile: tuple[int, int],
                                operand_bytes: int, zero_rows: int = 0,
                                busy: float = 0.0, tile_bytes: int = 0, *,
                                dram_scale: float,
                                model: ParallelModel = PARALLEL_MODEL) -> float:
    """split_k_parallel's time `model` (above), in microseconds; `operand_bytes` are those of
    A, B and C once, `zero_rows` the zero-filled rows of the worst tile (zero_filled_rows),
    `busy` the share of the SMs its CTAs take, `tile_bytes` the operand tiles all its CTAs
    load (through L2), `dram_scale` the device's DRAM rate over the H100's (dram_scale)."""
    kblock_us = ((model.kblock_us[tile] + zero_rows * ZERO_ROW_US)
                 * (1 + model.load / dram_scale * min(busy, 1.0)))
    return (max(-(-k_blocks // splits) * kblock_us,
                operand_bytes / (model.dram_tbps * dram_scale * 1e6),
                tile_bytes / (model.l2_tbps * 1e6))
            + parallel_handoff_us(tile, splits, model))


def parallel_handoff_us(tile: tuple[int, int], splits: int,
                        model: ParallelModel = PARALLEL_MODEL) -> float:
    """split_k_parallel's hand-off of `splits` splits of `tile` under `model` (above)."""
    partials = tile[0] * tile[1] / (PARALLEL_PARTIAL_TILE[0] * PARALLEL_PARTIAL_TILE[1])
    return model.handoff_us + partials * (model.partial_us + splits * model.add_us)


def parallel_model(problem: Problem) -> ParallelModel:
    """The split_k_parallel model for `problem`: FEW_ROWS_PARALLEL_MODEL for its trimmed tiles
    of at most SHORT_TILE_MAX_M rows, else PARALLEL_MODEL."""
    return FEW_ROWS_PARALLEL_MODEL if problem.m <= SHORT_TILE_MAX_M else PARALLEL_MODEL


def _operand_bytes(problem: Problem) -> int:
    """Bytes of A and B, each once."""
    return (problem.m + problem.n) * problem.k * problem.batch * ELEM_BYTES


def _result_bytes(problem: Problem) -> int:
    """Bytes of C."""
    return problem.m * problem.n * problem.batch * ELEM_BYTES


def _dram_bytes(problem: Problem) -> int:
    """Bytes of A, B and C, each once."""
    return _operand_bytes(problem) + _result_bytes(problem)


SPLIT_K_SCHEDULES = (SplitKSchedule, SplitKClusterSchedule, SplitKParallelSchedule)


def split_configs(sched, problem: Problem, device: DeviceInfo) -> list[KernelConfig]:
    """The tiles a split-K schedule may take for `problem`, with the deepest ring that fits:
    128 x 128 (on split_k and split_k_cluster 128 x NARROW_BLOCK_N for a narrow product:
    _split_width), or on split_k_parallel its 64-row tiles of few_row_widths for problems of
    at most SHORT_TILE_MAX_M rows (loading no more rows of A than the problem has, in
    TRIMMED_A_ROWS steps); for more rows, its 64-row tiles (64 x 192 too) as well where they
    all run at once (_short_tile_shapes)."""
    short = sched is SplitKParallelSchedule and problem.m <= SHORT_TILE_MAX_M
    width = 128 if sched is SplitKParallelSchedule else _split_width(problem)
    shapes = [] if short else [(BLOCK_M, width)]
    if sched is SplitKParallelSchedule:
        shapes += _short_tile_shapes(problem, device)
    out = []
    for block_m, block_n in shapes:
        cfg = sched.deepest(problem.dtype, block_n, problem.trans_a, problem.trans_b,
                            device.smem_per_block_optin, block_m)
        if cfg is not None:
            out.append(sched.trimmed_config(cfg, problem.m) if short else cfg)
    return out


def _short_tile_shapes(problem: Problem, device: DeviceInfo) -> list[tuple[int, int]]:
    """split_k_parallel's 64-row tile shapes offered to `problem`: up to SHORT_TILE_MAX_M
    rows, those of its few_row_widths; for more rows, those that cover it in one wave of the
    SMs (where the model, which counts no waves, holds) while the 128-row tiles leave SMs
    idle: only then can twice as many tiles fill more of them."""
    shapes = [t for t in SplitKParallelSchedule.tile_shapes() if t[0] == WGMMA_M]
    if problem.m <= SHORT_TILE_MAX_M:
        return [t for t in shapes if t[1] in SplitKParallelSchedule.few_row_widths]
    return [t for t in shapes if _tiles(problem, *t) <= device.sm_count
            and _tiles(problem, BLOCK_M, t[1]) < device.sm_count]


def _split_estimates(sched, problem: Problem, cfg: KernelConfig, device: DeviceInfo,
                     forced: bool) -> dict:
    """{splits: predicted us} for every count of at least 2 that `sched` may take: within its
    bound (max_splits), SPLIT_K_MAX_SPLITS and SPLIT_K_MIN_K_BLOCKS per split (any count of
    k-blocks when forced). split_k_cluster needs the device's cluster capacity, which it
    assumes to be sm_count // splits only when forced."""
    batch_count = min(problem.batch, MAX_GRID_Z)
    bound = sched.max_splits(problem, cfg, batch_count, device.sm_count)
    k_blocks = sched.k_blocks(problem, cfg)
    tiles = _tiles(problem, cfg.block_m, cfg.block_n)
    operands = _operand_bytes(problem)
    if sched is SplitKParallelSchedule:
        top = min(bound, k_blocks if forced else max(1, k_blocks // PARALLEL_MIN_K_BLOCKS))
        zero_rows = zero_filled_rows(problem, cfg)
        tile_bytes = tiles * k_blocks * (cfg.a_load_rows + cfg.block_n) * TMA_BOX_ELEMS \
            * ELEM_BYTES
        return {s: parallel_split_estimate_us(k_blocks, s, (cfg.block_m, cfg.block_n),
                                              _dram_bytes(problem), zero_rows,
                                              tiles * s / device.sm_count, tile_bytes,
                                              dram_scale=dram_scale(device),
                                              model=parallel_model(problem))
                for s in range(1, top + 1)}
    least = CLUSTER_SPLIT_MIN_K_BLOCKS if sched is SplitKClusterSchedule else SPLIT_K_MIN_K_BLOCKS
    top = min(bound, SPLIT_K_MAX_SPLITS, k_blocks if forced else k_blocks // least)
    stage = sched.stage_bytes(cfg)
    out = {}
    for splits in range(2, top + 1):
        clusters = None
        if sched is SplitKClusterSchedule:
            clusters = device.clusters_at_once(splits)
            if clusters is None and forced:
                clusters = device.sm_count // splits
            if not clusters:
                continue
        out[splits] = split_k_estimate_us(tiles, k_blocks, splits, stage, operands, clusters,
                                          sm_count=device.sm_count,
                                          dram_scale=dram_scale(device), block_n=cfg.block_n)
    return out


def _one_split_us(problem: Problem, device: DeviceInfo) -> float:
    """The model's time of the unsplit 128-row tile of split_k's width (_split_width): what
    splitting must beat by SPLIT_K_MIN_GAIN."""
    k_blocks = _k_blocks(problem)
    operands = _operand_bytes(problem)
    width = _split_width(problem)
    stage = (BLOCK_M + width) * TMA_BOX_ELEMS * ELEM_BYTES
    return split_k_estimate_us(_tiles(problem, BLOCK_M, width), k_blocks, 1, stage,
                               operands, sm_count=device.sm_count,
                               dram_scale=dram_scale(device), block_n=width)


def _best_split(sched, problem: Problem, cfg: KernelConfig, device: DeviceInfo,
                forced: bool) -> tuple[int, float | None]:
    """(splits, predicted us) of split_count; no prediction for 1 split."""
    estimates = _split_estimates(sched, problem, cfg, device, forced)
    if sched is SplitKParallelSchedule:
        # Its own model rates one split too; 64-row tiles (problems of few rows) run on it
        # split or not.
        one = estimates[1] if not forced else None
        split = {s: t for s, t in estimates.items() if s > 1 or not forced}
        if not split:
            return 1, None
        # 128-row tiles split only where that beats the unsplit tile (no hand-off) by
        # SPLIT_K_MIN_GAIN.
        if cfg.block_m == BLOCK_M and not forced:
            unsplit = one - parallel_handoff_us((cfg.block_m, cfg.block_n), 1,
                                                parallel_model(problem))
            if len(split) == 1 or unsplit / min(t for s, t in split.items() if s > 1) \
                    < SPLIT_K_MIN_GAIN:
                return 1, None
        # More CTAs streaming draw more of the DRAM's bandwidth than the model's one rate says:
        # the most splits within PARALLEL_FILL_SLACK of the best estimate.
        fastest = min(split.values())
        best = max(s for s in split if split[s] <= fastest * PARALLEL_FILL_SLACK)
        return best, split[best]
    if not estimates:
        return 1, None
    # Counts the model puts level (the DRAM or L2 term binds them all): the most, since more
    # CTAs streaming draw more of DRAM's bandwidth than the model's one rate says, as for
    # split_k_parallel above (60 series of measured counts: pick / fastest 0.989 -> 0.997,
    # bench/NOTES.md v0.31).
    best = min(estimates, key=lambda s: (estimates[s], -s))
    if forced or _one_split_us(problem, device) / estimates[best] >= SPLIT_K_MIN_GAIN:
        return best, estimates[best]
    return 1, None


def split_count(problem: Problem, cfg: KernelConfig, device: DeviceInfo,
                forced: bool = False, sched=SplitKSchedule) -> int:
    """Splits for `sched` (split_k or split_k_cluster): the model's best count
    (_split_estimates); 1 when splitting does not pay by SPLIT_K_MIN_GAIN. Forced
    (use_schedule), the best count of at least 2 wherever the bound allows 2, so that the
    reduction runs."""
    return _best_split(sched, problem, cfg, device, forced)[0]


def _unsplit_wave_us(problem: Problem, device: DeviceInfo) -> float | None:
    """The persistent kernel's time for the unsplit 128 x 128 tiles where they fit one wave of
    the SMs (the unsplit model above); None where they take more than one wave."""
    tile = (BLOCK_M, UNSPLIT_BLOCK_N)
    if _tiles(problem, *tile) > device.sm_count:
        return None
    return _one_wave_us(problem, device, tile, UNSPLIT_KBLOCK_US, UNSPLIT_LOAD,
                        UNSPLIT_DRAM_TBPS * dram_scale(device), UNSPLIT_EPILOGUE_US)


def _split_k_choice(problem: Problem, device: DeviceInfo,
                    forced: str | None, short: bool = True) -> Choice | None:
    """Split-K where it pays: on the `forced` split-K schedule, or on whichever of them the
    model puts faster. None where no split pays (or the tile does not fit)."""
    picks = []
    for sched in SPLIT_K_SCHEDULES:
        if forced not in (None, sched.name):
            continue
        if (forced is None and sched is SplitKParallelSchedule and _narrow(problem)
                and problem.m > SHORT_TILE_MAX_M):
            continue   # its tiles of more rows are 128 or 256 wide: half or more past N
        for cfg in split_configs(sched, problem, device):
            splits, estimate = _best_split(sched, problem, cfg, device, forced is not None)
            if forced or splits >= 2 or cfg.block_m == WGMMA_M:
                picks.append((estimate or 0.0, sched, splits, cfg))
    # What a split must beat: the unsplit tiles the persistent kernels would run instead.
    few_rows = short and _few_rows(problem, device)
    unsplit = _few_rows_us(problem, device) if few_rows else _unsplit_wave_us(problem, device)
    unsplit_tiles = ("the unsplit {}x{} tiles".format(*FEW_ROWS_TILE) if few_rows
                     else "one wave of the unsplit 128-row tiles")
    # Problems of few rows split on the 64-row tiles (SHORT_TILE_MAX_M) whatever the models of
    # the 128-row split-K schedules say (those models do not see the rows past M), or, where
    # their best count is one split, not at all.
    if forced is None and problem.m <= SHORT_TILE_MAX_M:
        picks = [p for p in picks if p[3].block_m == WGMMA_M]
        # ... unless the unsplit tiles are faster by more than the model's slack
        # (PARALLEL_FILL_SLACK: within it the split keeps the problem).
        if unsplit is not None:
            picks = [p for p in picks if p[0] <= unsplit * PARALLEL_FILL_SLACK]
    elif forced is None:
        # More rows: the 64-row tiles (twice as many as the 128-row tiles, which leave SMs
        # idle) only where their model beats one wave of the unsplit 128-row tiles by
        # SPLIT_K_MIN_GAIN, split or not.
        picks = [p for p in picks if p[3].block_m == BLOCK_M
                 or (unsplit is not None and p[0] * SPLIT_K_MIN_GAIN <= unsplit)]
    if not picks:
        return None
    estimate, sched, splits, cfg = min(picks, key=lambda p: (p[0], p[2]))
    if forced is None and splits == 1 and (cfg.block_m == BLOCK_M
                                           or problem.m <= SHORT_TILE_MAX_M):
        return None
    tiles = _tiles(problem, cfg.block_m, cfg.block_n)
    # The unsplit 64-row tiles that would run instead hold the split, unless it outnumbers
    # them; unsplit, they run it: the persistent kernels' tiles need no workspace (this
    # schedule's one split ran 0.84 x them on 320 x 3584 x 27264, NOTES v0.67).
    rival = _short_tile_rival(problem, device) if forced is None and short else None
    if rival and splits == 1:
        return None
    spread = rival and _split_outnumbers_short_tiles(problem, device, rival,
                                                     tiles * splits)
    if rival and not spread and _short_tiles_beat_split(problem, device, estimate, rival):
        return None
    k_blocks = sched.k_blocks(problem, cfg)
    if sched is SplitKParallelSchedule:
        how = ("each split stores its partial to its own workspace slot, then adds up its "
               "share of the tile's rows over all of them, in split order"
               + (f"; A tiles load {cfg.a_rows} rows" if cfg.a_rows else ""))
    elif sched is SplitKClusterSchedule:
        clusters = device.clusters_at_once(splits)
        how = (f"reduced in order through distributed shared memory in clusters of {splits} "
               f"CTAs" + (f", {clusters} of which run at once" if clusters else ""))
    else:
        how = "reduced in order through an fp32 workspace"
    split = (f"{k_blocks} k-blocks in {splits} splits ({k_blocks // splits}-"
             f"{-(-k_blocks // splits)} k-blocks each, {how})" if splits > 1 else
             f"{k_blocks} k-blocks unsplit, twice as many tiles as of 128 rows, all at once")
    why = (f"{sched.name}: {tiles} tiles of {cfg.block_m}x{cfg.block_n} for {device.sm_count} "
           f"SMs, {split}"
           + (f"; predicted {estimate:.1f} us" if estimate else "")
           + (f" against {unsplit:.1f} us for {unsplit_tiles}"
              if unsplit is not None and estimate and cfg.block_m < BLOCK_M else "")
           + (f"; {spread}" if spread else "")
           + f"; {cfg.stages} stages fit in {device.smem_per_block_optin} B of shared memory; "
           f"{sched.smem_note(cfg)}")
    return Choice(sched, cfg, why, _raster_group(problem, cfg, device, splits), splits)


def _short_tile_rival(problem: Problem, device: DeviceInfo) -> Choice | None:
    """The unsplit 64-row tiles the persistent kernels would run `problem` on
    (_persistent_choice), what a split of it is weighed against; None where they would not
    run it on such tiles."""
    if not _short_tiles_fit(problem) or _b_rows_unaligned(problem):
        return None
    rival = _persistent_choice(problem, device, None, epilogue_reads=False)
    if rival.config.block_m != WGMMA_M or rival.schedule not in TAIL_MAIN_SCHEDULES:
        return None
    return rival


def _short_tiles_beat_split(problem: Problem, device: DeviceInfo, split_us: float,
                            rival: Choice) -> bool:
    """Whether the wave model (_persistent_us) of the 64-row tiles `rival` (_short_tile_rival)
    comes within SPLIT_K_MIN_GAIN of the split's estimate `split_us`: the bar the 128-row
    tiles set a split (_best_split). On 25 problems whose split this replaced, the 64-row
    tiles unsplit ran 0.97-1.48 x the split, geomean 1.19 (NOTES v0.33)."""
    gain = (ONE_ROUND_SHORT_GAIN if _short_tiles_in_one_round(problem, device, rival.config)
            else SPLIT_K_MIN_GAIN)
    return _persistent_us(rival.schedule, problem, device, rival.config) < split_us * gain


def _short_tiles_in_one_round(problem: Problem, device: DeviceInfo, cfg: KernelConfig) -> bool:
    """Whether `cfg` is the 64 x 128 tile (FEW_ROWS_TILE, the 64-row tile of the most CTAs) of a
    problem of more rows than it (_short_tiles_fit), its grid runs in one round and its main
    loop is short enough (ONE_ROUND_SHORT_GAIN)."""
    return (_short_tiles_fit(problem) and (cfg.block_m, cfg.block_n) == FEW_ROWS_TILE
            and _tiles(problem, *FEW_ROWS_TILE) <= device.sm_count
            and _k_blocks(problem) <= ONE_ROUND_SHORT_MAX_K_BLOCKS)


def _split_outnumbers_short_tiles(problem: Problem, device: DeviceInfo, rival: Choice,
                                  split_ctas: int) -> str | None:
    """Why a split of `split_ctas` CTAs is not held by the 64-row tiles `rival`
    (_short_tile_rival): it has SPLIT_MORE_CTAS x as many CTAs as those tiles (at most the
    SMs) over at least _split_more_ctas_min_k_blocks k-blocks; None where it is not so."""
    rival_tiles = _tiles(problem, rival.config.block_m, rival.config.block_n)
    if _k_blocks(problem) < _split_more_ctas_min_k_blocks(device) \
            or split_ctas < SPLIT_MORE_CTAS * min(rival_tiles, device.sm_count):
        return None
    return (f"{split_ctas} CTAs, at least {SPLIT_MORE_CTAS} x the {rival_tiles} unsplit "
            f"{rival.config.block_m}x{rival.config.block_n} tiles, which would leave SMs idle "
            f"over {_k_blocks(problem)} k-blocks: those tiles' bar does not hold it")


def _split_more_ctas_min_k_blocks(device: DeviceInfo) -> int:
    """The shortest main loop over which a split of more CTAs than the 64-row tiles is not
    held by their bars: SPLIT_MORE_CTAS_MIN_K_BLOCKS divided by the device's DRAM scale where
    that is above 1, so never longer than on the H100."""
    return round(SPLIT_MORE_CTAS_MIN_K_BLOCKS / max(1.0, dram_scale(device)))


# Operands TMA cannot read in place (rows not a multiple of 16 bytes) are copied into aligned
# buffers first, two bytes of traffic per byte at COPY_TBPS; cuBLAS reads them in place, but on
# such rows its kernels run far below their aligned speed. The call goes to cupy.matmul where
# the copies plus the product on hopmm's kernels take longer than cuBLAS on the unaligned rows:
# - the product: the heuristic's own estimate of the aligned problem (_choice_us) times
#   COPY_PATH_BIAS, for the estimates' optimism on that path (they ran at a median 0.82 of its
#   measured time on the tuning sweeps' unaligned problems; 1.3 routed those best);
# - cuBLAS (cublas_unaligned_us): the operands and result moved at CUBLAS_UNALIGNED_TBPS and
#   the product computed at CUBLAS_UNALIGNED_TFLOPS on its short side rounded up to whole
#   CUBLAS_TILE tiles, by the rows' alignment in bytes (the largest power of two up to 8 that
#   divides every pitch): fitted to cuBLAS's times on the 496 unaligned problems of the tuning
#   sweeps (rms error 18 % at 2 bytes, 24-26 % at 4 and 8; bench/NOTES.md v0.37).
# Copies shorter than MIN_CALL_US (below which launches set the pace) never route a call.
# Where the heuristic has no estimate (gemv, the one-tile and cluster kernels), the copy alone
# is weighed against COPY_ROUTE_RATIO times the product's compute floor at FLOOR_TFLOPS (at
# least MIN_CALL_US), as before v0.37. CUBLAS_UNALIGNED_TBPS is not scaled by the device's
# DRAM (dram_scale): at a third of the H100's copy rate, those kernels are not bound by it.
# Except on few rows over a long K: where the short side is at most CUBLAS_NARROW_SIDE, the
# rows are multiples of CUBLAS_NARROW_MIN_ALIGN bytes and K is at least CUBLAS_NARROW_MIN_K,
# cuBLAS streams the operands at DRAM speed where that is the faster: a fixed
# CUBLAS_NARROW_FIXED_US, then the bytes at CUBLAS_NARROW_TBPS (scaled: dram_scale), the
# product computed on tiles of that side. Fitted to 28 such products on the H200 (a median 2.2
# TB/s; rms of the log error 0.08, against 0.44 for the model above); over shorter loops they
# ran a median 1.6 TB/s, near the model above, as did those of 2-byte rows (1.1 TB/s;
# bench/NOTES.md v0.61).
COPY_TBPS = 3.0
FLOOR_TFLOPS = 800.0
COPY_ROUTE_RATIO = 4.0
MIN_CALL_US = 2.5
COPY_PATH_BIAS = 1.3
CUBLAS_UNALIGNED_TBPS = {2: 1.0, 4: 1.4, 8: 1.4}
CUBLAS_UNALIGNED_TFLOPS = {2: 115.0, 4: 180.0, 8: 180.0}
CUBLAS_TILE = 128
CUBLAS_NARROW_SIDE = 64
CUBLAS_NARROW_MIN_ALIGN = 4
CUBLAS_NARROW_MIN_K = 7000
CUBLAS_NARROW_FIXED_US = 10.0
CUBLAS_NARROW_TBPS = 1.6


def copy_us(copied_bytes: int, device: DeviceInfo) -> float:
    """Microseconds of aligned copies of `copied_bytes` on `device`: each byte read and
    written once at COPY_TBPS (scaled: dram_scale)."""
    return 2 * copied_bytes / (COPY_TBPS * dram_scale(device) * 1e6)


def cublas_unaligned_us(problem: Problem, align: int, device: DeviceInfo) -> float:
    """cuBLAS's modelled time for `problem` on rows aligned to `align` bytes (2, 4 or 8) on
    `device`."""
    p = problem
    short, long = min(p.m, p.n), max(p.m, p.n)
    moved = _operand_bytes(p) + _result_bytes(p)
    tflops = CUBLAS_UNALIGNED_TFLOPS[align] * 1e6
    tiled = -(-short // CUBLAS_TILE) * CUBLAS_TILE
    us = max(moved / (CUBLAS_UNALIGNED_TBPS[align] * 1e6),
             2 * p.batch * tiled * long * p.k / tflops)
    if (short > CUBLAS_NARROW_SIDE or align < CUBLAS_NARROW_MIN_ALIGN
            or p.k < CUBLAS_NARROW_MIN_K):
        return us
    stream_us = moved / (CUBLAS_NARROW_TBPS * dram_scale(device) * 1e6)
    flops = 2 * p.batch * CUBLAS_NARROW_SIDE * long * p.k
    return min(us, CUBLAS_NARROW_FIXED_US + max(stream_us, flops / tflops))


def copy_route_reason(problem: Problem, device: DeviceInfo, copied_bytes: int,
                      align: int) -> str | None:
    """Why a call whose aligned copies move `copied_bytes` goes to cupy.matmul, or None.
    `problem`: the product as hopmm's kernels would run it on the copies; `align`: the rows'
    alignment in bytes (2, 4 or 8)."""
    p = problem
    copy_time = copy_us(copied_bytes, device)
    if copy_time < MIN_CALL_US:   # copies shorter than a launch cannot decide the route
        return None
    copies = (f"rows not a multiple of 16 bytes: the aligned copies hopmm's kernels need move "
              f"{copied_bytes / 1e6:.1f} MB ({copy_time:.1f} us at "
              f"{COPY_TBPS * dram_scale(device):.2f} TB/s)")
    product_us = _choice_us(choose(p, device), p, device)
    if product_us is None:
        compute_us = max(2 * p.m * p.n * p.k * p.batch / (FLOOR_TFLOPS * 1e6), MIN_CALL_US)
        if copy_time <= COPY_ROUTE_RATIO * compute_us:
            return None
        return (f"{copies}, more than {COPY_ROUTE_RATIO:g}x the product's compute floor "
                f"({compute_us:.1f} us); cuBLAS reads such rows in place")
    ours = copy_time + COPY_PATH_BIAS * product_us
    theirs = cublas_unaligned_us(p, align, device)
    if ours <= theirs:
        return None
    return (f"{copies}, then the product (~{COPY_PATH_BIAS * product_us:.1f} us): more than "
            f"cuBLAS's ~{theirs:.1f} us reading such rows in place ({align}-byte rows)")


# A narrow product's N-major B whose rows TMA reads in place but which are shorter than a
# 32-byte sector (16 bytes: 8 columns of 16 bits): every CTA of the narrow tile reads the same
# few lines of B's k-block at about the same time, eight rows to a line, each its own request.
# Read from a copy whose rows are whole lines, such products ran 1.07 x faster through
# hopmm.matmul, copy included (geomean of 27 on the narrow tile, unsplit and split: 0.95-1.16,
# 24 faster). Rows of 48-112 bytes saved a median 8 % in the kernel alone over short loops
# (NARROW_B_ROW_COST), but not the copy's cost (0.89-1.04 x through hopmm.matmul); rows of whole
# sectors (32, 64, 96 bytes) saved 0-4 % (bench/NOTES.md v0.60). B is read from such a copy where
# NARROW_B_ROW_COST of the product's estimate exceeds the copy's cost: a launch (MIN_CALL_US)
# and B's bytes moved (copy_us).
SECTOR_BYTES = 32
NARROW_B_ROW_COST = 0.08


def narrow_b_copy_reason(problem: Problem, b_pitch_bytes: int,
                         device: DeviceInfo) -> str | None:
    """Why a call whose N-major B (read in place, rows `b_pitch_bytes` apart) is read from a
    copy of whole-line rows instead (the rule above), or None."""
    p = problem
    if not (p.trans_b and _narrow(p) and b_pitch_bytes < SECTOR_BYTES):
        return None
    aligned = replace(p, b_pitch_aligned=True)
    choice = choose(aligned, device)
    if choice.schedule is StreamKSchedule and choice.config.block_n == NARROW_BLOCK_N:
        # Weighed on the narrow pick itself, as measured, not on the stream-K that displaced
        # it there (_whole_line_narrow_stream_k).
        choice = choice.instead
    if (choice.schedule is GemvSchedule or choice.config.block_n != NARROW_BLOCK_N
            or choice.config.trans_c):   # measured on the narrow tile of the product only
        return None
    product_us = _choice_us(choice, aligned, device)
    b_bytes = p.k * p.n * p.batch * ELEM_BYTES
    cost_us = MIN_CALL_US + copy_us(b_bytes, device)
    if product_us is None or NARROW_B_ROW_COST * product_us <= cost_us:
        return None
    return (f"B's rows of {b_pitch_bytes} bytes are shorter than a {SECTOR_BYTES}-byte "
            f"sector, which the narrow tile's CTAs all read at once: read from a copy of whole "
            f"{LINE_BYTES}-byte lines ({cost_us:.1f} us) to save ~{NARROW_B_ROW_COST:.0%} of "
            f"the product's ~{product_us:.1f} us")


# The one-kernel shared-A products (schedules.DUAL_B_SCHEDULES) against the composed path
# (one plain product per B, and swiglu's gating pass), by their time models (_dual_b_us,
# _composed_us). The one kernel cannot split K, so where its tiles are few and K long the
# composed products, which can, are faster; where its tiles fill the SMs it saves a launch, a
# tail, A's second read, swiglu's gating pass and their host time. Each path is no faster
# than its repeat's host time back to back (DUAL_B_HOST_US, COMPOSED_HOST_US: the smallest
# products' times), which paces small products. Checked on 88 products of 1-1024 rows of two
# seeds (NOTES v0.48): its picks ran 0.99-1.0 x the faster path (geomean), where v0.21's rule
# (one kernel only where compute-bound) left swiglu at 0.82-0.95 x torch. The host times were
# read on one host; hosts differ (v0.35), but both paths' alike.
DUAL_B_HOST_US = {"shared_a": 28.0, "swiglu": 23.0}
COMPOSED_HOST_US = {"shared_a": 31.0, "swiglu": 47.0}
# swiglu's composed gating pass: both products read, the result written, at COPY_TBPS, after
# a launch (predicted).
GATING_FIXED_US = 2.0


@functools.lru_cache(maxsize=4096)
def dual_b_pays(schedule, problem: Problem, device: DeviceInfo) -> tuple:
    """(whether the one-kernel `schedule` beats the composed path, why), by the model above,
    for two products of `problem` (A with either B). Asked on a swiglu or matmul_shared_a
    call that has no remembered launches: remembered per problem, as choose() is."""
    one = max(_dual_b_us(schedule, problem, device), DUAL_B_HOST_US[schedule.name])
    composed = max(_composed_us(schedule, problem, device), COMPOSED_HOST_US[schedule.name])
    pays = one < composed
    return pays, (f"{schedule.name}: one kernel {one:.1f} us, composed {composed:.1f} us "
                  f"(time models, each at least its host time): "
                  f"{'one kernel' if pays else 'composed'}")


def _dual_b_us(schedule, problem: Problem, device: DeviceInfo) -> float:
    """The one kernel's time on its tiles (dual_b_choice), wave by wave, by the plain tiles'
    model of their height with a k-block of both products' wgmmas: on 64 rows the few-row
    model's (FEW_ROWS_*) at twice its k-block, on 128 the unsplit model's (UNSPLIT_*) at the
    k-block of a tile twice as wide (NOTES v0.48)."""
    cfg = dual_b_choice(schedule, problem, device).config
    tiles = _tiles(problem, cfg.block_m, cfg.block_n)
    if cfg.block_m == WGMMA_M:
        kblock_us, load, dram_tbps, fixed_us = (2 * FEW_ROWS_KBLOCK_US, FEW_ROWS_LOAD,
                                                _few_rows_dram_tbps(tiles, problem.m, device),
                                                FEW_ROWS_FIXED_US)
    else:   # the work of a tile twice as wide, at that tile's speed
        wide = (cfg.block_m, 2 * cfg.block_n)
        kblock_us, load, dram_tbps, fixed_us = (_unsplit_kblock_us(wide, TILE_SPEED[wide]),
                                                UNSPLIT_LOAD,
                                                UNSPLIT_DRAM_TBPS * dram_scale(device),
                                                UNSPLIT_EPILOGUE_US)
    dram_us = (ELEM_BYTES * problem.batch
               * (problem.m * problem.k + 2 * problem.k * problem.n
                  + schedule.outputs * problem.m * problem.n) / (dram_tbps * 1e6))
    return _waves_us(tiles, device.sm_count, _k_blocks(problem), kblock_us, load, dram_us, 1,
                     device) + fixed_us


def _composed_us(schedule, problem: Problem, device: DeviceInfo) -> float:
    """The composed path's time: two plain products by the model of the heuristic's choice
    for one (_plain_us), and swiglu's gating pass."""
    us = 2 * _plain_us(problem, device)
    if schedule.outputs == 1:
        us += (3 * _result_bytes(problem) / (COPY_TBPS * dram_scale(device) * 1e6)
               + GATING_FIXED_US)
    return us


def estimate_us(choice: Choice, problem: Problem, device: DeviceInfo) -> float | None:
    """The time the model that made `choice` gives it on `problem` (gemv's, the few-row tiles',
    the split-K models', the wave model, stream-K's; a choice with a wave tail: its main
    kernel's over the whole problem); None for the schedules no model times."""
    if choice.schedule is GemvSchedule:
        return gemv_estimate_us(problem, choice.config, choice.splits, device)
    computed = choice.schedule.kernel_problem(problem, choice.config)
    if (choice.config.block_m, choice.config.block_n) == FEW_ROWS_TILE and \
            choice.schedule in TAIL_MAIN_SCHEDULES and _few_rows(computed, device):
        return _few_rows_us(computed, device)
    return _choice_us(choice, problem, device)


def _plain_us(problem: Problem, device: DeviceInfo) -> float:
    """A plain product's time by the model of the heuristic's choice for it; where that choice
    has none, its floor: the DRAM bytes at COPY_TBPS or the compute at FLOOR_TFLOPS."""
    choice = choose(problem, device)
    us = estimate_us(choice, problem, device)
    if us is None:
        us = max(_dram_bytes(problem) / (COPY_TBPS * dram_scale(device) * 1e6),
                 2 * problem.batch * problem.m * problem.n * problem.k / (FLOOR_TFLOPS * 1e6))
    return us


# gemv (GemvSchedule): B streamed once by CUDA-core FMAs, for outputs of few rows. Its model:
#   time(s) = max(bytes / (GEMV_DRAM_TBPS x fill),  2 x rows computed x N x K / GEMV_FMA_TFLOPS)
#             + GEMV_LAUNCH_US  +  (s > 1: GEMV_SPLIT_US + the partials' bytes / GEMV_DRAM_TBPS)
# bytes: A and C once, B once per row group of GemvConfig.max_rows rows; fill: the share of
# GEMV_INFLIGHT_PER_SM the grid's CTAs keep in flight (fewer CTAs, fewer loads).
# - GEMV_DRAM_TBPS: B streamed at 0.95 of a device-to-device copy (1 x 8192 x 8192, K-major B,
#   H100: 2.85 TB/s; bench/NOTES.md v0.18);
# - GEMV_FMA_TFLOPS: the fp32 FMA rate with the bf16 -> fp32 conversions: 12 TFLOP/s as
#   measured at 8 rows of N-major B (v0.29), so from ~8 rows on the tensor cores win;
#   GEMV_FMA_K_MAJOR_TFLOPS: the K-major loops of at most GEMV_FMA_K_MAJOR_MAX_ROWS rows (one
#   vector along K per column, two CTAs per SM by registers) stream B at the memory bound
#   from 1 to 4 rows (v0.53); their 8 and 16 rows hold one CTA per SM, 12-21 TFLOP/s by grid;
# - GEMV_MMA_TFLOPS: the tensor-core loops' rate (GemvConfig.mma, 8-16 rows): mma.sync's
#   bound is far above any stream's, so memory decides (predicted; NOTES v0.21);
# - GEMV_MMA_DRAM_TBPS: the tensor-core loops' stream rate by B's layout, in place of
#   GEMV_DRAM_TBPS (the one-row rate): fitted so that the model's whole estimate meets the
#   measured time of the heuristic's config at 16 rows (v0.21, H100: K-major 53.4 / 50.4 us
#   at 16 x 8192 x 8192 / 16 x 14336 x 4096, N-major 61.5 / 51.1 us; the N-major loop's
#   eight row loads per lane and chunk stream less evenly);
# - GEMV_LAUNCH_US: launch, first loads' latency and the last CTAs' tail (predicted);
# - GEMV_SPLIT_US: the last CTA of a tile reading every split's partial and the counter's
#   round trip (predicted);
# - GEMV_INFLIGHT_PER_SM: bytes of B in flight per SM that cover DRAM latency (Little's law:
#   ~3 TB/s x ~1 us / 132 SMs ~ 24 KB per SM, twice that for margin); a CTA holds threads x
#   unroll x cols x 16 B (GemvConfig.inflight_bytes), and fill is the share of it the grid's
#   CTAs give (its split counts were the best measured on three of four v0.18 shapes);
# - GEMV_MIN_SPLIT_K: elements of K per split below which the partials cost more than the
#   CTAs they add (predicted);
# - GEMV_M_MAJOR_A_ROW_COST: the transposed loops' A is B^T, M-major where B's rows are
#   contiguous (GemvConfig.trans_a), and read one 2-byte element at a time, eight loads per
#   16-byte vector of each row; from 8 rows those loads stretch the stream by 1 + rows x this
#   (_gathers_a): the tensor-core loops at 8 and 16 rows ran 1.37 and 2.07 x as long as over
#   the same products' K-major B^T (H200, NOTES v0.59). The CUDA-core loops of 8 rows gather
#   alike and take the same stretch, so that it does not move gemv between its two loops;
#   fewer rows, rows read in place (their own slowdown, below) and the few-row loops over an
#   A passed as a.T were not measured so and keep their model.
# The K split (gemv_splits) counts rounds: a grid past the CTAs the SMs hold at once
# (gemv_resident_ctas: by registers, two per SM for the K-major CUDA-core loops of 1-4 rows)
# runs its last CTAs as a round of their own, as long as the first: fewer splits ran 1.25 x
# faster on the 80 decode products of two seeded sets whose count this moved (NOTES v0.54).
GEMV_DRAM_TBPS = 2.85
GEMV_FMA_TFLOPS = 12.0
GEMV_FMA_K_MAJOR_TFLOPS = 18.0
GEMV_FMA_K_MAJOR_MAX_ROWS = 4
GEMV_MMA_TFLOPS = 200.0
GEMV_MMA_DRAM_TBPS = {"k": 2.75, "n": 2.35}
GEMV_LAUNCH_US = 2.0
GEMV_SPLIT_US = 1.0
GEMV_INFLIGHT_PER_SM = 48 * 1024
GEMV_MIN_SPLIT_K = 256
GEMV_M_MAJOR_A_ROW_COST = 1 / 16
# Rows of C gemv is taken for without forcing: its kernel's design point (a row group of 16, the
# mma's rows); more rows read B once per group of 16.
GEMV_MAX_M = 16
# Rows of C up to which gemv may take an N-major B unforced (few rows; few columns, C^T, and
# gemv on unaligned rows read in place keep their models). From two rows its N-major loops (a
# lane's vector of 8 columns a row, partials added across warps through shared memory;
# mma.sync from 8 rows) stream B at 1.3-2.8 TB/s, up to 50 % below their model, where the
# tile kernels' TMA stream of the same B ran 2.0-2.9: on tiles instead, 62 problems of 2-16
# rows ran 1.03-1.13 x faster (geomean by rows; NOTES v0.35). One row keeps gemv, ahead on
# 3 of 4.
GEMV_N_MAJOR_MAX_ROWS = 1


def gemv_splits(problem: Problem, cfg: GemvConfig, device: DeviceInfo) -> int:
    """Of the split counts up to _gemv_splits_wanted, the one whose grid streams B in the
    fewest round-times (_gemv_rounds_cost; ties: fewer splits); 1 where the tiles alone fill
    the SMs. Rows read in place keep the wanted count: their choice against the aligned copies
    and cupy.matmul was fitted with it, and cuBLAS's model on such rows, which that choice
    weighs, ran 5-8 x optimistic on decode products (NOTES v0.54)."""
    wanted = _gemv_splits_wanted(problem, cfg, device)
    ctas = _gemv_grid_ctas(problem, cfg)
    if wanted == 1 or wanted * ctas <= device.sm_count or cfg.in_place:
        return wanted
    resident = gemv_resident_ctas(cfg, device)
    full = _gemv_ctas_wanted(cfg, device)
    return min(range(1, wanted + 1),
               key=lambda s: _gemv_rounds_cost(s * ctas, resident, full) / s)


def _gemv_rounds_cost(ctas: int, resident: int, full: int) -> int:
    """B's stream time, in units of one CTA's share, of a grid of `ctas` CTAs that runs in
    rounds of `resident` at once, each round at the share of the DRAM rate its CTAs keep in
    flight (those of fewer than `full` CTAs take as long as `full` would)."""
    rounds, last = divmod(ctas, resident)
    return rounds * max(resident, full) + (max(last, full) if last else 0)


def _gemv_splits_wanted(problem: Problem, cfg: GemvConfig, device: DeviceInfo) -> int:
    """The fewest K splits whose CTAs keep GEMV_INFLIGHT_PER_SM in flight on every SM,
    keeping GEMV_MIN_SPLIT_K elements of K per split and within the schedule's bound; 1 where
    the tiles alone do."""
    batch_count = min(problem.batch, MAX_GRID_Z)
    wanted = -(-_gemv_ctas_wanted(cfg, device) // _gemv_grid_ctas(problem, cfg))
    top = min(GemvSchedule.max_splits(GemvSchedule.kernel_problem(problem, cfg), cfg,
                                      batch_count),
              max(1, problem.k // GEMV_MIN_SPLIT_K))
    return max(1, min(wanted, top))


def _gemv_grid_ctas(problem: Problem, cfg: GemvConfig) -> int:
    """CTAs of gemv's unsplit grid: its tiles of every batch slice the grid holds."""
    row_groups, col_blocks = GemvSchedule.tiles(GemvSchedule.kernel_problem(problem, cfg), cfg)
    return row_groups * col_blocks * min(problem.batch, MAX_GRID_Z)


def gemv_resident_ctas(cfg: GemvConfig, device: DeviceInfo) -> int:
    """CTAs of gemv's kernel at `cfg` that the device's SMs run at once (its compiled
    registers, threads and shared memory; at least one per SM)."""
    per_sm = occupancy.resident_ctas_per_sm(_gemv_registers(cfg), cfg.threads,
                                            GemvSchedule.smem_bytes(cfg),
                                            device.smem_per_block_optin)
    return max(1, per_sm) * device.sm_count


@functools.lru_cache(maxsize=256)
def _gemv_registers(cfg: GemvConfig) -> int:
    """Registers a thread of gemv's kernel at `cfg` takes, as compiled (cached on disk)."""
    return compile_schedule(GemvSchedule, cfg).report.registers


def _gemv_ctas_wanted(cfg: GemvConfig, device: DeviceInfo) -> int:
    """CTAs that keep GEMV_INFLIGHT_PER_SM of B in flight on every SM."""
    return -(-device.sm_count * GEMV_INFLIGHT_PER_SM // cfg.inflight_bytes)


def _gemv_tflops(cfg: GemvConfig) -> float:
    """The compute rate of gemv's loops of `cfg` (the model's constants above)."""
    if cfg.mma:
        return GEMV_MMA_TFLOPS
    if not cfg.trans_b and cfg.max_rows <= GEMV_FMA_K_MAJOR_MAX_ROWS:
        return GEMV_FMA_K_MAJOR_TFLOPS
    return GEMV_FMA_TFLOPS


def gemv_estimate_us(problem: Problem, cfg: GemvConfig, splits: int, device: DeviceInfo) -> float:
    """The gemv model above, in microseconds (of the kernel's problem: with trans_c the
    transposed one)."""
    kp = GemvSchedule.kernel_problem(problem, cfg)
    row_groups, _ = GemvSchedule.tiles(kp, cfg)
    b = kp.k * kp.n * ELEM_BYTES * row_groups
    ac = (kp.m * kp.k + kp.m * kp.n) * ELEM_BYTES
    bytes_ = (b + ac) * kp.batch
    ctas = _gemv_grid_ctas(problem, cfg) * splits
    # The stream as one round of all its CTAs (the round cost with every CTA resident): the
    # split count (gemv_splits) weighs the rounds the SMs actually hold.
    stretch = _gemv_rounds_cost(ctas, ctas, _gemv_ctas_wanted(cfg, device)) / ctas
    scale = dram_scale(device)
    rate = (GEMV_MMA_DRAM_TBPS["n" if cfg.trans_b else "k"] if cfg.mma else GEMV_DRAM_TBPS) * scale
    memory = bytes_ * stretch / (rate * 1e6) * (GEMV_IN_PLACE_SLOWDOWN if cfg.in_place else 1.0)
    if _gathers_a(cfg):
        memory *= 1 + GEMV_M_MAJOR_A_ROW_COST * cfg.max_rows
    compute = (2 * row_groups * cfg.max_rows * kp.n * kp.k * kp.batch
               / (_gemv_tflops(cfg) * 1e6))
    split = 0.0
    if splits > 1:
        partials = 2 * ctas * cfg.max_rows * cfg.block_n * F32_BYTES
        split = GEMV_SPLIT_US + partials / (GEMV_DRAM_TBPS * scale * 1e6)
    return max(memory, compute) + GEMV_LAUNCH_US + split


def _unsplit_narrow(problem: Problem, cfg: GemvConfig,
                    device: DeviceInfo) -> GemvConfig | None:
    """The narrow config (GemvConfig.narrow) where its twice as many column blocks keep the
    SMs busy without the K split that `cfg` wants, else None. Its tiles then skip the split's
    partials and the last CTA's sum: 1.09-1.41 x on the four such problems of a seeded decode
    set, where with splits on both sides it ranged 0.90-1.06 (NOTES v0.36)."""
    narrow = cfg.narrow()
    if narrow is None or _gemv_splits_wanted(problem, cfg, device) == 1 \
            or _gemv_splits_wanted(problem, narrow, device) > 1:
        return None
    return narrow


def _gemv_choice(problem: Problem, device: DeviceInfo, forced: bool,
                 rival: tuple[float, str] | None = None, in_place: bool = False) -> Choice | None:
    """gemv where forced, or where its model beats `rival` (_gemv_rival or, read in place,
    _tile_rival's: the estimate of the tile kernels' choice, and what it is; None: no rival
    estimate, gemv is taken within GEMV_MAX_M rows). Problems of few columns run transposed
    (_gemv_transposes: C^T = B^T A^T, A is streamed). `in_place`: the operands as they lie,
    rows at any element boundary (GemvConfig.in_place)."""
    trans_c = _gemv_transposes(problem)
    if not forced and min(problem.m, problem.n) > GEMV_MAX_M:
        return None
    if trans_c and not forced and problem.n > GEMV_MAX_M:
        return None
    kp = GemvSchedule.kernel_problem(problem, GemvConfig.default(problem.dtype, False, False, 1,
                                                                 trans_c))
    if not forced and not in_place and not trans_c and kp.trans_b \
            and kp.m > GEMV_N_MAJOR_MAX_ROWS:
        return None
    # The tensor-core loops or the CUDA-core ones, whichever the model says is faster (from
    # 8 rows they differ: an FMA bound against a slower N-major stream).
    options = []
    for mma in (True, False):
        if mma and not in_place and _single_row_tail(kp):
            continue
        cfg = GemvConfig.default(kp.dtype, kp.trans_a, kp.trans_b, kp.m, trans_c, mma,
                                 in_place)
        narrow = _unsplit_narrow(problem, cfg, device)
        if narrow is not None:
            cfg, splits = narrow, 1
        else:
            splits = gemv_splits(problem, cfg, device)
        options.append((gemv_estimate_us(problem, cfg, splits, device), not mma, cfg, splits,
                        narrow is not None))
    estimate, _, cfg, splits, narrowed = min(options, key=lambda o: o[:2])
    if not forced and rival is not None and estimate >= rival[0]:
        return None
    row_groups, col_blocks = GemvSchedule.tiles(kp, cfg)
    streamed = "A streamed once as C^T = B^T A^T" if trans_c else "B streamed once"
    units = "tensor cores" if cfg.mma else "CUDA-core FMAs"
    loads = ("16-byte loads of rows read where they lie (two aligned vectors shifted into one)"
             if in_place else "16-byte loads")
    why = (f"gemv: {streamed} ({'N' if kp.trans_b else 'K'}-major, {loads}, {units}), "
           f"{col_blocks} column blocks of {cfg.block_n}"
           + (" (half-width CTAs: enough of them to need no K split)" if narrowed else "")
           + f" x {row_groups} row group(s) of {cfg.max_rows} x {splits} K split(s)"
           + (" added up in split order by each tile's last CTA" if splits > 1 else "")
           + f"; predicted {estimate:.1f} us"
           + (f" against {rival[1]} {rival[0]:.1f}" if rival is not None else "")
           + (" (forced)" if forced else ""))
    return Choice(GemvSchedule, cfg, why, 1, splits)


# gemv on operands whose rows do not start on 16 bytes, read where they lie (GemvConfig.in_place),
# for as many rows of C (or columns) as gemv takes at all (GEMV_MAX_M): the alternative reads aligned copies,
# two bytes of traffic per byte at COPY_TBPS before the product starts, or routes the call to
# cupy.matmul (copy_route_reason). In-place gemv is taken where its model beats the tile
# kernels' estimate plus those copies. Its stream is GEMV_IN_PLACE_SLOWDOWN times slower than
# from aligned rows (two loads and a shift per vector; NOTES v0.27: 99 against 54 us at
# 16 x 29821 x 2013 and 16 x 29824 x 2016, fp16, N-major B, where cuBLAS took 111 and 35).
GEMV_IN_PLACE_SLOWDOWN = 1.8


@functools.lru_cache(maxsize=4096)
def gemv_in_place_choice(problem: Problem, device: DeviceInfo, copied_bytes: int,
                         forced: bool = False) -> Choice | None:
    """gemv reading `problem`'s operands where they lie, where forced or where its estimate
    beats the tile kernels' on aligned copies of `copied_bytes` plus those copies' time; None
    otherwise. Asked when a call is planned and again when it runs: remembered, as choose()
    is."""
    if not forced and min(problem.m, problem.n) > GEMV_MAX_M:   # before the rival's estimate
        return None
    copy_time = copy_us(copied_bytes, device)
    rival = _tile_rival(problem, device)
    if rival is not None:
        rival = (rival[0] + copy_time, f"{rival[1]} on aligned copies (+{copy_time:.1f} us)")
    return _gemv_choice(problem, device, forced, rival, in_place=True)


def _gemv_transposes(problem: Problem) -> bool:
    """Whether gemv runs `problem` transposed (C^T = B^T A^T, A streamed): more than
    GEMV_MAX_M rows and fewer columns than rows."""
    return problem.m > GEMV_MAX_M and problem.n < problem.m


def _gathers_a(cfg: GemvConfig) -> bool:
    """Whether gemv's loops at `cfg` gather their A element by element over 8 or more rows:
    the transposed loops over B^T where B's rows are contiguous, from an aligned B."""
    return (cfg.trans_c and cfg.trans_a and not cfg.in_place
            and cfg.max_rows >= GEMV_MMA_ROWS[0])


def _gemv_rival(problem: Problem, device: DeviceInfo,
                tiles: Callable[[], Choice]) -> tuple[float, str] | None:
    """What unforced gemv is weighed against (_gemv_choice's rival): _tile_rival's estimate,
    and where gemv would run transposed (few columns, A streamed) gathering its A from a
    row-major B over 8-16 rows (_gathers_a), the tile kernels' own choice at its model's time
    where that is lower. On 36 + 31 random products of 8 and 16 columns with a row-major B
    (H200), that ran 1.35 x (A row-major) and 1.20 x (A transposed) the picks of
    _tile_rival alone (mostly none: gemv), and 1.38 x on 43 products of 5-15 columns whose B
    rows are not 16-byte multiples; with B as `w.T` (no gather), where the tiles' model reads
    1.1-1.6 x low on few columns, the tiles ran 0.92 x on 5-7 columns, and gemv keeps
    _tile_rival (NOTES v0.59). Fewer rows (the CUDA-core loops) were not measured against the
    tiles. `tiles`: returns the tile kernels' choice for `problem`."""
    rival = _tile_rival(problem, device)
    if not _gemv_transposes(problem):
        return rival
    kp = transposed_problem(problem)
    if not _gathers_a(GemvConfig.default(kp.dtype, kp.trans_a, kp.trans_b, kp.m, True)):
        return rival
    us = estimate_us(tiles(), problem, device)
    if us is None or (rival is not None and rival[0] <= us):
        return rival
    return us, f"the tile kernels' ({label(tiles())})"


def _with_gemv_weighed(choice: Choice, problem: Problem, device: DeviceInfo,
                       rival: tuple[float, str] | None) -> Choice:
    """`choice` (the tile kernels', where unforced gemv declined a problem in its range), its
    reason ending with gemv's model against `rival` where that rival is what declined it."""
    if rival is None:
        return choice
    gemv_us = estimate_us(_gemv_choice(problem, device, forced=True), problem, device)
    if gemv_us < rival[0]:   # declined by a rule of its own (e.g. GEMV_N_MAJOR_MAX_ROWS)
        return choice
    return replace(choice, reason=f"{choice.reason}; gemv {gemv_us:.1f} us by its model, "
                                  f"against {rival[1]} {rival[0]:.1f}")


def _single_row_tail(kp: Problem) -> bool:
    """A K-major B of one column (one row of B^T, passed without a pitch) whose K is no whole
    number of 16-byte vectors: the tensor-core loops load K's last vector whole and mask it,
    which would read past that row's end, so it takes the CUDA-core loops."""
    return not kp.trans_b and kp.n == 1 and kp.k % GEMV_VEC != 0


def _tile_rival(problem: Problem, device: DeviceInfo) -> tuple[float, str] | None:
    """(us, what) gemv is weighed against: split_k_parallel's model estimate of the config and
    split count it would take; where that is one split, the persistent tiles run the problem
    (_split_k_choice), rated at that unsplit estimate, which they beat (bench/NOTES.md v0.23).
    None where there is no estimate."""
    picks = []   # as _split_k_choice weighs them
    for cfg in split_configs(SplitKParallelSchedule, problem, device):
        splits, us = _best_split(SplitKParallelSchedule, problem, cfg, device, False)
        if us is not None:
            picks.append((us, splits))
    if not picks:
        return None
    us, splits = min(picks)
    return us, ("split_k_parallel's" if splits > 1 else
                "the persistent tiles' (rated at the unsplit 64-row tile's)")


# The single-accumulator-set kernel of each overlap kernel's tiles: where a result of rows
# that are not 16-byte aligned must be stored, the overlap kernel's 64 x 192 sets leave no
# registers for the row store (Schedule.row_store_fits) and its result would go through an
# aligned buffer and a copy: each 2-byte element of C read and written once more at 3 TB/s
# against its 2K flops at 800 TFLOP/s, about 530 / K of the product's time. The tile-time
# model puts the overlap kernel at most ~1 % ahead (OVERLAP_SPEED against one exposed epilogue
# k-block, from 16 k-blocks), and autotune found persistent 128 x 192 2-5 % ahead of it on
# several shapes (bench/NOTES.md v0.23), so the single-set kernel with the row store wins.
SINGLE_SET_OF_OVERLAP = {PersistentOverlapSchedule: PersistentSchedule,
                         PersistentClusterOverlapSchedule: PersistentClusterSchedule}


# The row store writes rows that are not 16-byte aligned whole (epilogue_tma_store.cuh) where
# a consumer's whole row block is staged at once: 1.3-1.5 TB/s against 0.9-1.1 box by box
# (NOTES v0.30). A 128 x 256 tile's ring of 2 of its 4 boxes then becomes 4, one operand stage
# fewer (4 -> 3): taken where the tile's main loop is shorter than OVERLAP_MIN_K_BLOCKS, so
# that its store, not its loads, sets the pace.
def _whole_row_staging(sched, cfg: KernelConfig, problem: Problem,
                       device: DeviceInfo) -> KernelConfig:
    """`cfg` with a consumer's whole row block staged at once (for the row store, and for
    store-bound products), where that costs no stage, or where the main loop is short and
    FAST_STAGES stages remain."""
    boxes = min(cfg.block_n // TMA_BOX_ELEMS, sched.c_boxes(cfg))
    if cfg.c_buffers >= boxes:
        return cfg
    staged = replace(cfg, c_buffers=boxes)
    stages = min(cfg.stages, sched.max_stages(staged, device.smem_per_block_optin))
    if stages == cfg.stages or (not _long_main_loop(problem) and stages >= FAST_STAGES):
        return replace(staged, stages=stages)
    return cfg


# Short K (fewer than OVERLAP_MIN_K_BLOCKS k-blocks) and rows that are not 16-byte aligned: the
# store sets the pace. Whole rows from the persistent 128 x 192 tile ran at 1.38-1.48 TB/s
# where 128 x 256's (its whole row block staged) ran at 1.15, and groups of one M-tile (each
# wave along whole rows of tiles, so that the sectors two tiles share are written at about the
# same time) at up to 1.47 against 1.14 in groups of 16 (NOTES v0.30).
ROW_STORE_SHORT_K_WIDTH = 192
ROW_STORE_SHORT_K_GROUP = 1


def _short_k_row_store(choice: Choice, problem: Problem, device: DeviceInfo) -> Choice:
    """`choice` (persistent, storing rows itself, of either tile height) on the 128-row
    ROW_STORE_SHORT_K_WIDTH tile in groups of ROW_STORE_SHORT_K_GROUP where K is short;
    unchanged otherwise."""
    cfg = choice.config
    if choice.schedule is not PersistentSchedule or _long_main_loop(problem):
        return choice
    why = choice.reason
    if cfg.block_n > ROW_STORE_SHORT_K_WIDTH:
        short_k = PersistentSchedule.deepest(problem.dtype, ROW_STORE_SHORT_K_WIDTH,
                                             problem.trans_a, problem.trans_b,
                                             device.smem_per_block_optin)
        if short_k is not None:
            short_k = replace(short_k, epilogue=cfg.epilogue, row_store=True)
        if short_k is not None and PersistentSchedule.row_store_fits(short_k):
            cfg = short_k
            why += (f"; K of {_k_blocks(problem)} k-blocks: the store sets the "
                    f"pace, whole rows of {ROW_STORE_SHORT_K_WIDTH}-wide tiles go out faster")
    return replace(choice, config=cfg, reason=why + f"; for the row store, tiles in groups "
                   f"of {ROW_STORE_SHORT_K_GROUP} M-tile instead (waves along rows of tiles)",
                   raster_group=ROW_STORE_SHORT_K_GROUP)


def row_store_choice(choice: Choice, problem: Problem, device: DeviceInfo,
                     forced: bool = False) -> Choice | None:
    """`choice` storing a result of unaligned rows itself (KernelConfig.row_store): its own
    config with the row store where that fits; else, unless the schedule was `forced`, the
    same tile on the single-set kernel (SINGLE_SET_OF_OVERLAP); None where neither (split-K,
    gemv: the result goes through an aligned buffer). A choice with a tail keeps it where
    both parts store their rows, else falls back to the choice that covers the problem alone
    (Tail.whole); the choice a sub-wave
    stream-K choice displaced stores its rows too, as does the choice a transposed choice
    displaced (which stores through TMA only)."""
    if choice.config.trans_c:   # (an autotuned one displaced none: its result is copied)
        return choice.instead and row_store_choice(choice.instead, problem, device, forced)
    if choice.instead is not None:
        own = row_store_choice(replace(choice, instead=None), problem, device, forced)
        return own and replace(own, instead=row_store_choice(choice.instead, problem, device,
                                                             forced))
    if choice.tail is not None:
        main_p, tail_p = choice.tail.problems(problem)
        main = row_store_choice(replace(choice, tail=None), main_p, device, forced)
        tail = row_store_choice(choice.tail.choice, tail_p, device, forced)
        if main is not None and tail is not None:
            return replace(main, tail=replace(choice.tail, choice=tail))
        return row_store_choice(choice.tail.whole, problem, device, forced)
    sched = choice.schedule
    if not sched.row_store_ok:
        return None
    stored = replace(choice.config, row_store=True)
    if sched.row_store_fits(stored):
        stored = replace(choice, config=stored)
        if not forced:
            stored = _short_k_row_store(stored, problem, device)
        staged = _whole_row_staging(sched, stored.config, problem, device)
        return replace(stored, config=staged) if sched.row_store_fits(staged) else stored
    single = SINGLE_SET_OF_OVERLAP.get(sched)
    if forced or single is None:
        return None
    cfg = single.deepest(problem.dtype, choice.config.block_n, problem.trans_a,
                         problem.trans_b, device.smem_per_block_optin, choice.config.block_m)
    if cfg is None:
        return None
    cfg = replace(cfg, epilogue=choice.config.epilogue, row_store=True)
    if not single.row_store_fits(cfg):
        return None
    staged = _whole_row_staging(single, cfg, problem, device)
    cfg = staged if single.row_store_fits(staged) else cfg
    why = (f"{choice.reason}; the result's rows are not 16-byte aligned: {single.name} stores "
           f"them itself, where {sched.name} (no registers for that) would copy the result out "
           f"of an aligned buffer")
    return replace(choice, schedule=single, config=cfg, reason=why)


# A phased kernel (KernelConfig.a_pitch_mod8, b_pitch_mod8: an operand read in place through
# phase maps) needs a raw buffer beside each stage, so it holds fewer stages than the aligned
# problem's choice; with fewer than PHASED_MIN_STAGES (schedules.py) it is not offered.
#
# Its time: the most k-blocks one CTA loads (waves of tiles x k-blocks, or a split's slice of
# them) x a k-block's time, which the shift sets: the raw stages pass through the producer
# warpgroup's spare warps before their wgmmas, so a k-block costs a base and a time per
# 1024 16-byte chunks shifted (8 per row of each phased tile: A's block_m rows, B's block_n
# columns' 64 k rows), whether the operands stream from DRAM or not, and never less than the
# aligned product's own estimate. PHASED_KBLOCK_US: (base, per 1024 chunks), fitted to 131
# persistent and 20 split-K phased kernels of A, B or both (M 21-251, N 1015-30172, K
# 824-31753, H100: rms error 10 % each; NOTES v0.42); split-K CTAs hold fewer stages and
# spend a slice's fixed costs, hence their larger base.
#
# Where both operands qualify, reading one from an aligned copy can win (a few rows of A
# copied, and half the shifts a k-block): each option pays for its copies (copy_us, and
# MIN_CALL_US for the copy's launch). The best option is weighed against cuBLAS reading such
# rows in place (cublas_unaligned_us, by PHASED_CUBLAS_MARGIN: that model's error, 18-26 % rms,
# put cuBLAS ahead of 4 of 28 phased products of v0.41's fit where the two estimates were
# within 15 %) and against copying every such operand before the product (as
# copy_route_reason weighs it); where those copies would take under MIN_CALL_US, they stay
# (the phased kernel's fewer stages cost more: 629 x 13020 x 174 ran 0.82 x cuBLAS phased,
# NOTES v0.41).
PHASED_KBLOCK_US = {"persistent": (0.26, 0.70), "split_k": (0.73, 0.45)}
PHASED_CHUNKS_PER_ROW = TMA_BOX_ELEMS * ELEM_BYTES // 16
PHASED_TILES = ((WGMMA_M, 128), (BLOCK_M, 64), (BLOCK_M, 128), (BLOCK_M, 192), (BLOCK_M, 256))
PHASED_CUBLAS_MARGIN = 0.85


def phased_operands(cfg: KernelConfig) -> str:
    """Which operands `cfg` reads through phase maps: "a", "b", "ab" or ""."""
    return "a" * bool(cfg.a_pitch_mod8) + "b" * bool(cfg.b_pitch_mod8)


def phased_kblock_us(choice: Choice) -> float:
    """PHASED_KBLOCK_US's time of one k-block of `choice`'s phased kernel."""
    cfg = choice.config
    base, per_kchunk = PHASED_KBLOCK_US["split_k" if choice.schedule.split_k else "persistent"]
    rows = cfg.block_m * bool(cfg.a_pitch_mod8) + cfg.block_n * bool(cfg.b_pitch_mod8)
    return base + per_kchunk * rows * PHASED_CHUNKS_PER_ROW / 1024


def cta_k_blocks(choice: Choice, problem: Problem, device: DeviceInfo) -> int:
    """The most k-blocks one CTA of `choice` loads: a split's slice of each tile's (split-K
    grids hold one CTA per SM at most) or waves of whole tiles (the persistent kernels)."""
    cfg = choice.config
    k_blocks = _k_blocks(problem)
    if choice.schedule.split_k:
        return -(-k_blocks // choice.splits)
    return _waves(choice.schedule, problem, device, (cfg.block_m, cfg.block_n)) * k_blocks


def phased_us(choice: Choice, problem: Problem, device: DeviceInfo) -> float:
    """The model above's time of the phased kernel of `choice` on `problem`."""
    return cta_k_blocks(choice, problem, device) * phased_kblock_us(choice)


def _phased_options(choice: Choice, a_pitch_mod8: int, b_pitch_mod8: int, problem: Problem,
                    device: DeviceInfo, keep_tile: bool) -> list:
    """The phased kernels `choice` may become: each operand that qualifies phased, or (where
    both do) one of them copied instead; on its own schedule, tile and splits, and unless
    `keep_tile` (a forced or autotuned choice) the persistent kernel's PHASED_TILES and
    split_k_parallel's tiles with as many splits as fit (few tiles over a long K), for which
    the phased kernel's k-block time, not the aligned product's, decides."""
    cfg, limit = choice.config, device.smem_per_block_optin
    pitches = [(a_pitch_mod8, b_pitch_mod8)]
    if a_pitch_mod8 and b_pitch_mod8:
        pitches += [(a_pitch_mod8, 0), (0, b_pitch_mod8)]
    others = [choice]
    for block_m, block_n in () if keep_tile else PHASED_TILES:
        if (PersistentSchedule, block_m, block_n) == (choice.schedule, cfg.block_m, cfg.block_n):
            continue
        other = PersistentSchedule.deepest(cfg.dtype, block_n, cfg.trans_a, cfg.trans_b, limit,
                                           block_m)
        if other is not None:
            others.append(Choice(PersistentSchedule, other, choice.reason))
    sched = SplitKParallelSchedule
    batch_count = min(problem.batch, MAX_GRID_Z)
    for other in () if keep_tile else split_configs(sched, problem, device):
        splits = sched.max_splits(problem, other, batch_count, device.sm_count)
        if splits > 1:
            others.append(Choice(sched, other, choice.reason, splits=splits))
    options = []
    for a_pitch, b_pitch in pitches:
        for other in others:
            if b_pitch and not other.config.b_phases_ok:
                continue
            kept = other.config if other is choice else replace(
                other.config, epilogue=cfg.epilogue, row_store=cfg.row_store and
                other.schedule.row_store_ok)
            options.append(replace(other, config=other.schedule.phased_config(
                kept, a_pitch, b_pitch, limit)))
    return [option for option in options if option.config.stages >= PHASED_MIN_STAGES]


def _copied_bytes(problem: Problem, copy_a: bool, copy_b: bool) -> int:
    """The bytes of aligned copies of A and/or B."""
    p = problem
    return p.batch * p.k * (p.m * copy_a + p.n * copy_b) * ELEM_BYTES


@functools.lru_cache(maxsize=4096)
def phased_choice(choice: Choice, a_pitch_mod8: int, b_pitch_mod8: int, problem: Problem,
                  device: DeviceInfo, align: int, keep_tile: bool = False) -> Choice | None:
    """`choice` reading a K-major A, an N-major B or both whose rows lie off 16 bytes in place
    through phase maps (KernelConfig.a_pitch_mod8, b_pitch_mod8: each row pitch mod 8
    elements, 0 for an operand read otherwise; `align`: the rows' alignment in bytes, as
    copy_route_reason takes it; `keep_tile`: a forced or autotuned choice keeps its schedule,
    tile and splits), or None where it cannot or should not: a schedule without them
    (`phased_ok`: the clusters, stream-K, gemv), a tail (whose part of an operand starts off 16
    bytes), a transposed choice (phaseable gives the one it displaced), no config of
    PHASED_MIN_STAGES stages beside the raw buffers, aligned copies under MIN_CALL_US, or a
    model time (above) over cuBLAS's on such rows or the aligned copies and product's. An
    operand that qualifies but whose pitch the returned config leaves 0 is read from an
    aligned copy. Its stages: the choice's, or as many as fit with the raw buffers, from an
    epilogue ring as small as one box. Asked when a call is planned and again when it runs:
    remembered, as choose() is."""
    cfg, sched = choice.config, choice.schedule
    if not getattr(sched, "phased_ok", False) or choice.tail is not None or cfg.trans_c:
        return None
    all_copied = copy_us(_copied_bytes(problem, bool(a_pitch_mod8), bool(b_pitch_mod8)), device)
    if all_copied < MIN_CALL_US:
        return None
    options = _phased_options(choice, a_pitch_mod8, b_pitch_mod8, problem, device, keep_tile)
    if not options:
        return None
    product_us = _choice_us(choice, problem, device)

    def total_us(option: Choice) -> float:
        """The option's k-blocks, at least its aligned product's estimate, and its copies."""
        copy_a = bool(a_pitch_mod8 and not option.config.a_pitch_mod8)
        copy_b = bool(b_pitch_mod8 and not option.config.b_pitch_mod8)
        copies = (copy_us(_copied_bytes(problem, copy_a, copy_b), device)
                  + MIN_CALL_US * (copy_a + copy_b))
        aligned = _choice_us(option, problem, device)
        return max(phased_us(option, problem, device), aligned or product_us or 0.0) + copies

    # The fastest option (the first, the choice's own with every operand phased, of ties).
    ours, _, phased = min((total_us(option), i, option) for i, option in enumerate(options))
    cublas = cublas_unaligned_us(problem, align, device)
    copy_path = math.inf if product_us is None else all_copied + COPY_PATH_BIAS * product_us
    if ours > min(PHASED_CUBLAS_MARGIN * cublas, copy_path):
        return None
    cfg = phased.config
    moved = (phased.schedule, cfg.block_m, cfg.block_n) != (sched, choice.config.block_m,
                                                             choice.config.block_n)
    split = (f", K split {phased.splits} ways" if phased.schedule.split_k and phased.splits > 1
             else " (fewer waves of k-blocks)")
    tile = (f" on {phased.schedule.name}'s {cfg.block_m}x{cfg.block_n} tiles{split}" if moved
            else "")
    which = phased_operands(cfg)
    rows = {"a": "A's rows", "b": "B's rows", "ab": "A's and B's rows"}[which]
    copied = [name for name, pitch in (("A", a_pitch_mod8), ("B", b_pitch_mod8))
              if pitch and name.lower() not in which]
    other = (f"; {copied[0]}, whose rows are off 16 bytes too, from an aligned copy (fewer "
             f"shifts a k-block)" if copied else "")
    why = (f"{choice.reason}; {rows} are not 16-byte aligned: read where they lie through "
           f"eight tensor maps of every eighth row and shifted in shared memory{tile} "
           f"({cfg.stages} stages){other}, ~{ours:.1f} us against cuBLAS's ~{cublas:.1f} on "
           f"such rows" + (f" and ~{copy_path:.1f} through aligned copies"
                           if product_us is not None else ""))
    return replace(phased, reason=why)


@functools.lru_cache(maxsize=4096)
def choose(problem: Problem, device: DeviceInfo, schedule: str | None = None,
           epilogue: bool = False, epilogue_reads: bool = False) -> Choice:
    """The schedule and config for `problem`. `epilogue`: the call carries a fused epilogue
    (bias, activation), which gemv does not apply: gemv is then never chosen, and forcing it
    is an error. `epilogue_reads`: that epilogue reads bias or c, which keeps the call off the
    overlap kernels. An unforced choice may leave the tiles past its last whole wave to a
    second kernel (wave_tail_choice), run on stream-K (_sub_wave_stream_k, _narrow_stream_k,
    _whole_line_narrow_stream_k) or be computed transposed (_transposed_choice; against either
    of the others, the lower model runs)."""
    choice = _choose_one(problem, device, schedule, epilogue, epilogue_reads)
    if schedule is not None:
        return choice
    rival = (wave_tail_choice(choice, problem, device, epilogue, epilogue_reads)
             or _sub_wave_stream_k(choice, problem, device))
    rival = (_narrow_stream_k(rival or choice, problem, device)
             or _whole_line_narrow_stream_k(rival or choice, problem, device) or rival)
    transposed = None if epilogue else _transposed_choice(choice, problem, device)
    if transposed is None:
        return rival or choice
    if rival is None:
        return transposed
    transposed_us, rival_us = (_choice_us(transposed, problem, device),
                               _rival_us(rival, problem, device))
    if rival_us <= transposed_us:
        return rival
    return replace(transposed, reason=f"{transposed.reason}; {rival_us:.1f} us by the model of "
                                      f"{label(rival)}")


# The transposed product. C^T = B^T A^T has the same tiles with rows and columns swapped, so
# the persistent kernels' tiles of BLOCK_M x N rows and columns also cover C as N x BLOCK_M
# (or N x 64) tiles, stored transposed (KernelConfig.trans_c): other counts of tiles along
# each side, other waves, other operand layouts. Taken for plain products where the wave model
# (_persistent_us) puts the transposed problem's persistent tile TRANSPOSE_MIN_GAIN ahead of
# the pick's on C: on 31 random products (H200) the model's lead ranked the measured gains;
# those it put 1.08 x ahead or more ran 1.12 x, none slower, those it put 1.05-1.08 x ahead
# 1.06 x, three of nine slower. Where a wave tail or stream-K takes the pick too, the lower of
# their models wins: on 45 such products the transposed tile ran 1.07 x them where its model
# was ahead (NOTES v0.58). The narrow tile keeps its problems, as it does from the 64-row
# tiles.
TRANSPOSE_MIN_GAIN = 1.08


def _transposed_choice(pick: Choice, problem: Problem, device: DeviceInfo) -> Choice | None:
    """The persistent kernels' choice for the transpose of `problem`, stored transposed, where
    the wave model puts it TRANSPOSE_MIN_GAIN ahead of `pick` (a persistent kernel's whole
    problem; the narrow tile's, the other schedules' picks and store-bound products keep
    theirs); else None. The choice keeps `pick` as the one it displaced (Choice.instead:
    results it cannot store through TMA and operands read through phase maps run on that)."""
    if (pick.schedule not in TAIL_MAIN_SCHEDULES or pick.config.block_n == NARROW_BLOCK_N
            or not problem.b_pitch_aligned or _store_bound(problem, device)):
        return None
    flipped = transposed_problem(problem)
    sched, cfg, why = _persistent_tile(PersistentSchedule, flipped, device, forced=False,
                                       epilogue_reads=False, transposed=True)
    pick_us = _persistent_us(pick.schedule, problem, device, pick.config)
    us = _persistent_us(sched, flipped, device, cfg)
    if us * TRANSPOSE_MIN_GAIN > pick_us:
        return None
    group = _raster_group(flipped, cfg, device)
    why = (f"computed as C^T = B^T A^T ({flipped.m} x {flipped.n}) and stored transposed, "
           f"{us:.1f} us by the wave model against {pick_us:.1f} us for "
           f"{pick.config.block_m}x{pick.config.block_n} tiles of C on {pick.schedule.name}: "
           f"{why}")
    return Choice(sched, replace(cfg, trans_c=True), _with_memory_plan(why, cfg, device, group),
                  group, instead=pick)


def _rival_us(rival: Choice, problem: Problem, device: DeviceInfo) -> float:
    """The model's time of a transposed choice's rival: a wave tail's two kernels
    (wave_tail_choice's sum), or stream-K's."""
    if rival.tail is None:
        return _choice_us(rival, problem, device)
    main_p, tail_p = rival.tail.problems(problem)
    return _tail_split_us(rival.schedule, rival.config, main_p,
                          _choice_us(rival.tail.choice, tail_p, device), device)


def label(choice: Choice) -> str:
    """A choice's schedule, tile, stages, raster group and splits in one line (autotune's
    candidates and table, the A/B tools, a transposed choice's reason)."""
    c = choice.config
    if choice.schedule is GemvSchedule:
        return f"gemv {c.tag} k{choice.splits}"
    counted = choice.schedule.splits_label
    split = f" {counted}{choice.splits}" if counted else ""
    tail = (f" + tail {choice.tail.axis}{choice.tail.start}: {label(choice.tail.choice)}"
            if choice.tail else "")
    transposed = " C^T" if c.trans_c else ""
    return (f"{choice.schedule.name} {c.block_m}x{c.block_n}{transposed} s{c.stages} "
            f"g{choice.raster_group}{split}{tail}")


def _persistent_tile(sched, problem: Problem, device: DeviceInfo, forced: bool,
                     epilogue_reads: bool, short: bool = True, transposed: bool = False) -> tuple:
    """(schedule, config, why) of the tile `sched` (persistent unless `forced`) runs
    `problem` on (_fastest_tile; the 64-row tiles only where `short`; whole boxes only for a
    result stored `transposed`): unforced, the widths of
    _overlap_widths on the overlap kernel where it keeps the same stages. A fused epilogue that
    reads bias or c stays off kernels whose registers leave it one pair's operands at a time
    (Schedule.epilogue_fetches_boxes: the 192-wide overlap tiles, the 192 x 192 cluster tile):
    it waits on one load per pair there where the others wait once per box (NOTES v0.19)."""
    overlap_widths = _overlap_widths(problem, device, epilogue_reads) if not forced else ()
    picked = _fastest_tile(sched, problem, device, overlap_widths, short, transposed)
    if picked is None:
        raise RuntimeError(f"{device.name}: {device.smem_per_block_optin} B of shared memory "
                           f"per block is too little for any {BLOCK_M}-row tile")
    cfg, why = picked
    if not forced and short and _few_rows(problem, device) and \
            (cfg.block_m, cfg.block_n) == FEW_ROWS_TILE:
        why = (f"at most {SHORT_TILE_MAX_M} rows: streaming B sets the pace, and the "
               f"{cfg.block_m}x{cfg.block_n} tile puts the most CTAs to it; {why}; unsplit "
               f"({_few_rows_us(problem, device):.1f} us by the model of unsplit "
               f"{cfg.block_m}x{cfg.block_n} tiles): split 64-row tiles would be slower")
    elif not forced and _short_tile_shapes(problem, device):
        unsplit = _unsplit_wave_us(problem, device)
        if unsplit is not None:
            why += (f"; unsplit ({unsplit:.1f} us by the model of one wave of unsplit tiles): "
                    f"split 64-row tiles would be slower")
    if not forced and _long_main_loop(problem) and cfg.block_n in OVERLAP_WIDTHS and \
            cfg.block_n not in overlap_widths:
        why += ("; no overlap kernel: the fused epilogue reads bias or c, which it would load "
                "one pair at a time there")
    if cfg.block_n in overlap_widths and cfg.block_m in OVERLAP_BLOCK_MS:
        overlap = PersistentOverlapSchedule.deepest(problem.dtype, cfg.block_n, problem.trans_a,
                                                    problem.trans_b, device.smem_per_block_optin,
                                                    cfg.block_m)
        if epilogue_reads and overlap is not None and \
                not PersistentOverlapSchedule.epilogue_fetches_boxes(overlap):
            overlap = None   # as _overlap_widths, for this tile's rows
        if overlap is not None and overlap.stages == cfg.stages:
            why += ("; two accumulator sets per consumer, so each tile's epilogue overlaps the "
                    "next tile's first k-block")
            sched, cfg = PersistentOverlapSchedule, overlap
    return sched, cfg, why


def _choose_one(problem: Problem, device: DeviceInfo, schedule: str | None,
                epilogue: bool, epilogue_reads: bool, short: bool = True,
                gemv: bool = True) -> Choice:
    """choose, for the whole problem on one kernel; the 64-row tiles only where `short`, gemv
    only where `gemv`."""
    if schedule in DUAL_B_SCHEDULES:
        raise ValueError(f"schedule {schedule!r} computes hopmm.matmul_shared_a and "
                         f"hopmm.swiglu, not hopmm.matmul; force another schedule for matmul")
    if schedule == GemvSchedule.name:
        if epilogue:
            raise ValueError("gemv has no fused epilogue; force another schedule for calls "
                             "with bias= or activation=")
        return _gemv_choice(problem, device, forced=True)
    if schedule is None and not epilogue and gemv and min(problem.m, problem.n) <= GEMV_MAX_M:
        # The tile kernels' choice, worked out where gemv's rival or its refusal needs it.
        tiles = functools.cache(lambda: _choose_one(problem, device, None, False,
                                                    epilogue_reads, short, gemv=False))
        rival = _gemv_rival(problem, device, tiles)
        gemv_choice = _gemv_choice(problem, device, forced=False, rival=rival)
        if gemv_choice is not None:
            return gemv_choice
        return _with_gemv_weighed(tiles(), problem, device, rival)
    if schedule == StreamKSchedule.name:
        forced_choice = _stream_k_choice(problem, device)
        if forced_choice is None:
            raise ValueError(f"stream_k: no tile of it fits {device.name}'s shared memory, or "
                             f"the batch of {problem.batch} exceeds one launch's")
        return forced_choice
    split_k_names = [s.name for s in SPLIT_K_SCHEDULES]
    if schedule is None or schedule in split_k_names:
        split = _split_k_choice(problem, device, forced=schedule, short=short)
        if split is not None:
            return split
        if schedule is not None:
            raise RuntimeError(f"{device.name}: {device.smem_per_block_optin} B of shared "
                               f"memory per block is too little for split-K's 128x128 tile")
    if schedule is None and _b_rows_unaligned(problem):
        unaligned = _unaligned_b_choice(problem, device)
        if unaligned is not None and _store_bound(problem, device):
            instead = (f"clusters of {unaligned.schedule.cluster_size} CTAs sharing B's tiles, "
                       f"whose rows are not whole 128-byte lines")
            unaligned = _store_bound_choice(problem, device, instead) or unaligned
        if unaligned is not None:
            return unaligned
    return _persistent_choice(problem, device, schedule, epilogue_reads, short)


def _unaligned_b_choice(problem: Problem, device: DeviceInfo) -> Choice | None:
    """The cluster kernel for B rows that are not whole cache lines (_b_rows_unaligned): the
    pair's fastest tile, or the four-CTA cluster's where the product has at most
    UNALIGNED_B_QUAD_MAX_N columns, the device reports the clusters' capacity and the wave model
    puts that tile ahead (_ranked_time, as _fastest_tile ranks them); None where
    neither has enough M tiles for a cluster or a tile with FAST_STAGES stages."""
    picks = []
    for sched in (UNALIGNED_B_SCHEDULE, UNALIGNED_B_QUAD_SCHEDULE):
        if -(-problem.m // BLOCK_M) < sched.cluster_size:
            continue
        if sched is UNALIGNED_B_QUAD_SCHEDULE and (
                problem.n > UNALIGNED_B_QUAD_MAX_N
                or device.clusters_at_once(sched.cluster_size) is None):
            continue
        picked = _fastest_tile(sched, problem, device)
        if picked is not None and picked[0].stages >= FAST_STAGES:
            shape = (picked[0].block_m, picked[0].block_n)
            picks.append((_ranked_time(sched, problem, device, shape,
                                       _tile_speeds(sched, problem)), sched, picked))
    if not picks:
        return None
    _, sched, (cfg, why) = min(picks, key=lambda p: p[0])
    why = (f"B's rows are not multiples of 128 B, so every 128-byte TMA box row of B spans two "
           f"cache lines: clusters of {sched.cluster_size} CTAs share each B tile and load it "
           f"once; {why}")
    if len(picks) > 1:
        other = next(p[1] for p in picks if p[1] is not sched)
        why += f" (fewer tile-times than the clusters of {other.cluster_size}'s best tile)"
    group = _raster_group(problem, cfg, device, clustered=True)
    return Choice(sched, cfg, _with_memory_plan(why, cfg, device, group), group)


def _persistent_choice(problem: Problem, device: DeviceInfo, schedule: str | None,
                       epilogue_reads: bool, short: bool = True) -> Choice:
    """_choose_one on the persistent kernels (`schedule`, where forced): the tile of the fewest
    tile-times (the 64-row tiles only where `short`), on the overlap, cluster, tall or narrow
    kernel where their rules take it."""
    # The persistent schedule ran at least as fast as one tile per CTA (bench/NOTES.md v0.3).
    base = SCHEDULES[schedule or PersistentSchedule.name]
    forced = schedule is not None
    sched, cfg, why = _persistent_tile(base, problem, device, forced, epilogue_reads, short)
    if not forced and cfg.block_m == WGMMA_M and _narrow_by_waves_range(problem) \
            and not _short_tiles_in_one_round(problem, device, cfg):
        # The narrow tile keeps the problems the wave model gives it over the 128-row tiles
        # past one round of 64-row tiles: there these ran 0.87-0.92 x it (NOTES v0.33).
        whole = _persistent_tile(base, problem, device, forced, epilogue_reads, short=False)
        if _narrow_by_waves(problem, device, whole[0], whole[1]) is not None:
            sched, cfg, why = whole
    overlap_widths = _overlap_widths(problem, device, epilogue_reads) if not forced else ()
    if not forced:
        tall = _tall_cluster(problem, device, (cfg.block_m, cfg.block_n), overlap_widths,
                             epilogue_reads)
        if tall is not None:
            sched, cfg, why = tall
        elif sched is PersistentSchedule:
            paired = _paired_tiles(problem, device, cfg)
            if paired is not None:
                sched, cfg, pairing = paired
                why = f"{why}; {pairing}"
        if _short_tiles_in_one_round(problem, device, cfg):   # the tile that stayed
            why += (f"; one round of {cfg.block_m}x{cfg.block_n} tiles over at most "
                    f"{ONE_ROUND_SHORT_MAX_K_BLOCKS} k-blocks "
                    f"({_persistent_us(sched, problem, device, cfg):.1f} us by the wave "
                    f"model): a split must beat that by {ONE_ROUND_SHORT_GAIN} x, and the "
                    f"narrow tile does not take the problem")
        else:
            narrow = _narrow_by_waves(problem, device, sched, cfg)
            if narrow is not None:
                sched, (cfg, why) = PersistentSchedule, narrow
        if _store_bound(problem, device):
            stored = _store_bound_choice(problem, device, why)
            if stored is not None:
                return stored
    group = _raster_group(problem, cfg, device, clustered=sched.cluster_size > 1)
    return Choice(sched, cfg, _with_memory_plan(why, cfg, device, group), group)


# Store-bound products (K of at most STORE_BOUND_MAX_K_BLOCKS k-blocks, a result of at least
# STORE_BOUND_C_SHARE x the operands' bytes, several waves) run at the rate C is written: each
# consumer's whole tile staged (all its stores in flight while the next tile computes), in waves
# along rows of tiles (a wave writes whole rows of C), whatever B's alignment (the clusters of
# _unaligned_b_choice ran 0.78-0.97 x this there). Of the 128-row tiles the width with fewer
# tile bytes per SM over the whole waves (ties: 256); at one k-block, results of rows of at
# least STORE_BOUND_SHORT_MIN_N columns and at least STORE_BOUND_SHORT_MIN_BYTES (about twice
# the H100's L2) on the 64 x 256 tile, which ran 1.05 x the 128-row tiles there (32 problems,
# 0.99-1.13) and 0.96 x on smaller results (9, 0.87-1.03) (NOTES v0.40; v0.32 and v0.38 for
# the rules before). Results stored by rows (KernelConfig.row_store) take the short-K row
# store's tile instead (_short_k_row_store).
# That tile's one consumer warpgroup per SM stores C at no more than STORE_BOUND_SHORT_TILE_TBPS
# over the SMs: it wins only where DRAM writes no faster, at STORE_BOUND_WRITE_TBPS on an H100
# (scaled by dram_scale). On an H200 (3.7 TB/s by that scale) it wrote 2.7-2.9 TB/s where the
# 128-row tiles' two consumers wrote 3.1-3.7 (8 results of 150-830 MB; NOTES v0.54).
STORE_BOUND_MAX_K_BLOCKS = 2
STORE_BOUND_C_SHARE = 10
STORE_BOUND_RASTER_GROUP = 1
STORE_BOUND_WIDTHS = (256, 192)
STORE_BOUND_SHORT_MAX_K_BLOCKS = 1
STORE_BOUND_SHORT_MIN_N = 7168
STORE_BOUND_SHORT_MIN_BYTES = 96 << 20
STORE_BOUND_SHORT_TILE_TBPS = 2.8
STORE_BOUND_WRITE_TBPS = 2.57


def _store_bound(problem: Problem, device: DeviceInfo) -> bool:
    return (_k_blocks(problem) <= STORE_BOUND_MAX_K_BLOCKS
            and _result_bytes(problem) >= STORE_BOUND_C_SHARE * _operand_bytes(problem)
            and _tiles(problem, BLOCK_M, STORE_BOUND_WIDTHS[0]) > device.sm_count)


def short_store_tile_keeps_pace(device: DeviceInfo) -> bool:
    """Whether the 64 x 256 store-bound tile stores C as fast as `device`'s DRAM writes it
    (STORE_BOUND_SHORT_TILE_TBPS against STORE_BOUND_WRITE_TBPS scaled by dram_scale)."""
    return STORE_BOUND_WRITE_TBPS * dram_scale(device) <= STORE_BOUND_SHORT_TILE_TBPS


def _store_bound_tile(problem: Problem, device: DeviceInfo) -> tuple[tuple[int, int], str]:
    """(the store-bound tile (above), why): 64 x 256 for large results of wide rows at one
    k-block where DRAM writes no faster than that tile stores, else the 128-row width whose
    whole waves put the fewest tile bytes on an SM."""
    short = (_k_blocks(problem) <= STORE_BOUND_SHORT_MAX_K_BLOCKS
             and problem.n >= STORE_BOUND_SHORT_MIN_N
             and _result_bytes(problem) >= STORE_BOUND_SHORT_MIN_BYTES)
    if short and short_store_tile_keeps_pace(device):
        return (WGMMA_M, STORE_BOUND_WIDTHS[0]), (
            f"one k-block, a result of at least {STORE_BOUND_SHORT_MIN_BYTES >> 20} MiB in "
            f"rows of at least {STORE_BOUND_SHORT_MIN_N} columns")

    def waves(width: int) -> int:
        return _waves(PersistentSchedule, problem, device, (BLOCK_M, width))

    def per_sm(width: int) -> int:
        return waves(width) * BLOCK_M * width * ELEM_BYTES

    width, other = sorted(STORE_BOUND_WIDTHS, key=per_sm)   # sorted keeps the first of ties
    why = (f"{waves(width)} waves of {BLOCK_M}x{width} tiles write {per_sm(width) >> 10} KiB an "
           f"SM, {waves(other)} of {BLOCK_M}x{other} {per_sm(other) >> 10}")
    if short:
        why += (f"; not {WGMMA_M}x{STORE_BOUND_WIDTHS[0]}, whose one consumer per SM stores at "
                f"most {STORE_BOUND_SHORT_TILE_TBPS:g} TB/s, below this device's DRAM")
    return (BLOCK_M, width), why


def _store_bound_choice(problem: Problem, device: DeviceInfo, why: str) -> Choice | None:
    """The persistent kernel for a store-bound problem (_store_bound), as above; `why`: the
    reason of the choice it replaces. None where that tile does not fit the device."""
    (block_m, block_n), tile_why = _store_bound_tile(problem, device)
    deepest = PersistentSchedule.deepest(problem.dtype, block_n, problem.trans_a,
                                         problem.trans_b, device.smem_per_block_optin, block_m)
    if deepest is None:
        return None
    cfg = _whole_row_staging(PersistentSchedule, deepest, problem, device)
    staging = ("the whole tile" if cfg.c_buffers == PersistentSchedule.c_boxes(cfg)
               else "a ring of boxes")
    rows = (f" in rows of {problem.n} columns" if block_m == WGMMA_M else "")
    why = (f"K of {_k_blocks(problem)} k-block{'s' if _k_blocks(problem) > 1 else ''} and a "
           f"result of {_result_bytes(problem) / 1e6:.0f} MB{rows}: the stores set the pace, "
           f"so {block_m}x{block_n} tiles ({tile_why}) with {staging} staged per consumer, in "
           f"waves along rows of tiles (instead of: {why})")
    return Choice(PersistentSchedule, cfg,
                  _with_memory_plan(why, cfg, device, STORE_BOUND_RASTER_GROUP),
                  STORE_BOUND_RASTER_GROUP)


# Products of up to NARROW_WAVES_MAX_N columns, whose tiles stream A from DRAM more than they
# compute: the narrow tile's 8 stages streamed A at ~2.75 TB/s where the 128-wide tile's 6
# reached ~2.55 (23808 x 128 x 7616, 7168 x 128 x 7168: 1.08 x), and twice the tiles fill more
# of a wave; the wave model (_persistent_us) ranked the two tiles as measured on 9 of 10 such
# problems, and puts them level where both are bound by DRAM (bench/NOTES.md v0.31).
NARROW_WAVES_MAX_N = 256


def _narrow_by_waves_range(problem: Problem) -> bool:
    """More columns than the narrow tile, at most NARROW_WAVES_MAX_N: where _narrow_by_waves
    weighs it."""
    return NARROW_BLOCK_N < problem.n <= NARROW_WAVES_MAX_N


def _narrow_by_waves(problem: Problem, device: DeviceInfo, sched, cfg: KernelConfig):
    """(config, why) of the narrow tile on the persistent kernel where the problem has more
    columns than that tile (narrower ones take it by tile-times already) but at most
    NARROW_WAVES_MAX_N, and the wave model puts it no slower than the persistent kernel
    `sched`'s `cfg`; else None."""
    if not _narrow_by_waves_range(problem):
        return None
    narrow = PersistentSchedule.deepest(problem.dtype, NARROW_BLOCK_N, problem.trans_a,
                                        problem.trans_b, device.smem_per_block_optin)
    if narrow is None or narrow.stages < FAST_STAGES:
        return None
    narrow_us = _persistent_us(PersistentSchedule, problem, device, narrow)
    chosen_us = _persistent_us(sched, problem, device, cfg)
    if narrow_us > chosen_us:
        return None
    tiles = _tiles(problem, BLOCK_M, NARROW_BLOCK_N)
    return narrow, (f"{tiles} tiles of {BLOCK_M}x{NARROW_BLOCK_N} = "
                    f"{tiles / device.sm_count:.2f} waves of {device.sm_count} SMs: "
                    f"{narrow_us:.1f} us by the wave model against {chosen_us:.1f} us for "
                    f"{cfg.block_m}x{cfg.block_n} tiles on {sched.name} ({narrow.stages} "
                    f"stages stream A faster)")


def _tall_cluster(problem: Problem, device: DeviceInfo, shape: tuple[int, int],
                  overlap_widths: tuple, epilogue_reads: bool):
    """(schedule, config, why) of the cluster kernel's TALL_TILE where the tile-time model
    puts it TALL_CLUSTER_MIN_GAIN ahead of the persistent kernels' `shape` (overlapped at
    `overlap_widths`); else None, and None for an epilogue that reads bias or c where the tall
    tile would read them one pair at a time."""
    sched = PersistentClusterSchedule
    cfg = sched.deepest(problem.dtype, TALL_TILE[1], problem.trans_a, problem.trans_b,
                        device.smem_per_block_optin, TALL_TILE[0])
    if cfg is None or cfg.stages < FAST_STAGES:
        return None
    if epilogue_reads and not sched.epilogue_fetches_boxes(cfg):
        return None
    tall = _relative_time(sched, problem, device, TALL_TILE, TILE_SPEED)
    persistent = _relative_time(PersistentSchedule, problem, device, shape, TILE_SPEED,
                                overlap_widths)
    if tall * TALL_CLUSTER_MIN_GAIN > persistent:
        return None
    workers, units = _workers(sched, device)
    waves = _tile_groups(sched, problem, TALL_TILE) / workers
    why = (f"{_tiles(problem, *TALL_TILE)} tiles of {TALL_TILE[0]}x{TALL_TILE[1]} in pairs = "
           f"{waves:.2f} waves of {workers} {units}, {persistent / tall:.2f}x fewer tile-times "
           f"than {shape[0]}x{shape[1]} tiles on the persistent kernels; clusters of "
           f"{sched.cluster_size} CTAs share each B tile")
    return sched, cfg, why


def _fetches_by_pair(sched, problem: Problem, device: DeviceInfo, width: int,
                     block_m: int) -> bool:
    """Whether `sched`'s deepest block_m x width config loads an epilogue's operands one pair
    at a time (False where there is no such config)."""
    cfg = sched.deepest(problem.dtype, width, problem.trans_a, problem.trans_b,
                        device.smem_per_block_optin, block_m)
    return cfg is not None and not sched.epilogue_fetches_boxes(cfg)


def _paired_tiles(problem: Problem, device: DeviceInfo, cfg: KernelConfig):
    """(schedule, config, why) of the cluster kernel on the persistent kernel's tile `cfg`
    where CLUSTER_WIDTHS, CLUSTER_MIN_WAVES and CLUSTER_MIN_K_BLOCKS hold and the pairs take
    no more tile-times than the tiles alone; else None."""
    sched, shape = PersistentClusterSchedule, (cfg.block_m, cfg.block_n)
    waves = _tiles(problem, *shape) / device.sm_count
    k_blocks = sched.k_blocks(problem, cfg)
    if (shape not in sched.tile_shapes() or cfg.block_n not in CLUSTER_WIDTHS
            or waves < CLUSTER_MIN_WAVES
            or k_blocks < CLUSTER_MIN_K_BLOCKS):
        return None
    paired = sched.deepest(problem.dtype, cfg.block_n, problem.trans_a, problem.trans_b,
                           device.smem_per_block_optin, cfg.block_m)
    if paired is None or paired.stages < cfg.stages:
        return None
    if (_relative_time(sched, problem, device, shape, TILE_SPEED)
            > _relative_time(PersistentSchedule, problem, device, shape, TILE_SPEED)):
        return None
    why = (f"{waves:.1f} waves of {k_blocks} k-blocks a tile: clusters of "
           f"{sched.cluster_size} CTAs share each B tile and load it once (less L2 traffic, "
           f"more work per joule at the power limit)")
    return sched, paired, why


def dual_b_choice(schedule, problem: Problem, device: DeviceInfo) -> Choice:
    """The config of a shared-A schedule (schedules.DUAL_B_SCHEDULES) for `problem`, the
    product of A with either B: its one tile width with as many stages as fit, 64 rows high
    for at most SHORT_TILE_MAX_M rows (no rows computed past M, twice the CTAs streaming the
    Bs), else 128."""
    block_n = schedule.block_ns[0]
    block_m = (WGMMA_M if problem.m <= SHORT_TILE_MAX_M and schedule.short_block_ns
               else BLOCK_M)
    cfg = schedule.deepest(problem.dtype, block_n, problem.trans_a, problem.trans_b,
                           device.smem_per_block_optin, block_m)
    if cfg is None:
        raise RuntimeError(f"{device.name}: {device.smem_per_block_optin} B of shared memory "
                           f"per block is too little for {schedule.name}'s stages")
    group = _raster_group(problem, cfg, device)
    why = (f"{schedule.name}: both products of each {cfg.block_m}x{block_n} tile from one A "
           f"tile per k-block")
    return Choice(schedule, cfg, _with_memory_plan(why, cfg, device, group), group)


def _wave_footprint(group: int, tiles_m: int, tiles_n: int, wave: int,
                    tile: tuple[int, int]) -> int:
    """Rows of A plus columns of B that `wave` consecutive tiles of the grouped order cover
    (tile_raster.cuh: `group` M-tiles, column by column), for a wave that starts on a group:
    a wave inside one group covers `group` rows of tiles and as many columns as it fills; a
    wave of whole groups covers all N-tiles and the rows of its groups."""
    group = min(group, tiles_m)
    if group * tiles_n >= wave:
        rows, cols = group, -(-wave // group)
    else:
        rows, cols = min(tiles_m, -(-wave // tiles_n)), tiles_n
    return rows * tile[0] + cols * tile[1]


def _short_one_round_group(problem: Problem, tiles_m: int) -> int:
    """M-tiles per raster group of 64-row tiles whose grid runs in one round: launched side by
    side, the CTAs that share a tile of the operand with the larger k-block slice (B where N
    exceeds M: a group of every M-tile, walked column by column; else A: groups of one,
    walked along rows). Against groups of 4: 1.00-1.43 x on seven problems where B's slice
    was the larger, and 1.02 x for groups of one on one where A's was (NOTES v0.33)."""
    return tiles_m if problem.n > problem.m else 1


def _raster_group(problem: Problem, cfg: KernelConfig, device: DeviceInfo,
                  splits: int = 1, clustered: bool = False) -> int:
    """M-tiles per raster group: NARROW_RASTER_GROUP for the narrow tile; else
    ONE_ROUND_RASTER_GROUP where every CTA of the grid (a tile's splits, the batch) is
    resident at once (unsplit 64-row tiles: _short_one_round_group); else, for kernels of
    clustered tiles, RASTER_GROUP_M, and for the others the smallest of RASTER_GROUPS whose wave (the tiles of
    sm_count // splits CTAs) has the smallest footprint; all M-tiles where there are fewer."""
    tiles_m = -(-problem.m // cfg.block_m)
    tiles_n = -(-problem.n // cfg.block_n)
    if cfg.block_n == NARROW_BLOCK_N:
        return NARROW_RASTER_GROUP
    if tiles_m * tiles_n * splits * problem.batch <= device.sm_count:
        if cfg.block_m == WGMMA_M and splits == 1:
            return _short_one_round_group(problem, tiles_m)
        return min(ONE_ROUND_RASTER_GROUP, tiles_m)
    if clustered:
        return min(RASTER_GROUP_M, tiles_m)
    wave = max(1, device.sm_count // splits)
    tile = (cfg.block_m, cfg.block_n)
    group = min(RASTER_GROUPS, key=lambda g: (_wave_footprint(g, tiles_m, tiles_n, wave, tile),
                                              g))
    return min(group, tiles_m)


def _b_rows_unaligned(problem: Problem) -> bool:
    """N-major B whose rows are not whole 128-byte lines (UNALIGNED_B_SCHEDULE's case), but
    not a narrow product's: its B of at most one box wide is read by every CTA alike from L2,
    and the narrow tile on the persistent kernel ran 1.12 x the cluster kernel's 128 x 128 on
    16384 x 32 x 4096 (bench/NOTES.md v0.31)."""
    return problem.trans_b and not problem.b_pitch_aligned and not _narrow(problem)


def _tile_speeds(sched, problem: Problem) -> dict:
    """UNALIGNED_B_TILE_SPEED (UNALIGNED_B_QUAD_TILE_SPEED for clusters of four) for the
    cluster kernels on B rows that are not whole lines, where it was measured (also when the
    schedule is forced), else TILE_SPEED."""
    if sched.cluster_size > 1 and _b_rows_unaligned(problem):
        return (UNALIGNED_B_QUAD_TILE_SPEED if sched is UNALIGNED_B_QUAD_SCHEDULE
                else UNALIGNED_B_TILE_SPEED)
    return TILE_SPEED


def _ranked_time(sched, problem: Problem, device: DeviceInfo, shape: tuple[int, int],
                 speeds: dict, overlap_widths: tuple = ()) -> float:
    """What _fastest_tile ranks a tile shape by: its _relative_time, SHORT_TILE_MIN_GAIN times
    over for a 64-row tile."""
    return (_relative_time(sched, problem, device, shape, speeds, overlap_widths)
            * (SHORT_TILE_MIN_GAIN if shape[0] == WGMMA_M else 1.0))


def _fastest_tile(sched, problem: Problem, device: DeviceInfo, overlap_widths: tuple = (),
                  short: bool = True, transposed: bool = False):
    """(config, why) of the tile shape of `sched` with the fewest tile-times (_relative_time
    under _tile_speeds; widths in `overlap_widths` will run on the overlap kernel; a 64-row
    tile's count SHORT_TILE_MIN_GAIN times over), on an exact tie the wider, then the shorter,
    among those with at least FAST_STAGES stages where any has; None if no shape fits.
    `short`: whether the 64-row tiles are candidates, `transposed`: whether the result is
    stored transposed (_offered_shapes)."""
    speeds = _tile_speeds(sched, problem)
    shapes = sorted((t for t in _offered_shapes(sched, problem, device, short, transposed)
                     if t in speeds), key=lambda t: (-t[1], t[0]))
    configs = {t: sched.deepest(problem.dtype, t[1], problem.trans_a, problem.trans_b,
                                device.smem_per_block_optin, t[0]) for t in shapes}
    fits = [t for t in shapes if configs[t] is not None]
    if not fits:
        return None
    ranked = sorted(fits, key=lambda t: (configs[t].stages < FAST_STAGES,
                                         _ranked_time(sched, problem, device, t, speeds,
                                                      overlap_widths)))
    cfg = configs[ranked[0]]
    why = "".join(f"a {m}x{n} tile leaves fewer than {MIN_STAGES} stages; "
                  for m, n in shapes if configs[m, n] is None)
    why += "".join(f"a {m}x{n} tile leaves only {configs[m, n].stages} stages; "
                   for m, n in fits if configs[m, n].stages < FAST_STAGES <= cfg.stages)
    workers, units = _workers(sched, device)
    shape = (cfg.block_m, cfg.block_n)
    tiles = _tiles(problem, *shape)
    waves = _tile_groups(sched, problem, shape) / workers
    names = "/".join(f"{m}x{n}" for m, n in shapes)
    why += (f"{tiles} tiles of {cfg.block_m}x{cfg.block_n} = {waves:.2f} waves of {workers} "
            f"{units} "
            + (f"(the fewest tile-times of tiles {names})" if len(shapes) > 1
               else f"(the only tile of the {sched.name} schedule offered)"))
    return cfg, why


def _with_memory_plan(why: str, cfg: KernelConfig, device: DeviceInfo, group: int) -> str:
    return (f"{why}; {cfg.stages} stages fit in {device.smem_per_block_optin} B of shared "
            f"memory; tiles in groups of {group} M-tiles")


# Tiles past whole waves. A persistent grid of T tiles on W SMs runs ceil(T / W) waves, and a
# last wave of few compute-bound tiles takes about as long as a full one: 17344 x 64 x 6848 has
# 136 tiles of 128 x 128 (1.03 waves), 5120^3 1,080 of 128 x 192 (8.18). Those last tiles can
# run instead as a problem of their own after whole waves (the last rows of A and C, or the
# last columns of B and C), which the split-K schedules spread over every SM. Taken where the
# wave model of the main part (_persistent_us), a second launch and the tail's own estimate
# beat the wave model of the whole by TAIL_MIN_GAIN (bench/NOTES.md v0.30). Both parts keep to
# the 128-row tiles (and the tail to its splits): where a part moved to 64-row tiles, the call
# ran 0.88-0.98 x (11 problems, NOTES v0.33).
TAIL_MIN_GAIN = 1.05
TAIL_LAUNCH_US = 2.0
# The schedules whose waves the model times, as the whole problem's choice and as the main part.
TAIL_MAIN_SCHEDULES = (PersistentSchedule, PersistentOverlapSchedule)


def _unsplit_kblock_us(shape: tuple[int, int], speed: float) -> float:
    """A k-block of a tile of `shape` running at `speed` (TILE_SPEED's scale) on the persistent
    kernels with few SMs busy: UNSPLIT_KBLOCK_US scaled by the tile's area and speed."""
    return (UNSPLIT_KBLOCK_US * TILE_SPEED[BLOCK_M, UNSPLIT_BLOCK_N] / speed
            * shape[0] * shape[1] / (BLOCK_M * UNSPLIT_BLOCK_N))


def _persistent_us(sched, problem: Problem, device: DeviceInfo, cfg: KernelConfig) -> float:
    """The persistent kernels' time, wave by wave: each wave the longer of its tiles' main
    loop (the unsplit k-block of UNSPLIT_KBLOCK_US scaled by the tile's area and TILE_SPEED,
    slower by UNSPLIT_LOAD x the share of SMs busy, plus the exposed epilogue) and its share
    of the DRAM bytes at UNSPLIT_DRAM_TBPS."""
    workers, _ = _workers(sched, device)
    shape = (cfg.block_m, cfg.block_n)
    units = _tile_groups(sched, problem, shape)
    overlapped = issubclass(sched, (PersistentOverlapSchedule, PersistentClusterOverlapSchedule))
    speed = _tile_speeds(sched, problem)[shape] * (OVERLAP_SPEED if overlapped else 1.0)
    kblock_us = _unsplit_kblock_us(shape, speed)
    blocks = _k_blocks(problem) + (0 if overlapped else EXPOSED_EPILOGUE_K_BLOCKS)
    dram_us = _dram_bytes(problem) / (UNSPLIT_DRAM_TBPS * dram_scale(device) * 1e6)
    return (_waves_us(units, workers, blocks, kblock_us, UNSPLIT_LOAD, dram_us,
                      sched.cluster_size, device) + UNSPLIT_EPILOGUE_US)


def _waves_us(units: int, workers: int, k_blocks: float, kblock_us: float, load: float,
              dram_us: float, ctas_per_unit: int, device: DeviceInfo) -> float:
    """`units` (tiles, or a cluster's tiles) of `k_blocks` each, `workers` at once, wave by
    wave: each wave the longer of a unit's k-blocks, each slower by `load` x the share of the
    SMs busy (`ctas_per_unit` a unit), and the wave's share of `dram_us`."""
    def wave_us(count: int) -> float:
        busy = count * ctas_per_unit / device.sm_count
        return max(k_blocks * kblock_us * (1 + load * busy), dram_us * count / units)

    full, last = divmod(units, workers)
    return full * wave_us(workers) + (wave_us(last) if last else 0.0)


# Stream-K in lanes (StreamKSchedule): every CTA an equal share of its lane's k-blocks. Its
# model, fitted to timings of every tile and lane direction on 12 problems (NOTES v0.32):
#   time = max(share of k-blocks and exposed epilogues * k-block * STREAM_K_KBLOCK_SCALE,
#              operand tiles all CTAs load / STREAM_K_L2_TBPS,  DRAM bytes / UNSPLIT_DRAM_TBPS)
#          + STREAM_K_PIECE_US * pieces an owner adds  +  UNSPLIT_EPILOGUE_US
# with the wave model's k-block (_persistent_us). The L2 term: CTAs at different k-blocks ask
# L2 for different lines, where a wave of whole tiles asks for each line from many SMs at
# once and is served faster. DRAM: the lanes' own operand once (it must fit L2:
# STREAM_K_L2_BYTES), the operand they share once where it fits L2 too, else once a lane.
# Unforced, the heuristic takes it only over sub-wave grids of 128-row tiles (_sub_wave_stream_k)
# and on the narrow tile where B's rows start mid-sector (_narrow_stream_k) or a whole-line pick
# runs a partial last wave (_whole_line_narrow_stream_k): elsewhere its model's picks ran
# 0.73-1.07 x the other choice, 8 of 10 slower (NOTES v0.32).
STREAM_K_KBLOCK_SCALE = 1.4
STREAM_K_L2_TBPS = 7.0
STREAM_K_PIECE_US = 1.0
STREAM_K_L2_BYTES = 24 << 20
# A grid of fewer 128-row tiles than SMs over a long K leaves SMs idle, and each busy CTA waits
# on its own panel of the operand streamed from DRAM (A on tall products; the other stays in
# L2): such picks ran 1.05-1.33 x their wave model (NOTES v0.50). There stream-K puts every SM
# to the stream, and is taken where its model is not slower than the pick's, with at least
# STREAM_K_MIN_K_BLOCKS k-blocks (shorter main loops pay the pieces and the owner's wait) and at
# most STREAM_K_MAX_CTAS_PER_TILE CTAs a tile (more pieces than its model counts; up to six held
# over such long loops, NOTES v0.55). A choice that splits off a wave tail (wave_tail_choice)
# keeps it, and a tail's own choice is not asked (neither measured).
STREAM_K_MIN_K_BLOCKS = 128
STREAM_K_MAX_CTAS_PER_TILE = 6
# Over shorter loops, from STREAM_K_OWN_TILE_MIN_K_BLOCKS, stream-K only on the pick's own tile
# and only where its model is at least STREAM_K_SHORT_GAIN x faster: a wider tile cuts each of
# its fewer tiles among more CTAs (0.76-0.97 x the pick where its model read it ahead), and on
# the pick's tile the pieces and the owner's wait eat up to ~10 % of what the model gives
# (NOTES v0.57).
STREAM_K_OWN_TILE_MIN_K_BLOCKS = 64
STREAM_K_SHORT_GAIN = 1.1
# The pick's side of that comparison, on the persistent kernels where stream-K's lanes stream
# A: at most as fast as its CTAs' own stages of A arrive. Each stage in flight waits about
# STREAM_WAIT_US on DRAM (Little's law over the H200 sweeps' picks: 1.6-2.3 us at the least on
# 128-row tiles), so a k-block takes at least that over the stages behind it; stream-K ran
# 1.11 x the picks this moves (NOTES v0.56). Not for the splits: their models, fitted on such
# grids, hold the wait already, and stream-K ran 0.97-0.98 x those it would displace; nor for
# tiles narrower than stream-K's, whose wider tiles would compute columns past N (not measured).
STREAM_WAIT_US = 2.0
# The picks it may displace: the persistent kernels', and split_k's and split_k_cluster's on
# 128-row tiles, whose 128-wide tiles read each panel of A once per column of tiles (twice over
# 192 columns, the second column half past N), where stream-K's 192- or 256-wide tiles read it
# fewer times, on every SM (1.02-1.17 x on eight such products of 192-576 columns; NOTES v0.55).
STREAM_K_DISPLACES = TAIL_MAIN_SCHEDULES + (SplitKSchedule, SplitKClusterSchedule)
# Stream-K's tiles the rules above and a forced stream-K weigh: not the narrow tile, which only
# _narrow_stream_k offers (where B's rows are narrow too).
STREAM_K_WIDE_BLOCK_NS = tuple(n for n in StreamKSchedule.block_ns if n != NARROW_BLOCK_N)
# The narrow tile's CTAs all read the same k-block of B at about the same time. Where B's rows
# are a sector or longer but start mid-sector (a pitch an odd multiple of half a sector, under
# a line: 48, 80 or 112 bytes), the narrow picks ran slower against their model than stream-K
# on the same tile did, whose CTAs read different k-blocks: by about NARROW_B_MID_SECTOR_COST
# times half a sector over the pitch (20 % on 48-byte rows, 12 % on 80, 9 % on 112; 104 tall
# products of 16-120 columns, NOTES v0.61). Stream-K on the narrow tile (one lane, every SM)
# displaces a narrow pick of such rows where its model is below the pick's charged that cost,
# over main loops of at least NARROW_STREAM_K_MIN_K_BLOCKS (those products' shortest: 14-16
# k-blocks). Not on rows of whole sectors: there stream-K ran 0.73-1.16 x the pick (32-96
# bytes), 0.64-0.99 x on whole lines, as B's aligned copies' rows are (launch.line_copy).
NARROW_B_MID_SECTOR_COST = 0.6
NARROW_STREAM_K_MIN_K_BLOCKS = 16
# On B rows of whole lines (N-major, 128 bytes: as B's copies' rows are too), a narrow pick over
# more than one wave with no tail to fill its last wave (wave_tail_choice takes none on N <=
# GEMV_MAX_M, none where the model sees no gain, and row_store_choice drops split-K's) gives way
# to stream-K on the narrow tile, in whichever lanes its model puts fastest, where that model is
# below the pick's: stream-K spreads the partial wave over every SM. On draws not looked at, 8
# products whose B is a line copy of 8 columns ran 1.14-1.36 x the pick, 6 of 64 columns in
# place 0.92-1.11 x (geomean 1.01; NOTES v0.62). split_k_cluster's model on the narrow tile
# ran 1.32-1.36 x optimistic on v0.62's probe (1.18 on the H100's sweeps, 1.22 on the H200's),
# so that pick is charged CLUSTER_NARROW_MODEL_ERROR. From main loops of
# WHOLE_LINE_STREAM_K_MIN_K_BLOCKS k-blocks.
CLUSTER_NARROW_MODEL_ERROR = 1.2
WHOLE_LINE_STREAM_K_MIN_K_BLOCKS = 16


def stream_k_us(problem: Problem, cfg: KernelConfig, group: int, ctas: int,
                device: DeviceInfo) -> float:
    """The stream-K model above, in microseconds, for lanes by raster `group` (1: rows of
    tiles; every M-tile: columns) on `ctas` CTAs."""
    shape = (cfg.block_m, cfg.block_n)
    lanes = StreamKSchedule.lanes(problem, cfg, group)
    lane_tiles = StreamKSchedule.lane_tiles(problem, cfg, group) * problem.batch
    per_lane = ctas // lanes
    k_blocks = _k_blocks(problem)
    share = -(-lane_tiles * k_blocks // per_lane)
    stored = -(-lane_tiles // per_lane)
    kblock_us = (_unsplit_kblock_us(shape, TILE_SPEED[shape])
                 * (1 + UNSPLIT_LOAD * ctas / device.sm_count))
    compute = (share + EXPOSED_EPILOGUE_K_BLOCKS * stored) * kblock_us * STREAM_K_KBLOCK_SCALE
    tiles = _tiles(problem, cfg.block_m, cfg.block_n)
    l2 = tiles * k_blocks * StreamKSchedule.stage_load_bytes(cfg) / (STREAM_K_L2_TBPS * 1e6)
    own = _lane_operand_bytes(problem, cfg, group)
    shared = _operand_bytes(problem) - own
    reads = own + shared * (1 if shared <= STREAM_K_L2_BYTES else lanes)
    dram = (reads + _result_bytes(problem)) / (UNSPLIT_DRAM_TBPS * dram_scale(device) * 1e6)
    # No pieces where a lane's tiles divide evenly among its CTAs; else an owner adds the
    # piece of every later CTA whose first k-block lies in its tile.
    pieces = 0 if lane_tiles % per_lane == 0 else -(-per_lane // lane_tiles)
    return max(compute, l2, dram) + pieces * STREAM_K_PIECE_US + UNSPLIT_EPILOGUE_US


def _lane_operand_bytes(problem: Problem, cfg: KernelConfig, group: int) -> int:
    """Bytes of the operand a lane re-reads tile after tile: A where lanes are rows of tiles,
    B where they are columns."""
    columns = StreamKSchedule.lanes_are_columns(problem, cfg, group)
    return (problem.n if columns else problem.m) * problem.k * problem.batch * ELEM_BYTES


def stream_k_choices(problem: Problem, device: DeviceInfo,
                     tile: tuple[int, int] | None = None) -> list[Choice]:
    """Stream-K on each wide tile (STREAM_K_WIDE_BLOCK_NS; only `tile`, where given) and lane
    direction that fits, with as many CTAs a lane as the SMs allow (at most one a k-block),
    each with its model's time in its reason."""
    if problem.batch > MAX_GRID_Z:
        return []
    out = []
    for shape in StreamKSchedule.tile_shapes():
        offered = shape == tile if tile is not None else shape[1] in STREAM_K_WIDE_BLOCK_NS
        if not offered:
            continue
        cfg = StreamKSchedule.deepest(problem.dtype, shape[1], problem.trans_a, problem.trans_b,
                                      device.smem_per_block_optin, shape[0])
        if cfg is None:
            continue
        for group in sorted({1, StreamKSchedule.tiles(problem, cfg)[0]}):
            ctas = StreamKSchedule.most_ctas(problem, cfg, problem.batch, group,
                                             device.sm_count)
            if not ctas:
                continue
            lanes = StreamKSchedule.lanes(problem, cfg, group)
            us = stream_k_us(problem, cfg, group, ctas, device)
            columns = StreamKSchedule.lanes_are_columns(problem, cfg, group)
            kind = (("columns" if columns else "rows") if lanes > 1
                    else ("the column" if columns else "the row"))
            why = (f"stream-K: {lanes} lane{'s' if lanes > 1 else ''} ({kind} of "
                   f"{cfg.block_m}x{cfg.block_n} tiles) of "
                   f"{ctas // lanes} CTAs each, every CTA multiplying an equal share of its "
                   f"lane's k-blocks; predicted {us:.1f} us; {cfg.stages} stages fit in "
                   f"{device.smem_per_block_optin} B of shared memory")
            out.append(Choice(StreamKSchedule, cfg, why, group, ctas))
    return out


def _stream_k_choice(problem: Problem, device: DeviceInfo,
                     tile: tuple[int, int] | None = None) -> Choice | None:
    """Forced stream-K: the tile (only `tile`, where given) and lanes its model puts fastest,
    lanes whose own operand fits STREAM_K_L2_BYTES first; None where no tile fits."""
    def key(choice: Choice):
        own = _lane_operand_bytes(problem, choice.config, choice.raster_group)
        return (own > STREAM_K_L2_BYTES, _choice_us(choice, problem, device))

    return min(stream_k_choices(problem, device, tile), key=key, default=None)


def _sub_wave_stream_k(pick: Choice, problem: Problem, device: DeviceInfo) -> Choice | None:
    """Stream-K instead of `pick` (an unforced choice on one kernel of STREAM_K_DISPLACES,
    where no wave tail was split off) where the rule above takes it; else None."""
    cfg = pick.config
    if pick.schedule not in STREAM_K_DISPLACES or cfg.block_m != BLOCK_M:
        return None
    tiles = _tiles(problem, cfg.block_m, cfg.block_n)
    k_blocks = _k_blocks(problem)
    if tiles >= device.sm_count or k_blocks < STREAM_K_OWN_TILE_MIN_K_BLOCKS:
        return None
    own_tile = k_blocks < STREAM_K_MIN_K_BLOCKS
    if own_tile and cfg.block_n not in STREAM_K_WIDE_BLOCK_NS:
        return None
    stream = _stream_k_choice(problem, device,
                              (cfg.block_m, cfg.block_n) if own_tile else None)
    if stream is None:
        return None
    group = stream.raster_group
    lane_tiles = StreamKSchedule.lane_tiles(problem, stream.config, group) * problem.batch
    per_lane = stream.splits // StreamKSchedule.lanes(problem, stream.config, group)
    if _lane_operand_bytes(problem, stream.config, group) > STREAM_K_L2_BYTES \
            or per_lane > STREAM_K_MAX_CTAS_PER_TILE * lane_tiles:
        return None
    streamed = "A" if StreamKSchedule.lanes_are_columns(problem, stream.config, group) else "B"
    model_us = _choice_us(pick, problem, device)
    waits = (streamed == "A" and pick.schedule in TAIL_MAIN_SCHEDULES
             and cfg.block_n >= min(STREAM_K_WIDE_BLOCK_NS))
    wait_us = _stream_wait_us(pick, problem, device) if waits else 0.0
    stream_us = _choice_us(stream, problem, device)
    if stream_us * (STREAM_K_SHORT_GAIN if own_tile else 1.0) > max(model_us, wait_us):
        return None
    split = pick.schedule in SPLIT_K_SCHEDULES
    model = "its model" if split else "the wave model"
    timed = (f"{model}'s {model_us:.1f} us" if model_us >= wait_us else
             f"{wait_us:.1f} us waiting on its stages of A, {model}'s {model_us:.1f}")
    if split:
        columns = -(-problem.n // cfg.block_n)
        displaced = (f"{tiles} tiles of {cfg.block_m}x{cfg.block_n} ({columns} columns of them "
                     f"over {problem.n} columns) in {pick.splits} splits "
                     f"({pick.schedule.name}) would stream {streamed} from DRAM on "
                     f"{tiles * pick.splits} of {device.sm_count} SMs over {k_blocks} "
                     f"k-blocks ({timed})")
    else:
        displaced = (f"{tiles} tiles of {cfg.block_m}x{cfg.block_n} would leave "
                     f"{device.sm_count - tiles} of {device.sm_count} SMs idle over "
                     f"{k_blocks} k-blocks, each busy CTA waiting on its panel of "
                     f"{streamed} from DRAM ({timed})")
    if own_tile:
        displaced += (f"; under {STREAM_K_MIN_K_BLOCKS} k-blocks stream-K runs the same tile, "
                      f"at least {STREAM_K_SHORT_GAIN} x ahead by its model")
    return replace(stream, reason=f"{displaced}; {stream.reason}", instead=pick)


def _b_row_bytes(problem: Problem) -> int:
    """The bytes of an N-major B's rows in whole 16-byte chunks, as TMA reads them in place."""
    return padded(problem.n, ELEM_BYTES) * ELEM_BYTES


def narrow_b_mid_sector_cost(problem: Problem) -> float:
    """The narrow tile's cost (a fraction of its model's time) of B's rows (the rule above):
    NARROW_B_MID_SECTOR_COST x half a sector over the pitch where an N-major B is read at a
    pitch of part lines (not b_pitch_aligned: in place, not from a copy of whole lines) and its
    rows (_b_row_bytes) are a sector or longer, under a line and start mid-sector; else 0."""
    if not problem.trans_b or problem.b_pitch_aligned:
        return 0.0
    pitch = _b_row_bytes(problem)
    half_sector = SECTOR_BYTES // 2
    if not (SECTOR_BYTES <= pitch < LINE_BYTES and pitch % SECTOR_BYTES == half_sector):
        return 0.0
    return NARROW_B_MID_SECTOR_COST * half_sector / pitch


def _narrow_tile_stream_k(pick: Choice, problem: Problem, device: DeviceInfo,
                          min_k_blocks: int, one_lane: bool) -> tuple | None:
    """(stream-K on the narrow tile, its model's us, `pick`'s) for the two rules above: the
    fastest by its model (of one lane where `one_lane`), where `pick` is an unforced choice on
    the narrow tile of one kernel of STREAM_K_DISPLACES (its wave tail's too) over at least
    `min_k_blocks` k-blocks; else None."""
    cfg = pick.config
    if (pick.schedule not in STREAM_K_DISPLACES or cfg.trans_c
            or (cfg.block_m, cfg.block_n) != (BLOCK_M, NARROW_BLOCK_N)
            or _k_blocks(problem) < min_k_blocks):
        return None
    scored = [(_choice_us(c, problem, device), c)
              for c in stream_k_choices(problem, device, (BLOCK_M, NARROW_BLOCK_N))
              if not one_lane or StreamKSchedule.lanes(problem, c.config, c.raster_group) == 1]
    pick_us = _rival_us(pick, problem, device)
    if not scored or pick_us is None:
        return None
    stream_us, stream = min(scored, key=lambda t: t[0])
    return stream, stream_us, pick_us


def _narrow_stream_k(pick: Choice, problem: Problem, device: DeviceInfo) -> Choice | None:
    """Stream-K on the narrow tile, in one lane (the column of its tiles) over every SM, instead
    of `pick` where B's rows start mid-sector and the rule above takes it; else None."""
    cost = narrow_b_mid_sector_cost(problem)
    found = cost and _narrow_tile_stream_k(pick, problem, device, NARROW_STREAM_K_MIN_K_BLOCKS,
                                           one_lane=True)
    if not found or found[1] > found[2] * (1 + cost):
        return None
    stream, _, pick_us = found
    return replace(stream, reason=(
        f"stream-K on the narrow tile, whose CTAs read B at different k-blocks, instead of "
        f"{label(pick)}: B's rows of {_b_row_bytes(problem)} bytes start mid-sector, and that "
        f"tile's CTAs, which read each k-block of B at once, run ~{cost:.0%} past its model's "
        f"{pick_us:.1f} us; {stream.reason}"), instead=pick)


def _whole_line_narrow_stream_k(pick: Choice, problem: Problem,
                                device: DeviceInfo) -> Choice | None:
    """Stream-K on the narrow tile, in the lanes its model puts fastest, instead of `pick`
    where B's rows are whole lines, `pick` runs more than one wave with no tail, and the rule
    above takes it; else None."""
    if (not (problem.trans_b and problem.b_pitch_aligned) or pick.tail is not None
            or _tiles(problem, BLOCK_M, NARROW_BLOCK_N) <= device.sm_count):
        return None
    found = _narrow_tile_stream_k(pick, problem, device, WHOLE_LINE_STREAM_K_MIN_K_BLOCKS,
                                  one_lane=False)
    if found is None:
        return None
    stream, stream_us, pick_us = found
    cluster = pick.schedule is SplitKClusterSchedule
    charged = pick_us * (CLUSTER_NARROW_MODEL_ERROR if cluster else 1.0)
    if stream_us > charged:
        return None
    error = f" x {CLUSTER_NARROW_MODEL_ERROR}, its error on this tile" if cluster else ""
    return replace(stream, reason=(
        f"stream-K on the narrow tile instead of {label(pick)} ({charged:.1f} us by its "
        f"model{error}); {stream.reason}"), instead=pick)


def _stream_wait_us(choice: Choice, problem: Problem, device: DeviceInfo) -> float:
    """The floor a CTA's own operand stream puts under `choice`: each of the k-blocks it runs
    (cta_k_blocks) waits STREAM_WAIT_US over the stages in flight behind the one it multiplies."""
    return (cta_k_blocks(choice, problem, device) * STREAM_WAIT_US / (choice.config.stages - 1)
            + UNSPLIT_EPILOGUE_US)


def phaseable(choice: Choice) -> Choice:
    """The choice for operands whose rows phase maps read where they lie (phased_choice): the
    displaced persistent or split-K choice where `choice` is a sub-wave stream-K's, else
    `choice`."""
    return choice.instead or choice


def _choice_us(choice: Choice, problem: Problem, device: DeviceInfo) -> float | None:
    """The model's time of `choice` on `problem`: the split-K models' estimate for its split
    count, the wave model for the persistent kernels (of the problem the kernel computes);
    None for the others."""
    if choice.schedule in SPLIT_K_SCHEDULES:
        estimates = _split_estimates(choice.schedule, problem, choice.config, device, False)
        return estimates.get(choice.splits)
    if choice.schedule in TAIL_MAIN_SCHEDULES:
        return _persistent_us(choice.schedule,
                              choice.schedule.kernel_problem(problem, choice.config), device,
                              choice.config)
    if choice.schedule is StreamKSchedule:
        return stream_k_us(problem, choice.config, choice.raster_group, choice.splits, device)
    return None


def _main_configs(problem: Problem, device: DeviceInfo, epilogue_reads: bool) -> list:
    """(schedule, config) of each 128-row tile shape the main part of a split problem may run
    on: the persistent kernel's deepest config of each shape with FAST_STAGES, on the overlap
    kernel at its widths (_overlap_widths, as _choose_one takes them)."""
    overlap_widths = _overlap_widths(problem, device, epilogue_reads)
    out = []
    for block_m, block_n in _offered_shapes(PersistentSchedule, problem, device, short=False):
        if (block_m, block_n) not in TILE_SPEED:
            continue
        sched = PersistentOverlapSchedule if block_n in overlap_widths else PersistentSchedule
        cfg = sched.deepest(problem.dtype, block_n, problem.trans_a, problem.trans_b,
                            device.smem_per_block_optin, block_m)
        if cfg is not None and cfg.stages >= FAST_STAGES:
            out.append((sched, cfg))
    return out


def _tail_start(sched, problem: Problem, device: DeviceInfo, cfg: KernelConfig,
                axis: str) -> int | None:
    """Where the tail begins along `axis`: after the rows (or columns) of tiles that fill the
    most whole waves; None where the tiles fill less than one wave or exactly whole waves."""
    workers, _ = _workers(sched, device)
    tiles_m = -(-problem.m // cfg.block_m)
    tiles_n = -(-problem.n // cfg.block_n)
    tiles = tiles_m * tiles_n * problem.batch
    if tiles < workers or tiles % workers == 0:
        return None
    full_waves = tiles // workers
    # Tiles in one row (column) of tiles, over the batch: the split cuts every matrix alike.
    across = (tiles_n if axis == "m" else tiles_m) * problem.batch
    kept = full_waves * workers // across
    step = cfg.block_m if axis == "m" else cfg.block_n
    start = kept * step
    return start if 0 < start < getattr(problem, axis) else None


def _tail_split_us(sched, cfg: KernelConfig, main_p: Problem, tail_us: float,
                   device: DeviceInfo) -> float:
    """The wave model of the main part on `sched`'s `cfg`, a second launch and the tail."""
    return _persistent_us(sched, main_p, device, cfg) + TAIL_LAUNCH_US + tail_us


def wave_tail_choice(whole: Choice, problem: Problem, device: DeviceInfo,
                     epilogue: bool = False, epilogue_reads: bool = False) -> Choice | None:
    """`whole`'s problem as a main part of whole waves on a persistent kernel and a tail on
    its own choice (for the same fused epilogue, if any: `epilogue`, `epilogue_reads` as
    for choose), where the model puts that TAIL_MIN_GAIN ahead of `whole` (see
    TAIL_MIN_GAIN); None otherwise. Problems whose whole choice the wave model times
    (TAIL_MAIN_SCHEDULES), not a tail on gemv."""
    if (whole.schedule not in TAIL_MAIN_SCHEDULES or min(problem.m, problem.n) <= GEMV_MAX_M
            or _store_bound(problem, device)):
        return None
    whole_us = _choice_us(whole, problem, device)
    best = None
    for sched, cfg in _main_configs(problem, device, epilogue_reads):
        for axis in ("m", "n"):
            start = _tail_start(sched, problem, device, cfg, axis)
            if start is None:
                continue
            main_p, tail_p = tail_problems(problem, axis, start)
            tail = _choose_one(tail_p, device, None, epilogue, epilogue_reads, short=False)
            tail_us = _choice_us(tail, tail_p, device)
            if tail_us is None:
                continue
            us = _tail_split_us(sched, cfg, main_p, tail_us, device)
            if best is None or us < best[0]:
                best = (us, sched, cfg, axis, start, main_p, tail_p, tail, tail_us)
    if best is None or best[0] * TAIL_MIN_GAIN > whole_us:
        return None
    us, sched, cfg, axis, start, main_p, tail_p, tail, tail_us = best
    group = _raster_group(main_p, cfg, device)
    rows = "rows" if axis == "m" else "columns"
    why = (f"{_tiles(main_p, cfg.block_m, cfg.block_n)} tiles of {cfg.block_m}x{cfg.block_n} "
           f"in whole waves of {device.sm_count} SMs on {sched.name} for the {rows} before "
           f"{start}, then the {getattr(tail_p, axis)} {rows} from {start} on as a problem of "
           f"their own ({tail.schedule.name}, predicted {tail_us:.1f} us): {us:.1f} us by the "
           f"wave model against {whole_us:.1f} us for the whole on {whole.schedule.name} "
           f"{whole.config.block_m}x{whole.config.block_n}")
    # Where the tail is dropped (row_store_choice) the whole choice runs its partial last
    # wave, which stream-K on the narrow tile spreads over every SM where that rule takes it.
    alone = _whole_line_narrow_stream_k(whole, problem, device) or whole
    return Choice(sched, cfg, _with_memory_plan(why, cfg, device, group), group,
                  tail=Tail(axis, start, tail, alone))
