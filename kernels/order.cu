// hmgstore: a gather's ids grouped by the host page they read (a counting sort by bucket).
// Built by hmgstore/cuda/order.py, which says why.
//
// A bucket is `1 << shift` consecutive row ids (about 2 MiB of the host tier); ids out of [0, num_rows)
// fall into the first or last bucket (the gather kernel itself reports them).
// - hmg_bucket_count_<T>: counts[bucket of ids[j]] += 1, for every j < n.
// - hmg_bucket_place_<T>: with `ends` the inclusive prefix sums of the counts, each id takes a slot of its
//   bucket (slot = --ends[bucket]): grouped[slot] = ids[j], perm[slot] = j. Ids of one bucket land in an
//   arbitrary order; the gather writes each row to out[perm[slot]], so the result does not depend on it.

typedef long long i64;

template <typename T>
__device__ __forceinline__ int bucket_of(T id, int shift, int last) {
  const i64 b = static_cast<i64>(id) >> shift;
  return b < 0 ? 0 : (b > last ? last : static_cast<int>(b));
}

template <typename T>
__device__ void count(const T* __restrict__ ids, i64 n, int shift, int last, int* __restrict__ counts) {
  for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < n; j += (i64)gridDim.x * blockDim.x)
    atomicAdd(counts + bucket_of(ids[j], shift, last), 1);
}

template <typename T>
__device__ void place(const T* __restrict__ ids, i64 n, int shift, int last, int* __restrict__ ends,
                      T* __restrict__ grouped, i64* __restrict__ perm) {
  for (i64 j = blockIdx.x * (i64)blockDim.x + threadIdx.x; j < n; j += (i64)gridDim.x * blockDim.x) {
    const T id = ids[j];
    const int slot = atomicSub(ends + bucket_of(id, shift, last), 1) - 1;
    grouped[slot] = id;
    perm[slot] = j;
  }
}

extern "C" __global__ void hmg_bucket_count_i64(const i64* ids, i64 n, int shift, int last, int* counts) {
  count(ids, n, shift, last, counts);
}
extern "C" __global__ void hmg_bucket_count_i32(const int* ids, i64 n, int shift, int last, int* counts) {
  count(ids, n, shift, last, counts);
}
extern "C" __global__ void hmg_bucket_place_i64(const i64* ids, i64 n, int shift, int last, int* ends, i64* grouped,
                                                i64* perm) {
  place(ids, n, shift, last, ends, grouped, perm);
}
extern "C" __global__ void hmg_bucket_place_i32(const int* ids, i64 n, int shift, int last, int* ends, int* grouped,
                                                i64* perm) {
  place(ids, n, shift, last, ends, grouped, perm);
}
