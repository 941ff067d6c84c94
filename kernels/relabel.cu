// hmgstore relabelling with a hash table: global node keys -> local ids in first-seen order.
// Built by hmgstore/cuda/relabel.py; the Python side (hmgstore/graph/relabel.py) says when each runs.
//
// The table is open addressing with linear probing over `cap` (a power of two) slots: key
// (-1: empty), first (the smallest candidate position that inserted the key during the current
// call; LLONG_MAX otherwise) and value (the key's local id, -1 until assigned). One thread per
// candidate key in every kernel; neighbouring threads hold neighbouring candidates.
//
// - hmg_hash_insert: put each key in the table (atomicCAS on the key), note its slot, and for a
//   key without a local id yet keep the first position that met it (atomicMin).
// - hmg_hash_first: marks the candidates that met a new key first.
// - hmg_hash_assign: gives those keys the next local ids, in candidate order (rank from a scan),
//   and writes them to the list of new keys; with `own_position` instead the key's local id is
//   its first position (the seeds, and a rebuilt table).
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

extern "C" __global__ void hmg_hash_insert(const i64* __restrict__ keys, i64 n, i64* table_key, i64* table_first,
                                           const i64* __restrict__ table_value, i64 mask, i64* __restrict__ slot_of) {
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

extern "C" __global__ void hmg_hash_first(const i64* __restrict__ slot_of, i64 n, const i64* __restrict__ table_first,
                                          const i64* __restrict__ table_value, i64* __restrict__ is_first) {
  for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < n; j += (i64)gridDim.x * blockDim.x) {
    const i64 h = slot_of[j];
    is_first[j] = table_value[h] < 0 && table_first[h] == j;
  }
}

extern "C" __global__ void hmg_hash_assign(const i64* __restrict__ keys, const i64* __restrict__ slot_of, i64 n,
                                           const i64* __restrict__ is_first, const i64* __restrict__ rank,
                                           i64* table_value, i64 base, i64* __restrict__ new_keys, int own_position) {
  for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < n; j += (i64)gridDim.x * blockDim.x) {
    if (!is_first[j]) continue;
    if (own_position) {
      table_value[slot_of[j]] = base + j;
    } else {
      table_value[slot_of[j]] = base + rank[j];
      new_keys[rank[j]] = keys[j];
    }
  }
}

extern "C" __global__ void hmg_hash_lookup(const i64* __restrict__ slot_of, i64 n, const i64* __restrict__ table_value,
                                           i64* __restrict__ local) {
  for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < n; j += (i64)gridDim.x * blockDim.x) {
    local[j] = table_value[slot_of[j]];
  }
}
