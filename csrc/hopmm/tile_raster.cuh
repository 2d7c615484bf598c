// Slot `raster`: the order in which output tiles are visited. Launching tiles along N first
// makes each wave of CTAs span all of N for one or two rows of M tiles, so B is streamed from
// memory again for every M row. Visiting tiles in groups of `group` M-tiles (column by column
// inside a group) keeps a wave's A and B footprint small enough to be shared through L2.
#pragma once

namespace hopmm {

// One tile of a walk over batch slices: the batch slice and the tile's coordinates in it.
struct TileCoord {
    int z;
    int m_tile;
    int n_tile;
};

struct GroupedRaster {
    int tiles_m;
    int tiles_n;
    int group;  // M-tiles per group, >= 1
    int m, n;   // the output's extent, which the tiles cover (the last ones past it)

    // Tile coordinates of the linear tile index `t`; a bijection on [0, tiles_m * tiles_n).
    __device__ __forceinline__ void tile(int t, int& m_tile, int& n_tile) const {
        const int per_group = group * tiles_n;
        const int first_m = (t / per_group) * group;
        const int rows = min(tiles_m - first_m, group);  // the last group may be shorter
        const int in_group = t % per_group;
        m_tile = first_m + in_group % rows;
        n_tile = in_group / rows;
    }

    __device__ __forceinline__ int per_slice() const { return tiles_m * tiles_n; }

    // The tile of a grid with one CTA per tile: blockIdx.x in raster order, blockIdx.z the
    // batch slot of the launch (grids hold at most 65535 batches; a launch starts at slice
    // `batch_offset`).
    __device__ __forceinline__ TileCoord block_tile(int batch_offset) const {
        TileCoord c;
        c.z = batch_offset + blockIdx.z;
        tile(blockIdx.x, c.m_tile, c.n_tile);
        return c;
    }

    // Tile `t` of a walk that visits batch slice after batch slice, each in raster order,
    // starting at slice `batch_offset` (the persistent skeletons' tile sequence).
    __device__ __forceinline__ TileCoord batched(int t, int batch_offset) const {
        TileCoord c;
        c.z = batch_offset + t / per_slice();
        tile(t % per_slice(), c.m_tile, c.n_tile);
        return c;
    }
};

}  // namespace hopmm
