// hmgstore row gather: out[dst(r)] = table[id(r)] for every row r of every job.
//
// A launch serves a list of *jobs* (one per table of a batch: features,
// labels, each node type ...). A job reads rows of one table, whatever tier
// each row lives in, and writes them to one dense output. Its description is
// a row of J_WORDS int64 words built by hmgstore/_cuda.py:job_words().
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
// ROWS is set by _cuda.py (-DROWS=...), which also sizes the tiles.
//
// Tiers. A row's *new id* is map[id] (or id itself when the job has no map);
// tier t holds new ids bounds[t] <= n < bounds[t+1] at base[t] + (n -
// bounds[t]) * pitch[t]. The host tier is the source table pinned in place;
// GPU and peer tiers are device buffers. Ids are range-checked by the caller
// before launch; the kernel checks again and skips a row rather than read
// outside the table (a zero-copy read out of bounds is fatal to the context).
//
// Address order. For tables with a host tier the caller passes ids sorted
// ascending and `perm`, the output position of each sorted id: sorted ids
// make neighbouring warps read neighbouring host pages. Measured on the H100,
// 2 GiB table, 500k random ids: 128 B rows 7.2 -> 27.6 GB/s, 512 B 27.0 ->
// 46.0 (benchmarks/results/tune-h100.md).
//
// What did not help (benchmarks/results/probe-kernel-h100.md, 16 GiB table):
// read-only loads (__ldg) and L2::128B / L2::256B prefetch hints were within
// 3% of plain loads at 128 B - 4 KiB rows. 16-byte vectors beat 4-byte ones
// by 20% at 4 KiB rows (49.0 vs 40.5 GB/s; a naive warp-per-row kernel with
// 4-byte loads: 39.0). Small rows are bound by the GPU's translation of
// scattered sysmem pages, not by this kernel: at 128 B the naive kernel and
// this one both read 8.4-8.8 GB/s from a 16 GiB table.

typedef long long i64;

#define MAX_TIERS 10
#ifndef ROWS
#error "ROWS (rows per team per tile) is defined by hmgstore/_cuda.py"
#endif

// Job word layout; keep in sync with the J_* constants of _cuda.py (a CPU test checks it).
#define J_IDS 0         // const int32/int64* ids (device)
#define J_PERM 1        // const int64* output position per id, or 0: position = r
#define J_OUT 2         // char* output rows, row_bytes apart
#define J_MAP 3         // const int32/int64* new id per old id, or 0: new id = id
#define J_N 4           // rows in this job
#define J_NUM_ROWS 5    // rows of the table (ids must be below)
#define J_ROW_BYTES 6
#define J_TILE_START 7  // first tile of this job in the launch
#define J_FLAGS 8       // bit 0: ids are int64; bit 1: map is int64; bits 8..15: log2 vec_bytes; bits 16..23: log2 tpr
#define J_NTIERS 9
#define J_BOUNDS 10                          // MAX_TIERS + 1 words
#define J_BASE (J_BOUNDS + MAX_TIERS + 1)    // MAX_TIERS words
#define J_PITCH (J_BASE + MAX_TIERS)         // MAX_TIERS words
#define J_WORDS (J_PITCH + MAX_TIERS)

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
    const int vec_log2 = (flags >> 8) & 0xff;
    const int tpr_log2 = (flags >> 16) & 0xff;
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
      const i64 id = (flags & 1) ? reinterpret_cast<const i64*>(ids)[r] : reinterpret_cast<const int*>(ids)[r];
      if (id < 0 || id >= num_rows) continue;  // unreachable after the caller's check
      const i64 nid = !map ? id
                    : (flags & 2) ? reinterpret_cast<const i64*>(map)[id] : reinterpret_cast<const int*>(map)[id];
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
