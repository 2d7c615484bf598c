// Slot `raster`: the order in which output tiles are visited. Launching tiles along N first
// makes each wave of CTAs span all of N for one or two rows of M tiles, so B is streamed from
// memory again for every M row. Visiting tiles in groups of `group` M-tiles (column by column
// inside a group) keeps a wave's A and B footprint small enough to be shared through L2.
#pragma once

namespace hopmm {

struct GroupedRaster {
    int tiles_m;
    int tiles_n;
    int group;  // M-tiles per group, >= 1

    // Tile coordinates of the linear tile index `t`; a bijection on [0, tiles_m * tiles_n).
    __device__ __forceinline__ void tile(int t, int& m_tile, int& n_tile) const {
        const int per_group = group * tiles_n;
        const int first_m = (t / per_group) * group;
        const int rows = min(tiles_m - first_m, group);  // the last group may be shorter
        const int in_group = t % per_group;
        m_tile = first_m + in_group % rows;
        n_tile = in_group / rows;
    }
};

}  // namespace hopmm
