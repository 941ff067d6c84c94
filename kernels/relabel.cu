// hmgstore relabelling with a hash table: global node keys -> local ids in first-seen order.
// Built by hmgstore/cuda/relabel.py; hmgstore/graph/relabel.py says when each runs.
//
// The table is open addressing with linear probing over `cap` (a power of two) slots: key
// (-1: empty), first (the smallest candidate position that inserted the key during the current
// call; LLONG_MAX otherwise) and value (the key's local id, -1 until assigned). One thread per
// candidate key in every kernel; neighbouring threads hold neighbouring candidates.
//
// The number of candidates may live in device memory (n_ptr; else max_n is exact), and so may
// the number of nodes known before the call (base_ptr): a sampling hop can be queued before
// the previous one's sizes are read back. Kernels cover max_n candidates; those past n only
// clear their `is_first` flag, so a scan over all max_n flags counts the new keys.
//
// - hmg_hash_insert: put each key in the table (atomicCAS on the key), note its slot, and for a
//   key without a local id yet keep the first position that met it (atomicMin).
// - hmg_hash_first: marks the candidates that met a new key first.
// - hmg_hash_assign: gives those keys the next local ids, in candidate order (an inclusive scan
//   of the marks), and writes each to nodes[its id]; with `own_position` instead a key's local
//   id is its first position (the seeds, and a rebuilt table).
// - hmg_hash_lookup: every candidate's local id.

typedef long long i64;
typedef unsigned long long u64;

#define EMPTY (-1LL)

__device__ __forceinline__ u64 mix64(u64 z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ i64 count_of(const i64* n_ptr, i64 max_n) { return n_ptr ? *n_ptr : max_n; }

extern "C" __global__ void hmg_hash_insert(const i64* __restrict__ keys, const i64* n_ptr, i64 max_n, i64* table_key,
                                           i64* table_first, const i64* __restrict__ table_value, i64 mask,
                                           i64* __restrict__ slot_of) {
  const i64 n = count_of(n_ptr, max_n);
  for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < n; j += (i64)gridDim.x * blockDim.x) {
    const i64 k = keys[j];
    i64 h = (i64)(mix64((u64)k) & (u64)mask);
    while (true) {
      const i64 prev = (i64)atomicCAS(reinterpret_cast<u64*>(table_key + h), (u64)EMPTY, (u64)k);
      if (prev == EMPTY || prev == k) break;
      h = (h + 1) & mask;
    }
    slot_of[j] = h;
    if (table_value[h] < 0) atomicMin(table_first + h, j);
  }
}

extern "C" __global__ void hmg_hash_first(const i64* __restrict__ slot_of, const i64* n_ptr, i64 max_n,
                                          const i64* __restrict__ table_first, const i64* __restrict__ table_value,
                                          i64* __restrict__ is_first) {
  const i64 n = count_of(n_ptr, max_n);
  for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < max_n; j += (i64)gridDim.x * blockDim.x) {
    if (j >= n) {
      is_first[j] = 0;
      continue;
    }
    const i64 h = slot_of[j];
    is_first[j] = table_value[h] < 0 && table_first[h] == j;
  }
}

extern "C" __global__ void hmg_hash_assign(const i64* __restrict__ keys, const i64* __restrict__ slot_of,
                                           const i64* n_ptr, i64 max_n, const i64* __restrict__ is_first,
                                           const i64* __restrict__ rank, i64* table_value, const i64* base_ptr,
                                           i64* __restrict__ nodes, int own_position) {
  const i64 n = count_of(n_ptr, max_n);
  const i64 base = base_ptr ? *base_ptr : 0;
  for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < n; j += (i64)gridDim.x * blockDim.x) {
    if (!is_first[j]) continue;
    if (own_position) {
      table_value[slot_of[j]] = base + j;
    } else {
      const i64 id = base + rank[j] - 1;
      table_value[slot_of[j]] = id;
      nodes[id] = keys[j];
    }
  }
}

extern "C" __global__ void hmg_hash_lookup(const i64* __restrict__ slot_of, const i64* n_ptr, i64 max_n,
                                           const i64* __restrict__ table_value, i64* __restrict__ local) {
  const i64 n = count_of(n_ptr, max_n);
  for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < n; j += (i64)gridDim.x * blockDim.x) {
    local[j] = table_value[slot_of[j]];
  }
}
