#!/usr/bin/env python3
"""A probe, not part of hopmm: does it matter on which SMs a grid of fewer CTAs than SMs
streams? Each working CTA reads its own MB_PER_CTA of DRAM (one CTA an SM: the kernel asks for
most of the shared memory). The working CTAs are

  grid     a grid of G CTAs, placed as the block scheduler places them
  packed   G of a grid of one CTA an SM, those on the G lowest SM ids
  spread   G of the same grid, SM ids of one parity before the other (if neighbouring ids
           share a TPC, one SM a TPC before either takes its second)
  random   G of the same grid, on SM ids in a seeded random order

    python bench/probes/sm_placement.py OUT.json

Interleaved rounds, medians; TB/s of the bytes read.
"""
import json
import random
import statistics
import sys

import cupy

SOURCE = r"""
extern "C" __global__ void read_smids(unsigned* smids) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    if (threadIdx.x == 0) smids[blockIdx.x] = smid;
}

// rank_of_smid[smid] < 0: this CTA does not work; else it reads chunk rank_of_smid[smid]
// (use_smid != 0), or chunk blockIdx.x (use_smid == 0).
extern "C" __global__ void stream_read(const uint4* __restrict__ src,
                                       unsigned long long chunk_vecs,
                                       const int* __restrict__ rank_of_smid, int use_smid,
                                       unsigned* sink) {
    extern __shared__ unsigned char smem[];
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const int rank = use_smid ? rank_of_smid[smid] : (int)blockIdx.x;
    if (rank < 0) return;
    const uint4* p = src + (unsigned long long)rank * chunk_vecs;
    unsigned acc = 0;
    const unsigned long long step = 8ull * blockDim.x;
    for (unsigned long long i = threadIdx.x; i < chunk_vecs; i += step) {
        uint4 v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const unsigned long long idx = i + (unsigned long long)j * blockDim.x;
            v[j] = idx < chunk_vecs ? __ldcs(p + idx) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc + smem[threadIdx.x];  // keeps the loads
}
"""
MB_PER_CTA = 4
THREADS = 1024
SMEM_BYTES = 160 * 1024          # one CTA an SM
GROUPS = (24, 33, 42, 49, 66, 83, 100, 116, 132)
ROUNDS = 7
SEED = 64
REPS = 10


def main(argv) -> int:
    out_path = argv[0]
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",))
    read_smids = module.get_function("read_smids")
    stream_read = module.get_function("stream_read")
    for kernel in (read_smids, stream_read):
        kernel.max_dynamic_shared_size_bytes = SMEM_BYTES
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    smids = cupy.zeros(sms, cupy.uint32)
    stream_read_grid = (sms,)
    # One CTA an SM: which SM ids exist.
    read_smids((sms,), (32,), (smids,), shared_mem=SMEM_BYTES)
    ids = sorted(set(int(x) for x in smids.get()))
    assert len(ids) == sms, f"{len(ids)} distinct SM ids for {sms} CTAs"
    top = max(ids) + 1
    chunk_vecs = MB_PER_CTA * (1 << 20) // 16
    src = cupy.ones(max(GROUPS) * chunk_vecs * 4, cupy.uint32)
    sink = cupy.zeros(1, cupy.uint32)
    shuffled = list(ids)
    random.Random(SEED).shuffle(shuffled)
    orders = {"packed": ids, "spread": [i for i in ids if i % 2 == 0] +
              [i for i in ids if i % 2 == 1], "random": shuffled}
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    rows = []
    for g in GROUPS:
        tables = {}
        for name, order in orders.items():
            table = [-1] * top
            for rank, smid in enumerate(order[:g]):
                table[smid] = rank
            tables[name] = cupy.asarray(table, cupy.int32)

        def launch(name):
            if name == "grid":
                stream_read((g,), (THREADS,), (src, cupy.uint64(chunk_vecs), tables["packed"],
                                               cupy.int32(0), sink), shared_mem=SMEM_BYTES)
            else:
                stream_read(stream_read_grid, (THREADS,),
                            (src, cupy.uint64(chunk_vecs), tables[name], cupy.int32(1), sink),
                            shared_mem=SMEM_BYTES)

        samples = {name: [] for name in ("grid", *orders)}
        for name in samples:
            launch(name)
        for r in range(ROUNDS):
            for name in list(samples)[r % len(samples):] + list(samples)[:r % len(samples)]:
                start.record()
                for _ in range(REPS):
                    launch(name)
                stop.record()
                stop.synchronize()
                samples[name].append(cupy.cuda.get_elapsed_time(start, stop) / REPS)
        gbytes = g * MB_PER_CTA * (1 << 20) / 1e9
        tbps = {name: gbytes / statistics.median(v) for name, v in samples.items()}
        rows.append(dict(ctas=g, tbps=tbps))
        print(f"{g:4d} CTAs: " + "  ".join(f"{n} {v:.2f} TB/s" for n, v in tbps.items()),
              flush=True)
    with open(out_path, "w") as f:
        json.dump(dict(sm_ids=ids, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
