// hmgstore row gather: out[dst(r)] = table[id(r)] for every row r of every job.
//
// A launch serves a list of *jobs* (one per table of a batch: features,
// labels, each node type ...). A job reads rows of one table, whatever tier
// each row lives in, and writes them to one dense output. Its description is
// a row of J_WORDS int64 words (layout: gather_job.cuh, which the compiler sees
// in front of this file; built by hmgstore/cuda/gather.py:job_words()).
//
// Thread mapping. Work is cut into *tiles* of ROWS * blockDim.x / tpr rows
// of one job; the grid strides over tiles (a persistent grid, so a capped
// grid caps the share of the GPU the gather holds). Inside a block, a *team*
// of tpr consecutive threads (tpr a power of two <= 32, chosen per job so
// that a team covers a row in as few passes as possible) copies ROWS rows of
// the tile: team t takes rows t, t + teams, t + 2 * teams, ... Each pass,
// thread `lane` loads vector `v` (v = lane, lane + tpr, ...) of all its ROWS
// rows before storing any, so every thread keeps ROWS independent reads in
// flight whatever the row size (PCIe latency is ~1-2 us; HBM's ~0.6 us).
// vec_bytes is the widest of 16/8/4/2/1 that divides the row size, the row
// pitch and every base pointer, so a team's accesses are aligned and
// coalesced: with 16-byte vectors, 8 threads read one 128-byte line.
// ROWS is set by hmgstore/cuda/gather.py (-DROWS=...), which also sizes the tiles.
//
// Tiers. A row's *new id* is map[id] (or id itself when the job has no map);
// tier t holds new ids bounds[t] <= n < bounds[t+1] at base[t] + (n -
// bounds[t]) * pitch[t]. The host tier is the source table pinned in place;
// GPU and peer tiers are device buffers. Ids are range-checked once, at the
// public entry (hmgstore/index.py); the kernel checks again and skips a row
// rather than read outside the table, because a zero-copy read out of bounds
// is fatal to the CUDA context.
//
// Address order. For tables with a host tier the caller passes ids sorted
// ascending and `perm`, the output position of each sorted id: sorted ids
// make neighbouring warps read neighbouring host pages (4x the rate of
// random order for 128 B rows; benchmarks/NOTES.md).

typedef long long i64;

#ifndef ROWS
#error "ROWS (rows per team per tile) is defined by hmgstore/cuda/gather.py"
#endif

template <typename V>
__device__ __forceinline__ void copy_rows(const char* const (&src)[ROWS], char* const (&dst)[ROWS],
                                          i64 nvec, int lane, int tpr) {
  for (i64 v = lane; v < nvec; v += tpr) {
    V r[ROWS];
#pragma unroll
    for (int k = 0; k < ROWS; ++k)
      if (src[k]) r[k] = reinterpret_cast<const V*>(src[k])[v];
#pragma unroll
    for (int k = 0; k < ROWS; ++k)
      if (src[k]) reinterpret_cast<V*>(dst[k])[v] = r[k];
  }
}

#ifdef LB_THREADS  // threads per block, min blocks per SM: caps registers so more blocks fit
#define HMG_BOUNDS __launch_bounds__(LB_THREADS, LB_MIN_BLOCKS)
#else
#define HMG_BOUNDS
#endif

extern "C" __global__ void HMG_BOUNDS hmg_gather(const i64* __restrict__ jobs, int num_jobs, i64 total_tiles) {
  for (i64 tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    int j = 0;
    while (j + 1 < num_jobs && jobs[(j + 1) * J_WORDS + J_TILE_START] <= tile) ++j;
    const i64* job = jobs + (i64)j * J_WORDS;
    const i64 flags = job[J_FLAGS];
    const int vec_log2 = (flags >> F_VEC_SHIFT) & 0xff;
    const int tpr_log2 = (flags >> F_TPR_SHIFT) & 0xff;
    const int tpr = 1 << tpr_log2;
    const i64 teams = blockDim.x >> tpr_log2;
    const i64 first = (tile - job[J_TILE_START]) * teams * ROWS + (threadIdx.x >> tpr_log2);
    const int lane = threadIdx.x & (tpr - 1);
    const i64 n = job[J_N], num_rows = job[J_NUM_ROWS], row_bytes = job[J_ROW_BYTES];
    const void* ids = reinterpret_cast<const void*>(job[J_IDS]);
    const i64* perm = reinterpret_cast<const i64*>(job[J_PERM]);
    const void* map = reinterpret_cast<const void*>(job[J_MAP]);
    const int ntiers = (int)job[J_NTIERS];

    const char* src[ROWS];
    char* dst[ROWS];
#pragma unroll
    for (int k = 0; k < ROWS; ++k) {
      src[k] = nullptr;
      dst[k] = nullptr;
      const i64 r = first + k * teams;
      if (r >= n) continue;
      const i64 id = (flags & F_IDS64) ? reinterpret_cast<const i64*>(ids)[r] : reinterpret_cast<const int*>(ids)[r];
      if (id < 0 || id >= num_rows) continue;  // unreachable after the caller's check
      const i64 nid = !map ? id
                    : (flags & F_MAP64) ? reinterpret_cast<const i64*>(map)[id] : reinterpret_cast<const int*>(map)[id];
      int t = 0;
      while (t < ntiers && nid >= job[J_BOUNDS + t + 1]) ++t;
      if (t == ntiers || nid < job[J_BOUNDS]) continue;
      src[k] = reinterpret_cast<const char*>(job[J_BASE + t]) + (nid - job[J_BOUNDS + t]) * job[J_PITCH + t];
      dst[k] = reinterpret_cast<char*>(job[J_OUT]) + (perm ? perm[r] : r) * row_bytes;
    }
    const i64 nvec = row_bytes >> vec_log2;
    switch (vec_log2) {
      case 4: copy_rows<uint4>(src, dst, nvec, lane, tpr); break;
      case 3: copy_rows<uint2>(src, dst, nvec, lane, tpr); break;
      case 2: copy_rows<unsigned int>(src, dst, nvec, lane, tpr); break;
      case 1: copy_rows<unsigned short>(src, dst, nvec, lane, tpr); break;
      default: copy_rows<unsigned char>(src, dst, nvec, lane, tpr); break;
    }
  }
}
