/* The clock probe of the machine profile (clock.py): a chain of dependent integer adds.
 * Each add needs the previous one's result, and an integer add has a latency of one cycle on every
 * x86-64 and arm64 core, so n adds take n cycles whatever the core's width: cycles / seconds is the
 * clock the core really ran at (turbo, a VM's host, throttling included), not the OS's "cpu MHz".
 * A dependent FMA chain would measure the same thing divided by the FMA latency, which is 4 cycles on
 * some cores and 5 on others (Haswell, Zen 2): the add needs no such table. */
#include <stdint.h>

#define R4(s) s s s s
#define R16(s) R4(R4(s))
#define R64(s) R4(R16(s))

/* n rounded down to a multiple of 64 dependent adds; returns the sum so nothing is optimised away. */
uint64_t dependent_adds(int64_t n) {
    uint64_t x = 0;
    for (int64_t i = 0; i + 64 <= n; i += 64) {
#if defined(__x86_64__)
        __asm__ volatile(R64("add $1, %0\n\t") : "+r"(x));
#elif defined(__aarch64__)
        __asm__ volatile(R64("add %0, %0, #1\n\t") : "+r"(x));
#else
#error "clock.c: x86-64 or arm64 only"
#endif
    }
    return x;
}
