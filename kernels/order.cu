// hmgstore: a gather's ids grouped by the host page they read (a counting sort by bucket).
// Built by hmgstore/cuda/order.py, which says why.
//
// A bucket is `1 << shift` consecutive host positions (about 2 MiB of the host tier). An id's position is
// map[id] when the table renumbers its rows (a GPU tier, or a host tier laid out by locality) and the id
// itself otherwise; ids out of [0, num_rows) are never looked up in the map and fall into the first or last
// bucket (the gather kernel itself reports them).
// - hmg_bucket_count_<T>_<M>: counts[bucket of ids[j]] += 1, for every j < n.
// - hmg_bucket_place_<T>_<M>: with `ends` the inclusive prefix sums of the counts, each id takes a slot of its
//   bucket (slot = --ends[bucket]): grouped[slot] = ids[j], perm[slot] = j. Ids of one bucket land in an
//   arbitrary order; the gather writes each row to out[perm[slot]], so the result does not depend on it.
// T: the ids' type, M: the map's (void: no map).

typedef long long i64;

template <typename T, typename M>
__device__ __forceinline__ int bucket_of(T id, const M* map, i64 num_rows, int shift, int last) {
  i64 key = static_cast<i64>(id);
  if (map != nullptr && key >= 0 && key < num_rows) key = static_cast<i64>(map[key]);
  const i64 b = key >> shift;
  return b < 0 ? 0 : (b > last ? last : static_cast<int>(b));
}

template <typename T, typename M>
__device__ void count(const T* __restrict__ ids, const M* __restrict__ map, i64 num_rows, i64 n, int shift,
                      int last, int* __restrict__ counts) {
  for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < n; j += (i64)gridDim.x * blockDim.x)
    atomicAdd(counts + bucket_of(ids[j], map, num_rows, shift, last), 1);
}

template <typename T, typename M>
__device__ void place(const T* __restrict__ ids, const M* __restrict__ map, i64 num_rows, i64 n, int shift,
                      int last, int* __restrict__ ends, T* __restrict__ grouped, i64* __restrict__ perm) {
  for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < n; j += (i64)gridDim.x * blockDim.x) {
    const T id = ids[j];
    const int slot = atomicSub(ends + bucket_of(id, map, num_rows, shift, last), 1) - 1;
    grouped[slot] = id;
    perm[slot] = j;
  }
}

#define HMG_ORDER_KERNELS(TN, T, MN, M)                                                                        \
  extern "C" __global__ void hmg_bucket_count_##TN##_##MN(const T* ids, const M* map, i64 num_rows, i64 n,     \
                                                          int shift, int last, int* counts) {                   \
    count(ids, map, num_rows, n, shift, last, counts);                                                         \
  }                                                                                                            \
  extern "C" __global__ void hmg_bucket_place_##TN##_##MN(const T* ids, const M* map, i64 num_rows, i64 n,     \
                                                          int shift, int last, int* ends, T* grouped,           \
                                                          i64* perm) {                                          \
    place(ids, map, num_rows, n, shift, last, ends, grouped, perm);                                            \
  }

HMG_ORDER_KERNELS(i64, i64, m64, i64)
HMG_ORDER_KERNELS(i64, i64, m32, int)
HMG_ORDER_KERNELS(i32, int, m64, i64)
HMG_ORDER_KERNELS(i32, int, m32, int)
