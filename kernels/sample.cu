// hmgstore neighbour sampling: one hop, one edge type. Built by hmgstore/cuda/sample.py.
//
// The topology is CSC: the neighbours of destination v are row[colptr[v] .. colptr[v+1]).
// `row` lives in two tiers, like a feature table: the adjacency lists of hot nodes packed in
// GPU memory (positions [0, G)), and the whole `row` array in pinned host memory, read
// zero-copy (positions [G, G + E)). start[v] is where v's list begins in that position
// space (G + colptr[v] for a host list); with no GPU tier, start is colptr itself.
//
// The hop's seeds are nodes[lohi[0] .. lohi[1]) (node keys; in disjoint mode a key is
// owner * num_dst + node). The bounds live in device memory, so a hop can be queued before
// the previous one's size is known: kernels are launched over an upper bound of the work
// and threads past the real end return. Seed i gets c_i = counts[i] output slots ending at
// ends[i] (an inclusive scan of the counts), each holding a *position* p in [0, deg_i): the
// neighbour is row[start[v] + p] and the CSC edge id colptr[v] + p. The hop's slot count is
// ends[last], also read on the device.
//
// A *chunked* topology (`tiers` given; start and the two tiers above unused) keeps `row` as a table of
// chunks of `chunk` ids, placed like a feature table (gather_job.cuh, which the compiler sees in front
// of this file: the table's map and tiers, e.g. hot chunks on this GPU, other chunks in the shards of
// the node's other GPUs, read over NVLink, and the rest in pinned host memory). The id at CSC position
// p is id p % chunk of chunk p / chunk; the last positions, from `tail_start` on (fewer than a chunk),
// are in `tail`, on this GPU.
//
// Randomness is a counter-based hash, so a draw depends only on (key, i, t), never on
// thread scheduling: the same key gives the same sample on any GPU, and on the CPU, where
// hmgstore/graph/hop.py computes the same function with torch (bit-identical). `draw_index`, when
// given, replaces i in the draws: seed i draws as the draw_index[i]-th seed of another sampler's hop
// (an owner machine sampling a requester's seeds: hmgstore/distributed/sampling.py). The key
// is read from device memory, so a captured CUDA graph of a batch draws new samples each
// time it is replayed with new keys.
//
// Edge weights (weighted sampling) sit beside the ids in the same position space: `gpu_weight[at]`
// for at < G, `host_weight[at - G]` above, or, for a chunked topology, their own placed chunk table
// (`wtiers`, same chunk size) and `wtail`. They are float32. `wmax[v]` (float32, per destination, on
// this GPU) is v's largest weight where its list is balanced enough for rejection sampling, else 0
// (graph/weighted.py's rejection_wmax decides, once per topology, for the CPU and the GPU alike).
//
// Temporal sampling (hmgstore/graph/temporal.py) narrows each seed's list to a *window*: positions
// [win_lo[i], win_lo[i] + win_deg[i]) of its list, the edges no later than the seed's time. When
// win_lo / win_deg are given, every kernel below reads deg as win_deg[i] and positions from win_lo[i]
// on; the edge id of window position p is colptr[v] + win_lo[i] + p.
//
// Kernels, one thread per seed or per slot:
// - hmg_sample_window: per seed, the window: a binary search for the first position later than
//   the seed's time (its own time, seed_time[i], or its tree's, seed_time[key / num_dst] when
//   `per_tree`), over edge times (`edge_time`, by CSC position, on the GPU) or the source nodes'
//   times (`src_time[u]`, u read from the id tiers); with `last` (and k >= 0) the window keeps its
//   last k positions. log2(deg) dependent reads per seed.
// - hmg_sample_counts: c_i = min(k, deg) (k when sampling with replacement and deg > 0;
//   deg when k < 0), 0 past the hop's seeds.
// - hmg_sample_floyd: seeds that sample without replacement (c_i < deg_i), Robert Floyd's
//   algorithm: for t = 0 .. c-1, j = deg - c + t, r = draw(i, t) mod (j+1); slot t takes r,
//   or j if r was taken already. Every c-subset is equally likely. The membership test
//   reads the seed's earlier slots (c^2/2 reads, L1-resident for the fanouts GNNs use).
// - hmg_sample_weighted: per seed of a weighted topology (hmgstore/graph/weighted.py is the same
//   algorithm in torch). Without replacement (seeds with c_i < deg_i), a seed whose list qualifies for
//   rejection sampling (deg > ratio * c and wmax[v] > 0: weighted.py's REJECT_RATIO and rejection_wmax)
//   runs trials t = 0, 1, ...: position p = draw of counter REJECT_COUNTER + 2t mod deg, u =
//   unit_closed_open of counter REJECT_COUNTER + 2t + 1, accepted when u * wmax[v] < w_p (in double, as
//   on the CPU); an accepted p not among the seed's slots so far becomes the next one (a linear search of
//   them, as in hmg_sample_floyd), until c are taken. After per_slot * c + extra trials without them
//   (probability below 1e-63) it scans the list instead. Every other seed scans: the thread walks the
//   seed's list once, gives position p the key -log(u_p) / w_p (u_p = unit_open(i, p); weight 0: after
//   every positive weight, random among themselves) and keeps the c smallest keys sorted by
//   insertion in the seed's slots of `pos` and of the float64 scratch `keys` (so any fanout works
//   without local arrays; a key enters only if it beats the c-th, O(c log(deg / c)) times on
//   average). The slots end in key order, the order successive weighted sampling draws them in.
//   With replacement: one pass sums the weights, then each slot t walks the running sum to the
//   first position past unit_closed_open(i, t) * total (uniform when every weight is 0).
//   Neighbouring threads serve different seeds: reads are not coalesced, as in hmg_sample_floyd.
// - hmg_sample_weighted_warp: the same without replacement, one warp per seed, for fanouts up to 32.
//   Rejection: lane l runs trial base + l (32 random single-weight reads a round); the round's accepted
//   trials are taken in trial order, one at a time: a ballot over the slots found so far (lane j holds
//   slot j) says whether the position is taken, else lane n takes it as slot n. Same trials, same slots as
//   the thread kernel. The scan: lane l reads positions l, l + 32, ... (coalesced: one 128-byte read of
//   weights per round) and computes their keys; the c smallest so far live one per lane (lane j holds
//   the j-th, EMPTY past those found). Keys below the c-th are inserted one at a time, in position
//   order, each by one shuffle: a lane whose key is larger takes the new key or its left neighbour's.
//   Same keys, same ties (a key goes after equal ones), so the same slots as hmg_sample_weighted.
// - hmg_sample_read: per slot. Finds its seed by binary search over `ends`, fills in the
//   position (t itself when the seed takes every neighbour; a draw mod deg with replacement;
//   else what hmg_sample_floyd wrote; with `given`, what hmg_sample_weighted wrote), reads the
//   neighbour id from its tier and writes the neighbour's key, the edge id and the seed's local id. Neighbouring threads serve
//   neighbouring slots of one seed, so their reads fall in the same adjacency list.

typedef long long i64;
typedef unsigned long long u64;

__device__ __forceinline__ u64 mix64(u64 z) {  // splitmix64's finaliser
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The part of a draw that depends on the seed alone (graph/draws.py's _seed_hash).
__device__ __forceinline__ u64 seed_hash(u64 key, i64 i) { return mix64(key ^ ((u64)i * 0xD1B54A32D192ED03ull)); }

// A uniform draw in [0, n) for slot t of seed i (63 random bits mod n: bias below n / 2^63).
__device__ __forceinline__ i64 draw(u64 key, i64 i, i64 t, i64 n) {
  return (i64)((mix64(seed_hash(key, i) + (u64)t) >> 1) % (u64)n);
}

__device__ __forceinline__ i64 load_id(const void* base, i64 k, bool wide) {
  return wide ? reinterpret_cast<const i64*>(base)[k] : (i64)reinterpret_cast<const int*>(base)[k];
}

// Where chunk c of a placed chunk table lives (the table's map, then its tier; see above).
__device__ __forceinline__ const char* chunk_row(const i64* __restrict__ job, i64 c) {
  const void* map = reinterpret_cast<const void*>(job[J_MAP]);
  const i64 nid = !map ? c
                : (job[J_FLAGS] & F_MAP64) ? reinterpret_cast<const i64*>(map)[c] : reinterpret_cast<const int*>(map)[c];
  const int ntiers = (int)job[J_NTIERS];
  int t = 0;
  while (t + 1 < ntiers && nid >= job[J_BOUNDS + t + 1]) ++t;
  return reinterpret_cast<const char*>(job[J_BASE + t]) + (nid - job[J_BOUNDS + t]) * job[J_PITCH + t];
}

// The neighbour id at CSC position `at` of a chunked topology (see above).
__device__ __forceinline__ i64 chunked_id(const i64* __restrict__ job, i64 at, i64 chunk, bool wide,
                                          const void* tail, i64 tail_start) {
  if (at >= tail_start) return load_id(tail, at - tail_start, wide);
  const i64 c = at / chunk;
  return load_id(chunk_row(job, c), at - c * chunk, wide);
}

// The weight at position `at` (see above): chunked when `wtiers` is given, else GPU tier or host tier.
__device__ __forceinline__ float load_weight(i64 at, const float* gpu_weight, const float* host_weight,
                                             i64 gpu_edges, const i64* wtiers, i64 chunk, const float* wtail,
                                             i64 tail_start) {
  if (wtiers) {
    if (at >= tail_start) return wtail[at - tail_start];
    const i64 c = at / chunk;
    return reinterpret_cast<const float*>(chunk_row(wtiers, c))[at - c * chunk];
  }
  return at < gpu_edges ? gpu_weight[at] : host_weight[at - gpu_edges];
}

// Uniform doubles from 53 random bits of draw counter t: in (0, 1] and in [0, 1) (graph/draws.py).
__device__ __forceinline__ double unit_open(u64 h, i64 t) {
  return (double)((mix64(h + (u64)t) >> 11) + 1) * 1.1102230246251565e-16 /* 2^-53 */;
}
__device__ __forceinline__ double unit_closed_open(u64 h, i64 t) {
  return (double)(mix64(h + (u64)t) >> 11) * 1.1102230246251565e-16 /* 2^-53 */;
}

// A weighted topology's weights in their tiers (load_weight's arguments, in one place).
struct Weights {
  const float* gpu;
  const float* host;
  i64 gpu_edges;
  const i64* tiers;
  i64 chunk;
  const float* tail;
  i64 tail_start;
  __device__ __forceinline__ float at(i64 p) const {
    return load_weight(p, gpu, host, gpu_edges, tiers, chunk, tail, tail_start);
  }
};

// Rejection trial t draws counters REJECT_COUNTER + 2t and + 2t + 1: graph/weighted.py's, above any position.
#define REJECT_COUNTER (1ll << 40)

// Rejection trial t for a list of deg weights read from position at0, its largest weight wm: sets p, its
// position, and returns whether it is accepted (u * wm < w_p in double, so the CPU accepts the same trials).
__device__ __forceinline__ bool reject_trial(u64 h, i64 t, i64 deg, double wm, i64 at0, const Weights& w, i64& p) {
  const i64 counter = REJECT_COUNTER + 2 * t;
  p = (i64)((mix64(h + (u64)counter) >> 1) % (u64)deg);
  return unit_closed_open(h, counter + 1) * wm < (double)w.at(at0 + p);
}

// Rejection sampling of c slots into out[0 .. c) by one thread (see the header): whether `bound` trials found them.
__device__ bool reject_thread(u64 h, i64 deg, i64 c, double wm, i64 bound, i64 at0, const Weights& w, i64* out) {
  i64 n = 0;  // slots taken: out[0 .. n)
  for (i64 t = 0; t < bound && n < c; ++t) {
    i64 p;
    if (!reject_trial(h, t, deg, wm, at0, w, p)) continue;
    bool taken = false;
    for (i64 s = 0; s < n && !taken; ++s) taken = out[s] == p;
    if (!taken) out[n++] = p;
  }
  return n == c;
}

// The same by a whole warp (every lane calls it with the same arguments; c <= 32): the same trials, the same
// slots. Its branches depend only on warp-wide values, so the full-mask ballots and shuffles are legal.
__device__ bool reject_warp(u64 h, i64 deg, i64 c, double wm, i64 bound, i64 at0, const Weights& w, i64* out) {
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  i64 mine = -1;  // lane j < n: slot j
  i64 n = 0;
  for (i64 base = 0; base < bound && n < c; base += 32) {
    i64 p = -1;
    const bool accepted = base + lane < bound && reject_trial(h, base + lane, deg, wm, at0, w, p);
    unsigned todo = __ballot_sync(all, accepted);
    while (todo && n < c) {  // the round's accepted trials, in trial order
      const int from = __ffs(todo) - 1;
      todo &= todo - 1;
      const i64 x = __shfl_sync(all, p, from);
      if (__any_sync(all, lane < n && mine == x)) continue;  // an earlier trial took this position
      if (lane == n) mine = x;
      ++n;
    }
  }
  if (n < c) return false;
  if (lane < c) out[lane] = mine;
  return true;
}

// Whether seed node v's list is drawn by rejection (see the header): its largest weight, or 0 to scan it.
__device__ __forceinline__ double reject_wmax(const float* wmax, i64 v, i64 deg, i64 c, i64 ratio) {
  return (wmax && deg > ratio * c) ? (double)wmax[v] : 0.0;
}

// The node id of seed i, or -1 past the hop's seeds.
__device__ __forceinline__ i64 seed_node(const i64* nodes, const i64* lohi, i64 i, i64 num_dst, bool disjoint) {
  const i64 at = lohi[0] + i;
  if (at >= lohi[1]) return -1;
  return disjoint ? nodes[at] % num_dst : nodes[at];
}

// The neighbour id at position `at` of the tiers' position space (see above).
__device__ __forceinline__ i64 neighbour_id(i64 at, const void* gpu_row, const void* host_row, i64 gpu_edges,
                                            bool wide, const i64* tiers, i64 chunk, const void* tail,
                                            i64 tail_start) {
  return tiers ? chunked_id(tiers, at, chunk, wide, tail, tail_start)
               : at < gpu_edges ? load_id(gpu_row, at, wide) : load_id(host_row, at - gpu_edges, wide);
}

extern "C" __global__ void hmg_sample_window(const i64* __restrict__ nodes, const i64* __restrict__ lohi,
                                             i64 max_seeds, const i64* __restrict__ colptr,
                                             const i64* __restrict__ start, i64 num_dst, int disjoint,
                                             const i64* __restrict__ seed_time, int per_tree,
                                             const i64* __restrict__ edge_time, const i64* __restrict__ src_time,
                                             const void* gpu_row, const void* host_row, i64 gpu_edges, int wide,
                                             const i64* __restrict__ tiers, i64 chunk, const void* tail,
                                             i64 tail_start, i64 k, int last, i64* __restrict__ win_lo,
                                             i64* __restrict__ win_deg) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < max_seeds; i += (i64)gridDim.x * blockDim.x) {
    const i64 v = seed_node(nodes, lohi, i, num_dst, disjoint);
    if (v < 0) {
      win_lo[i] = win_deg[i] = 0;
      continue;
    }
    const i64 limit = per_tree ? seed_time[nodes[lohi[0] + i] / num_dst] : seed_time[i];
    const i64 first = colptr[v], at0 = start ? start[v] : first;
    i64 lo = 0, hi = colptr[v + 1] - first;  // window positions [0, hi): the first later one is in [lo, hi]
    while (lo < hi) {
      const i64 mid = (lo + hi) >> 1;
      const i64 t = edge_time ? edge_time[first + mid]
                  : src_time[neighbour_id(at0 + mid, gpu_row, host_row, gpu_edges, wide, tiers, chunk, tail,
                                          tail_start)];
      if (t > limit) hi = mid; else lo = mid + 1;
    }
    const i64 begin = (last && k >= 0 && lo > k) ? lo - k : 0;
    win_lo[i] = begin;
    win_deg[i] = lo - begin;
  }
}

extern "C" __global__ void hmg_sample_counts(const i64* __restrict__ nodes, const i64* __restrict__ lohi,
                                             i64 max_seeds, const i64* __restrict__ colptr, i64 k, int replace,
                                             i64 num_dst, int disjoint, const i64* __restrict__ win_deg,
                                             i64* __restrict__ counts) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < max_seeds; i += (i64)gridDim.x * blockDim.x) {
    const i64 v = seed_node(nodes, lohi, i, num_dst, disjoint);
    if (v < 0) {
      counts[i] = 0;
      continue;
    }
    const i64 deg = win_deg ? win_deg[i] : colptr[v + 1] - colptr[v];
    counts[i] = k < 0 ? deg : replace ? (deg > 0 ? k : 0) : (deg < k ? deg : k);
  }
}

extern "C" __global__ void hmg_sample_floyd(const i64* __restrict__ nodes, const i64* __restrict__ lohi,
                                            i64 max_seeds, const i64* __restrict__ colptr,
                                            const i64* __restrict__ counts, const i64* __restrict__ ends,
                                            i64 num_dst, int disjoint, const i64* __restrict__ key_ptr,
                                            const i64* __restrict__ draw_index, const i64* __restrict__ win_deg,
                                            i64* __restrict__ pos) {
  const u64 key = (u64)*key_ptr;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < max_seeds; i += (i64)gridDim.x * blockDim.x) {
    const i64 v = seed_node(nodes, lohi, i, num_dst, disjoint);
    if (v < 0) continue;
    const i64 deg = win_deg ? win_deg[i] : colptr[v + 1] - colptr[v];
    const i64 c = counts[i];
    if (c >= deg) continue;  // takes every neighbour: hmg_sample_read fills it in
    i64* out = pos + ends[i] - c;
    const i64 di = draw_index ? draw_index[i] : i;
    for (i64 t = 0; t < c; ++t) {
      const i64 j = deg - c + t;
      i64 r = draw(key, di, t, j + 1);
      for (i64 s = 0; s < t; ++s) {
        if (out[s] == r) {
          r = j;
          break;
        }
      }
      out[t] = r;
    }
  }
}

// See the header. ZERO_KEY: graph/weighted.py's, above every key of a positive float32 weight.
#define ZERO_KEY 1e200
extern "C" __global__ void hmg_sample_weighted(const i64* __restrict__ nodes, const i64* __restrict__ lohi,
                                               i64 max_seeds, const i64* __restrict__ colptr,
                                               const i64* __restrict__ start, const i64* __restrict__ counts,
                                               const i64* __restrict__ ends, i64 num_dst, int disjoint,
                                               const i64* __restrict__ key_ptr, const i64* __restrict__ draw_index,
                                               const float* gpu_weight, const float* host_weight, i64 gpu_edges,
                                               const i64* __restrict__ wtiers, i64 chunk, const float* wtail,
                                               i64 tail_start, const float* __restrict__ wmax, i64 ratio,
                                               i64 per_slot, i64 extra, int replace, i64* __restrict__ pos,
                                               double* __restrict__ keys) {
  const u64 key = (u64)*key_ptr;
  const Weights wt{gpu_weight, host_weight, gpu_edges, wtiers, chunk, wtail, tail_start};
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < max_seeds; i += (i64)gridDim.x * blockDim.x) {
    const i64 v = seed_node(nodes, lohi, i, num_dst, disjoint);
    if (v < 0) continue;
    const i64 first = colptr[v], deg = colptr[v + 1] - first, c = counts[i];
    if (c == 0 || (!replace && c >= deg)) continue;  // nothing, or every neighbour: hmg_sample_read fills it in
    const i64 at0 = start ? start[v] : first;
    const u64 h = seed_hash(key, draw_index ? draw_index[i] : i);
    i64* out = pos + ends[i] - c;
    if (replace) {
      double total = 0.0;
      for (i64 p = 0; p < deg; ++p) total += wt.at(at0 + p);
      for (i64 t = 0; t < c; ++t) {
        if (!(total > 0.0)) {  // every weight 0: uniform
          out[t] = (i64)((mix64(h + (u64)t) >> 1) % (u64)deg);
          continue;
        }
        const double target = unit_closed_open(h, t) * total;
        double acc = 0.0;
        i64 chosen = -1, last = 0;
        for (i64 p = 0; p < deg; ++p) {
          const float w = wt.at(at0 + p);
          if (w > 0.0f) {
            acc += (double)w;
            last = p;
            if (acc > target) {
              chosen = p;
              break;
            }
          }
        }
        out[t] = chosen >= 0 ? chosen : last;  // rounding left the target past the sum: the last positive weight
      }
      continue;
    }
    const double wm = reject_wmax(wmax, v, deg, c, ratio);
    if (wm > 0.0 && reject_thread(h, deg, c, wm, c * per_slot + extra, at0, wt, out)) continue;
    double* kk = keys + ends[i] - c;  // the scan
    i64 n = 0;  // slots filled so far; kk[0 .. n) ascending
    for (i64 p = 0; p < deg; ++p) {
      const float w = wt.at(at0 + p);
      const double u = unit_open(h, p);
      const double k = w > 0.0f ? -log(u) / (double)w : ZERO_KEY * (1.0 + u);
      if (n == c && k >= kk[c - 1]) continue;
      i64 j = n < c ? n++ : c - 1;  // the slot freed for it: the next empty one, or the largest key's
      while (j > 0 && kk[j - 1] > k) {
        kk[j] = kk[j - 1];
        out[j] = out[j - 1];
        --j;
      }
      kk[j] = k;
      out[j] = p;
    }
  }
}

// Above every key (ZERO_KEY * (1 + u) <= 2e200): an empty slot of hmg_sample_weighted_warp.
#define EMPTY_KEY 1e300
extern "C" __global__ void hmg_sample_weighted_warp(const i64* __restrict__ nodes, const i64* __restrict__ lohi,
                                                    i64 max_seeds, const i64* __restrict__ colptr,
                                                    const i64* __restrict__ start, const i64* __restrict__ counts,
                                                    const i64* __restrict__ ends, i64 num_dst, int disjoint,
                                                    const i64* __restrict__ key_ptr,
                                                    const i64* __restrict__ draw_index, const float* gpu_weight,
                                                    const float* host_weight, i64 gpu_edges,
                                                    const i64* __restrict__ wtiers, i64 chunk, const float* wtail,
                                                    i64 tail_start, const float* __restrict__ wmax, i64 ratio,
                                                    i64 per_slot, i64 extra, i64* __restrict__ pos) {
  const unsigned all = 0xffffffffu;
  const Weights wt{gpu_weight, host_weight, gpu_edges, wtiers, chunk, wtail, tail_start};
  const u64 key = (u64)*key_ptr;
  const int lane = threadIdx.x & 31;
  const i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;
  // Every lane of a warp runs the same seeds and rounds: the branches below that depend on i, c, deg or a
  // broadcast value are taken by the whole warp, so the full-mask shuffles are legal.
  for (i64 i = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < max_seeds; i += warps) {
    const i64 v = seed_node(nodes, lohi, i, num_dst, disjoint);
    if (v < 0) continue;
    const i64 first = colptr[v], deg = colptr[v + 1] - first, c = counts[i];  // c <= 32: see the launch
    if (c == 0 || c >= deg) continue;
    const i64 at0 = start ? start[v] : first;
    const u64 h = seed_hash(key, draw_index ? draw_index[i] : i);
    const double wm = reject_wmax(wmax, v, deg, c, ratio);
    if (wm > 0.0 && reject_warp(h, deg, c, wm, c * per_slot + extra, at0, wt, pos + ends[i] - c)) continue;
    double mine = EMPTY_KEY;  // the scan. Lane j < c: the j-th smallest key so far
    i64 mine_pos = -1;
    for (i64 base = 0; base < deg; base += 32) {
      const i64 p = base + lane;
      double k = EMPTY_KEY;
      if (p < deg) {
        const float w = wt.at(at0 + p);
        const double u = unit_open(h, p);
        k = w > 0.0f ? -log(u) / (double)w : ZERO_KEY * (1.0 + u);
      }
      unsigned todo = __ballot_sync(all, k < __shfl_sync(all, mine, (int)c - 1));
      while (todo) {
        const int from = __ffs(todo) - 1;
        todo &= todo - 1;
        const double x = __shfl_sync(all, k, from);
        const double kth = __shfl_sync(all, mine, (int)c - 1);
        const double left = __shfl_up_sync(all, mine, 1);
        const i64 left_pos = __shfl_up_sync(all, mine_pos, 1);
        if (!(x < kth)) continue;  // an earlier key of this round took its place
        if (lane < c && mine > x) {
          const bool here = lane == 0 || left <= x;
          mine = here ? x : left;
          mine_pos = here ? base + from : left_pos;
        }
      }
    }
    if (lane < c) pos[ends[i] - c + lane] = mine_pos;
  }
}

extern "C" __global__ void hmg_sample_read(const i64* __restrict__ nodes, const i64* __restrict__ lohi,
                                           i64 max_seeds, const i64* __restrict__ colptr,
                                           const i64* __restrict__ start, const i64* __restrict__ counts,
                                           const i64* __restrict__ ends, i64 max_slots, i64* __restrict__ pos,
                                           const void* gpu_row, const void* host_row, i64 gpu_edges, int wide,
                                           int replace, const i64* __restrict__ key_ptr, i64 num_dst, i64 num_src,
                                           int disjoint, const i64* __restrict__ draw_index,
                                           const i64* __restrict__ tiers, i64 chunk,
                                           const void* tail, i64 tail_start, int given,
                                           const i64* __restrict__ win_lo, const i64* __restrict__ win_deg,
                                           i64* __restrict__ nbr,
                                           i64* __restrict__ eid, i64* __restrict__ seed_local) {
  if (max_seeds == 0) return;
  const u64 key = (u64)*key_ptr;
  const i64 num_slots = ends[max_seeds - 1];
  for (i64 s = blockIdx.x * (i64)blockDim.x + threadIdx.x; s < max_slots; s += (i64)gridDim.x * blockDim.x) {
    if (s >= num_slots) break;
    i64 lo = 0, hi = max_seeds - 1;  // the first seed i with ends[i] > s
    while (lo < hi) {
      const i64 mid = (lo + hi) >> 1;
      if (ends[mid] > s) hi = mid; else lo = mid + 1;
    }
    const i64 i = lo, c = counts[i], t = s - (ends[i] - c);
    const i64 at_seed = lohi[0] + i;
    const i64 v = disjoint ? nodes[at_seed] % num_dst : nodes[at_seed];
    const i64 lo_i = win_lo ? win_lo[i] : 0;
    const i64 first = colptr[v] + lo_i, deg = win_deg ? win_deg[i] : colptr[v + 1] - first;
    i64 p;
    if (given) {  // hmg_sample_weighted wrote the drawn positions
      p = (!replace && c >= deg) ? t : pos[s];
    } else if (replace) {
      p = draw(key, draw_index ? draw_index[i] : i, t, deg);
    } else if (c >= deg) {
      p = t;
    } else {
      p = pos[s];
    }
    pos[s] = p;
    const i64 at = (start ? start[v] + lo_i : first) + p;
    const i64 u = neighbour_id(at, gpu_row, host_row, gpu_edges, wide, tiers, chunk, tail, tail_start);
    nbr[s] = disjoint ? (nodes[at_seed] / num_dst) * num_src + u : u;
    eid[s] = first + p;
    seed_local[s] = at_seed;
  }
}
