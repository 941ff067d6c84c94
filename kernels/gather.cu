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
// GPU and peer tiers are device buffers. A tier may store its rows in a narrower
// format (bit t of J_NARROW; the job's format in F_FMT_*: float16, bfloat16, or float8/int8 values with a float32 scale per row, hmgstore/rows/formats.py): the kernel
// decodes them into the float32 output, so 2-3.6x fewer bytes cross PCIe and a GPU tier holds as many more rows.
//
// Bad ids. CPU ids are range-checked at the public entry
// (hmgstore/rows/ids.py). GPU ids are checked here: the kernel never reads a
// row for an id outside the table (a zero-copy read out of bounds is fatal
// to the CUDA context); it fills that output row with 0xFF bytes (NaN for
// floats) and, given an error record `err`, writes the first bad id there
// (layout E_* in gather_job.cuh), which the host reads without waiting
// (hmgstore/cuda/deferred.py: deferred checks).
//
// Passes. `pass` (PASS_* in gather_job.cuh) says which rows a launch copies:
// all of them, or those of the job's local tiers (J_LOCAL) or of the others;
// a split gather runs the two, each row copied by one. Bad ids belong to the
// PASS_ALL and PASS_REMOTE launches, so each is filled and recorded once.
//
// Address order. For tables with a host tier the caller passes ids grouped
// by ~2 MiB of the host tier (hmgstore/cuda/order.py) and `perm`, the output
// position of each: grouped ids make neighbouring warps read neighbouring
// host pages (4x the rate of random order for 128 B rows; benchmarks/NOTES.md).

typedef long long i64;

#ifndef ROWS
#error "ROWS (rows per team per tile) is defined by hmgstore/cuda/gather.py"
#endif
// NARROW: 1 in the build that decodes narrow tiers, 0 in the one that has none. The decoding costs 16
// registers a thread, one resident block less per SM, which the build without it does not pay (the GPU
// tier at 128 B rows: 0.61 of index_select with it, see benchmarks/NOTES.md).
#ifndef NARROW
#error "NARROW (0 or 1) is defined by hmgstore/cuda/gather.py"
#endif

// Row k is copied when src[k] is set and bit k of `narrow` is clear (narrow rows are decoded instead).
template <typename V>
__device__ __forceinline__ void copy_rows(const char* const (&src)[ROWS], char* const (&dst)[ROWS],
                                          unsigned narrow, i64 nvec, int lane, int tpr) {
  for (i64 v = lane; v < nvec; v += tpr) {
    V r[ROWS];
#pragma unroll
    for (int k = 0; k < ROWS; ++k)
      if (src[k] && !((narrow >> k) & 1)) r[k] = reinterpret_cast<const V*>(src[k])[v];
#pragma unroll
    for (int k = 0; k < ROWS; ++k)
      if (src[k] && !((narrow >> k) & 1)) reinterpret_cast<V*>(dst[k])[v] = r[k];
  }
}

// float16 bits -> float32, exactly as a conversion on the CPU does (subnormals, infinities, NaN payloads).
__device__ __forceinline__ float half_bits_to_float(unsigned int h) {
  const unsigned int sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = (float)m * 5.9604644775390625e-08f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}

// float8 e4m3 (finite-only "fn" variant: no infinities, 0x7f/0xff NaN) bits -> float32, exactly as torch converts.
__device__ __forceinline__ float e4m3_bits_to_float(unsigned int b) {
  const unsigned int sign = (b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 0x7u;
  if (e == 0) {
    const float v = (float)m * 0.001953125f;  // m * 2^-9, exact
    return sign ? -v : v;
  }
  if (e == 15 && m == 7) return __uint_as_float(sign | 0x7fc00000u);
  return __uint_as_float(sign | ((e + 120) << 23) | (m << 20));
}

template <int FMT>
__device__ __forceinline__ float stored_to_float(unsigned int bits) {
  if (FMT == FMT_F16) return half_bits_to_float(bits);
  if (FMT == FMT_BF16) return __uint_as_float(bits << 16);
  if (FMT == FMT_E4M3) return e4m3_bits_to_float(bits);
  return (float)(signed char)(bits & 0xffu);  // FMT_INT8
}

// 32-bit word w of a loaded vector (a load narrower than 4 bytes is its own word 0).
__device__ __forceinline__ unsigned int word_of(unsigned char r, int) { return r; }
__device__ __forceinline__ unsigned int word_of(unsigned short r, int) { return r; }
__device__ __forceinline__ unsigned int word_of(unsigned int r, int) { return r; }
__device__ __forceinline__ unsigned int word_of(const uint4& r, int w) {
  return w == 0 ? r.x : w == 1 ? r.y : w == 2 ? r.z : r.w;
}

// Stored value i (ES bytes) of a loaded vector L: its bytes in memory order, little-endian. With i a
// compile-time constant (unrolled loops) this is a register shift and mask.
template <typename L, int ES>
__device__ __forceinline__ unsigned int stored_value(const L& r, int i) {
  return (word_of(r, (i * ES) >> 2) >> (((i * ES) & 3) * 8)) & (ES == 2 ? 0xffffu : 0xffu);
}

// Rows k with bit k of `narrow` set, stored in format FMT -> float32 rows of `elems` values. Each thread loads
// one L (V stored values) of every such row before it decodes any, as copy_rows does, then writes V floats
// (float4 stores when V is a multiple of 4). Scaled formats: one float32 multiply by the row's scale, stored
// after its values at the next multiple of 4 bytes: value * scale, as hmgstore/rows/formats.py decodes.
template <int FMT, typename L>
__device__ __forceinline__ void decode_rows(const char* const (&src)[ROWS], char* const (&dst)[ROWS],
                                            unsigned narrow, i64 elems, int lane, int tpr) {
  constexpr int ES = (FMT == FMT_F16 || FMT == FMT_BF16) ? 2 : 1;
  constexpr int V = (int)sizeof(L) / ES;
  constexpr bool SCALED = FMT == FMT_E4M3 || FMT == FMT_INT8;
  // The scale is loaded with the first values, in the same round trip: for small host rows a load before
  // the loop would cost a second PCIe round trip per row.
  const i64 scale_at = (elems * ES + 3) & ~(i64)3;
  float scale[ROWS];
  bool first = true;
  for (i64 v = lane; v < elems / V; v += tpr, first = false) {
    L r[ROWS];
#pragma unroll
    for (int k = 0; k < ROWS; ++k) {
      if (!((narrow >> k) & 1)) continue;
      r[k] = reinterpret_cast<const L*>(src[k])[v];
      if (SCALED && first) scale[k] = *reinterpret_cast<const float*>(src[k] + scale_at);
    }
#pragma unroll
    for (int k = 0; k < ROWS; ++k) {
      if (!((narrow >> k) & 1)) continue;
      float f[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        f[i] = stored_to_float<FMT>(stored_value<L, ES>(r[k], i));
        if (SCALED) f[i] = __fmul_rn(f[i], scale[k]);
      }
      float* out = reinterpret_cast<float*>(dst[k]) + v * V;
      if (V % 4 == 0) {
#pragma unroll
        for (int i = 0; i + 3 < V; i += 4)
          reinterpret_cast<float4*>(out)[i / 4] = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = f[i];
      }
    }
  }
}

// The decode for a job's format and load width (log2 of values per load: 0, 2, 3 or 4; gather.py picks it).
__device__ __forceinline__ void decode_job_rows(const char* const (&src)[ROWS], char* const (&dst)[ROWS],
                                                unsigned narrow, i64 elems, int lane, int tpr, int fmt, int vlog2) {
  switch (fmt) {
    case FMT_F16:
      if (vlog2 == 3) decode_rows<FMT_F16, uint4>(src, dst, narrow, elems, lane, tpr);
      else decode_rows<FMT_F16, unsigned short>(src, dst, narrow, elems, lane, tpr);
      break;
    case FMT_BF16:
      if (vlog2 == 3) decode_rows<FMT_BF16, uint4>(src, dst, narrow, elems, lane, tpr);
      else decode_rows<FMT_BF16, unsigned short>(src, dst, narrow, elems, lane, tpr);
      break;
    case FMT_E4M3:
      if (vlog2 == 4) decode_rows<FMT_E4M3, uint4>(src, dst, narrow, elems, lane, tpr);
      else if (vlog2 == 2) decode_rows<FMT_E4M3, unsigned int>(src, dst, narrow, elems, lane, tpr);
      else decode_rows<FMT_E4M3, unsigned char>(src, dst, narrow, elems, lane, tpr);
      break;
    default:
      if (vlog2 == 4) decode_rows<FMT_INT8, uint4>(src, dst, narrow, elems, lane, tpr);
      else if (vlog2 == 2) decode_rows<FMT_INT8, unsigned int>(src, dst, narrow, elems, lane, tpr);
      else decode_rows<FMT_INT8, unsigned char>(src, dst, narrow, elems, lane, tpr);
      break;
  }
}

#ifdef LB_THREADS  // threads per block, min blocks per SM: caps registers so more blocks fit
#define HMG_BOUNDS __launch_bounds__(LB_THREADS, LB_MIN_BLOCKS)
#else
#define HMG_BOUNDS
#endif

extern "C" __global__ void HMG_BOUNDS hmg_gather(const i64* __restrict__ jobs, int num_jobs, i64 total_tiles,
                                                i64* err, int pass) {
#ifdef LB_THREADS
  pass = PASS_ALL;  // whole-SM launches take one pass (hmgstore/cuda/gather.py: passes): its logic compiled out
#endif
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
    const i64 narrow = job[J_NARROW];
    // bit t set: this pass leaves tier t's rows to the other one
    const i64 skip = pass == PASS_ALL ? 0 : pass == PASS_LOCAL ? ~job[J_LOCAL] : job[J_LOCAL];

    const char* src[ROWS];
    char* dst[ROWS];
    unsigned narrow_rows = 0, bad_rows = 0;  // bit k: row k is stored narrow / has an id out of range
#pragma unroll
    for (int k = 0; k < ROWS; ++k) {
      src[k] = nullptr;
      dst[k] = nullptr;
      const i64 r = first + k * teams;
      if (r >= n) continue;
      const i64 id = (flags & F_IDS64) ? reinterpret_cast<const i64*>(ids)[r] : reinterpret_cast<const int*>(ids)[r];
      if (id < 0 || id >= num_rows) {
        if (pass == PASS_LOCAL) continue;  // the remote pass reports it
        const i64 position = perm ? perm[r] : r;
        dst[k] = reinterpret_cast<char*>(job[J_OUT]) + position * row_bytes;
        bad_rows |= 1u << k;
        if (err && lane == 0 &&
            atomicCAS(reinterpret_cast<unsigned long long*>(err + E_FLAG), 0ull, 1ull) == 0ull) {
          err[E_JOB] = j;
          err[E_POSITION] = position;
          err[E_VALUE] = id;
        }
        continue;
      }
      const i64 nid = !map ? id
                    : (flags & F_MAP64) ? reinterpret_cast<const i64*>(map)[id] : reinterpret_cast<const int*>(map)[id];
      int t = 0;
      while (t < ntiers && nid >= job[J_BOUNDS + t + 1]) ++t;
      if (t == ntiers || nid < job[J_BOUNDS]) continue;
      if ((skip >> t) & 1) continue;
      src[k] = reinterpret_cast<const char*>(job[J_BASE + t]) + (nid - job[J_BOUNDS + t]) * job[J_PITCH + t];
      dst[k] = reinterpret_cast<char*>(job[J_OUT]) + (perm ? perm[r] : r) * row_bytes;
      if ((narrow >> t) & 1) narrow_rows |= 1u << k;
    }
    const i64 nvec = row_bytes >> vec_log2;
    switch (vec_log2) {
      case 4: copy_rows<uint4>(src, dst, narrow_rows, nvec, lane, tpr); break;
      case 3: copy_rows<uint2>(src, dst, narrow_rows, nvec, lane, tpr); break;
      case 2: copy_rows<unsigned int>(src, dst, narrow_rows, nvec, lane, tpr); break;
      case 1: copy_rows<unsigned short>(src, dst, narrow_rows, nvec, lane, tpr); break;
      default: copy_rows<unsigned char>(src, dst, narrow_rows, nvec, lane, tpr); break;
    }
#if NARROW
    if (narrow_rows)
      decode_job_rows(src, dst, narrow_rows, row_bytes >> 2, lane, tpr, (int)((flags >> F_FMT_SHIFT) & 0xff),
                      (int)((flags >> F_NVEC_SHIFT) & 0xff));
#endif
    if (bad_rows) {
#pragma unroll
      for (int k = 0; k < ROWS; ++k)
        if ((bad_rows >> k) & 1)
          for (i64 b = lane; b < row_bytes; b += tpr) dst[k][b] = (char)0xff;
    }
  }
}
