// Split-K's division of a tile's k-blocks among the CTAs of grid y: split s multiplies k-blocks
// [s * q + min(s, r), ...), q = blocks / splits, r = blocks % splits (the first r splits take
// one more). The host keeps splits <= blocks, so no split is empty.
#pragma once

namespace hopmm {

struct KSlice {
    int first;  // first k-block
    int count;  // k-blocks
};

__device__ __forceinline__ KSlice k_slice(int k_blocks, int splits, int split) {
    const int per_split = k_blocks / splits, extra = k_blocks % splits;
    return KSlice{split * per_split + min(split, extra), per_split + (split < extra ? 1 : 0)};
}

}  // namespace hopmm
