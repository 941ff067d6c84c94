// Start gate for timing several GPUs at once (hmgstore/bench/gate.py).
// One thread polls the flag with volatile loads (each a PCIe read of host
// memory, ~1 us), and checks the global nanosecond timer to give up.
extern "C" __global__ void hmg_bench_gate(const volatile int* flag, unsigned long long timeout_ns,
                                          volatile int* timed_out) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        if (*flag != 0) return;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < timeout_ns);
    *timed_out = 1;
}
