// Row copies of 16-bit matrices between any two pitches, for the operands TMA cannot read in
// place (rows that do not start on 16 bytes) and the results it cannot store in place: two
// copies per launch (blockIdx.y picks one), so a repeated call copies A and B in one launch.
// Each thread moves one 16-byte chunk of 8 elements: one vector access on a side whose rows
// start on 16 bytes, else 8 element accesses, which a warp still makes contiguous. A copy
// into one of hopmm's padded buffers (`pad`) writes each row's last chunk whole, its elements
// past the row's end as zeros (they lie inside the padding): the masked vector loads of gemv
// then read zeros, never uninitialised memory. Any other copy (into the caller's result)
// writes the row's elements and nothing else.
#pragma once

namespace hopmm {

struct RowCopy {
    const unsigned short* src;
    unsigned short* dst;
    int rows;
    int width;        // elements of a row
    int src_pitch;    // elements from one row to the next
    int dst_pitch;
    int pad;          // nonzero: dst rows are padded to whole chunks, which may be written
};

constexpr int kCopyChunk = 8;   // elements of one 16-byte chunk

__device__ __forceinline__ bool rows_on_16_bytes(const void* base, int pitch) {
    return (reinterpret_cast<unsigned long long>(base) % 16 == 0) && (pitch % kCopyChunk == 0);
}

__device__ __forceinline__ void copy_rows(const RowCopy& job) {
    const long long chunks_per_row = (static_cast<long long>(job.width) + kCopyChunk - 1) /
                                     kCopyChunk;
    const long long chunks = chunks_per_row * job.rows;
    const bool src_vector = rows_on_16_bytes(job.src, job.src_pitch);
    const bool dst_vector = rows_on_16_bytes(job.dst, job.dst_pitch);
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks;
         i += step) {
        const long long row = i / chunks_per_row;
        const int col = static_cast<int>(i - row * chunks_per_row) * kCopyChunk;
        const unsigned short* s = job.src + row * job.src_pitch + col;
        unsigned short* d = job.dst + row * job.dst_pitch + col;
        const int valid = min(kCopyChunk, job.width - col);
        union {
            uint4 vector;
            unsigned short element[kCopyChunk];
        } chunk;
        if (src_vector && valid == kCopyChunk) {
            chunk.vector = *reinterpret_cast<const uint4*>(s);
        } else {
#pragma unroll
            for (int e = 0; e < kCopyChunk; ++e) chunk.element[e] = e < valid ? s[e] : 0;
        }
        if (dst_vector && (valid == kCopyChunk || job.pad)) {
            *reinterpret_cast<uint4*>(d) = chunk.vector;
        } else {
#pragma unroll
            for (int e = 0; e < kCopyChunk; ++e) {
                if (e < valid) d[e] = chunk.element[e];
            }
        }
    }
}

}  // namespace hopmm
