/* Decode-shaped products on a CPU, written for the bandwidth roof: y[m, n] = sum_k x[m, k] * W[n, k].

   A decode step multiplies each weight matrix by a handful of rows (M = 1..16), so its time is the bytes
   of W it reads. Each kernel streams W once, RB rows at a time (the row blocks split over the threads),
   and keeps the M input rows in cache: for M > 1 a block is re-read from L1, not from memory. The weights
   become floats in registers; the activations stay fp32 (no rounding to bf16 or to 8 bits).

   Portable C: GCC's vector extensions (8 floats), lowered by -march=native to AVX2/AVX-512 or NEON.
   Threads: OpenMP, bound at run time to the libgomp torch has loaded, so both share one thread pool.
   Built on first use by course_lib.kernels.cpu_gemv, and tested there against F.linear. */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

typedef float f32x8 __attribute__((vector_size(32)));
typedef int8_t i8x8 __attribute__((vector_size(8)));
typedef uint8_t u8x8 __attribute__((vector_size(8)));
typedef int32_t i32x8 __attribute__((vector_size(32)));

static inline f32x8 ld(const float *p) { f32x8 v; memcpy(&v, p, sizeof v); return v; }
#if defined(__AVX2__)
#include <immintrin.h> /* the byte-to-float widening, which GCC does not vectorize from the generic form */
static inline f32x8 ld8(const int8_t *p) {
    return (f32x8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline f32x8 u4f(u8x8 v) {
    __m128i b;
    memcpy(&b, &v, 8);
    return (f32x8)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
}
#else
static inline f32x8 ld8(const int8_t *p) {
    i8x8 v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(__builtin_convertvector(v, i32x8), f32x8);
}
static inline f32x8 u4f(u8x8 v) { return __builtin_convertvector(__builtin_convertvector(v, i32x8), f32x8); }
#endif
/* The rearranged inputs are read with 64-byte loads, so each row's part of a scratch buffer starts on a cache
   line (malloc only promises 16 bytes, and a straddling load touches two lines). */
static inline int64_t pad16(int64_t floats) { return (floats + 15) & ~(int64_t)15; }
static inline float *scratch_alloc(int64_t floats) { return aligned_alloc(64, sizeof(float) * pad16(floats)); }

/* Groups whose scales line up with a 128-input block's 16 lanes of 8 weights: 4, 2 or 1 scale per block
   (32, 64 or 128k inputs); other sizes (96, 160, 192, ...) take per-lane scales or the even/odd path. */
#define LINED_UP(gs) ((gs) == 32 || (gs) == 64 || ((gs) & 127) == 0)

static inline float hsum(f32x8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

#define RB 4 /* weight rows per block */
/* the next row block's cache lines, one block ahead (a block's rows are short: the hardware prefetcher
   alone restarts at every row) */
#ifndef NO_PREFETCH
#ifndef PF_LOC /* __builtin_prefetch's locality: 0 non-temporal, 1 into L2 (cpu_gemv.PREFETCH_LOCALITY picks) */
#define PF_LOC 0
#endif
#define PREFETCH(p) __builtin_prefetch((p), 0, PF_LOC)
#ifndef PF_BLOCKS
#define PF_BLOCKS 2 /* measured: 2 blocks ahead beat 1 and 4 on the 2-core AVX2 VM (int8 +10%, fp32 +0-7%) */
#endif
#define PFK ((4 * (PF_BLOCKS - 1) + 1) * K)
#else
#define PREFETCH(p)
#endif

/* One row block of fp32 or int8 weights against one input row: s[r] = sum_k x[k] * w[r][k]. */
#define DOT_BLOCK(T, LOAD)                                                                                    \
    static inline void dot4_##T(const float *x, const T *w, int64_t K, float *s) {                            \
        const T *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;                                       \
        f32x8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};                  \
        int64_t k = 0;                                                                                        \
        for (; k + 16 <= K; k += 16) {                                                                        \
            if (!((k * (int64_t)sizeof(T)) & 63)) {                                                           \
                PREFETCH(w3 + PFK + k); PREFETCH(w3 + PFK + K + k); PREFETCH(w3 + PFK + 2 * K + k); PREFETCH(w3 + PFK + 3 * K + k); \
            }                                                                                                 \
            f32x8 x0 = ld(x + k), x1 = ld(x + k + 8);                                                         \
            a0 += LOAD(w0 + k) * x0; b0 += LOAD(w0 + k + 8) * x1;                                             \
            a1 += LOAD(w1 + k) * x0; b1 += LOAD(w1 + k + 8) * x1;                                             \
            a2 += LOAD(w2 + k) * x0; b2 += LOAD(w2 + k + 8) * x1;                                             \
            a3 += LOAD(w3 + k) * x0; b3 += LOAD(w3 + k + 8) * x1;                                             \
        }                                                                                                     \
        float s0 = hsum(a0 + b0), s1 = hsum(a1 + b1), s2 = hsum(a2 + b2), s3 = hsum(a3 + b3);                 \
        for (; k < K; k++) {                                                                                  \
            s0 += w0[k] * x[k]; s1 += w1[k] * x[k]; s2 += w2[k] * x[k]; s3 += w3[k] * x[k];                   \
        }                                                                                                     \
        s[0] = s0; s[1] = s1; s[2] = s2; s[3] = s3;                                                           \
    }                                                                                                         \
    static inline float dot1_##T(const float *x, const T *w, int64_t K) {                                     \
        f32x8 a = {0};                                                                                        \
        int64_t k = 0;                                                                                        \
        for (; k + 8 <= K; k += 8) a += LOAD(w + k) * ld(x + k);                                              \
        float s = hsum(a);                                                                                    \
        for (; k < K; k++) s += w[k] * x[k];                                                                  \
        return s;                                                                                             \
    }

DOT_BLOCK(float, ld)
#if defined(__AVX512F__)
/* int8 on AVX-512: 16 weights widened per instruction pair, half the AVX2 path's instructions (fp32 reads its
   weight at the roof with 8 lanes; int8 was bound by the widening on a 2-core Sapphire Rapids VM). */
static inline __m512 ld16_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline void dot4_int8_t(const float *x, const int8_t *w, int64_t K, float *s) {
    const int8_t *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        if (!(k & 63)) {
            PREFETCH(w3 + PFK + k); PREFETCH(w3 + PFK + K + k); PREFETCH(w3 + PFK + 2 * K + k); PREFETCH(w3 + PFK + 3 * K + k);
        }
        const __m512 xv = _mm512_loadu_ps(x + k);
        a0 = _mm512_fmadd_ps(ld16_i8(w0 + k), xv, a0);
        a1 = _mm512_fmadd_ps(ld16_i8(w1 + k), xv, a1);
        a2 = _mm512_fmadd_ps(ld16_i8(w2 + k), xv, a2);
        a3 = _mm512_fmadd_ps(ld16_i8(w3 + k), xv, a3);
    }
    float s0 = _mm512_reduce_add_ps(a0), s1 = _mm512_reduce_add_ps(a1), s2 = _mm512_reduce_add_ps(a2),
          s3 = _mm512_reduce_add_ps(a3);
    for (; k < K; k++) {
        s0 += w0[k] * x[k]; s1 += w1[k] * x[k]; s2 += w2[k] * x[k]; s3 += w3[k] * x[k];
    }
    s[0] = s0; s[1] = s1; s[2] = s2; s[3] = s3;
}
static inline float dot1_int8_t(const float *x, const int8_t *w, int64_t K) {
    __m512 a = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) a = _mm512_fmadd_ps(ld16_i8(w + k), _mm512_loadu_ps(x + k), a);
    float s = _mm512_reduce_add_ps(a);
    for (; k < K; k++) s += w[k] * x[k];
    return s;
}
#else
DOT_BLOCK(int8_t, ld8)
#endif

/* fp32 weights (N, K), row-major; scale: NULL, or one fp32 factor per output row (int8 below). */
#define GEMV(T)                                                                                                \
    void gemv_##T(const float *x, const T *w, const float *scale, float *y, int64_t M, int64_t N, int64_t K,    \
                  int threads) {                                                                               \
        const int64_t blocks = (N + RB - 1) / RB;                                                              \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")                                      \
        for (int64_t b = 0; b < blocks; b++) {                                                                 \
            const int64_t n0 = b * RB, rows = N - n0 < RB ? N - n0 : RB;                                       \
            for (int64_t m = 0; m < M; m++) {                                                                  \
                float s[RB], *ym = y + m * N + n0;                                                             \
                if (rows == RB) dot4_##T(x + m * K, w + n0 * K, K, s);                                         \
                else for (int64_t r = 0; r < rows; r++) s[r] = dot1_##T(x + m * K, w + (n0 + r) * K, K);       \
                for (int64_t r = 0; r < rows; r++) ym[r] = scale ? s[r] * scale[n0 + r] : s[r];                \
            }                                                                                                  \
        }                                                                                                      \
    }

GEMV(float)
GEMV(int8_t)

/* One int4 row against one prepared input row: sum_g s_g * (lo . xe_g + hi . xo_g) + c_g * xg_g. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
/* AVX-512: a group of 32 nibbles (16 bytes) is one register of 16 even and one of 16 odd weights, widened
   to fp32 in two conversions each; half the instructions of the AVX2 path per weight, which is what int4
   costs (it is bound by the widening, not by memory, on two cores). */
static inline __m512 i4_group512(const uint8_t *p, const float *e, const float *o) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p), low4 = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, low4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
    const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), _mm512_loadu_ps(e));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), _mm512_loadu_ps(o), t);
}

/* Rows whose length is a multiple of 128 skip the widening altogether. A 64-byte block of the row (128
   weights) is 16 dwords, and dword j holds the nibbles of weights 8j .. 8j+7: nibble q of every dword is one
   register of 16 weights, moved into bits 19-22 by one shift and OR-ed into 1.0f's bit pattern by one
   ternary-logic op, which makes the float f = 1 + u/16 exactly (u = 16 (f - 1)); no conversion instruction.
   i4_prepare lays the inputs out to match (x of weight 8j + q at 16q + j), so each row costs per 16 weights
   a shift, a logic op and an FMA, against two widenings, a conversion and an FMA above. Then
   sum_k w_k x_k = sum_g 16 s_g (sum_{k in g} f_k x_k - xg_g) + c_g xg_g, with the scales of a block's
   groups (4 at gs = 32) spread over its lanes by one permute. */
/* rows of 128k weights in lined-up groups; the others take the even/odd path */
#define I4_BLOCKED(K, gs) (((K) & 127) == 0 && LINED_UP(gs))
#define I4_NIB(v, q) ((q) <= 4 ? _mm512_slli_epi32((v), 19 - 4 * (q)) : _mm512_srli_epi32((v), 4 * (q) - 19))
static inline __m512 i4_f(__m512i v, const __m512i mask, const __m512i one) {
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(v, mask, one, 0xEA)); /* (v & mask) | one */
}

/* sum_g c_g xg_g: the offsets' part of an int4 row, 16 groups at a time (one at a time was one serial add per
   group: longer than the products themselves at K = 4,096) */
static inline float offsets512(const _Float16 *cr, const float *xg, int64_t G) {
    __m512 z = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g + 16 <= G; g += 16) z = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(cr + g))), _mm512_loadu_ps(xg + g), z);
    float off = _mm512_reduce_add_ps(z);
    for (; g < G; g++) off += (float)cr[g] * xg[g];
    return off;
}

static inline float i4_row_blocked(const float *xr, const float *xg, const uint8_t *pr, const _Float16 *sr,
                                   const _Float16 *cr, int64_t G, int64_t gs) {
    const int64_t K = G * gs, per = gs < 128 ? 128 / gs : 1; /* groups per 128-weight block */
    const __m512i mask = _mm512_set1_epi32(15 << 19), one = _mm512_set1_epi32(0x3F800000);
    __m512i sidx = _mm512_setzero_si512();
    if (gs < 128) sidx = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), gs == 32 ? 2 : 3);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / 128; b++) {
        const __m512i v = _mm512_loadu_si512((const void *)(pr + 64 * b));
        const float *xb = xr + 128 * b;
        __m512 t0 = _mm512_mul_ps(i4_f(I4_NIB(v, 0), mask, one), _mm512_loadu_ps(xb));
        __m512 t1 = _mm512_mul_ps(i4_f(I4_NIB(v, 1), mask, one), _mm512_loadu_ps(xb + 16));
        t0 = _mm512_fmadd_ps(i4_f(I4_NIB(v, 2), mask, one), _mm512_loadu_ps(xb + 32), t0);
        t1 = _mm512_fmadd_ps(i4_f(I4_NIB(v, 3), mask, one), _mm512_loadu_ps(xb + 48), t1);
        t0 = _mm512_fmadd_ps(i4_f(I4_NIB(v, 4), mask, one), _mm512_loadu_ps(xb + 64), t0);
        t1 = _mm512_fmadd_ps(i4_f(I4_NIB(v, 5), mask, one), _mm512_loadu_ps(xb + 80), t1);
        t0 = _mm512_fmadd_ps(i4_f(I4_NIB(v, 6), mask, one), _mm512_loadu_ps(xb + 96), t0);
        t1 = _mm512_fmadd_ps(i4_f(I4_NIB(v, 7), mask, one), _mm512_loadu_ps(xb + 112), t1);
        const int64_t g0 = (128 * b) / gs;
        const __m128i sh = _mm_maskz_loadu_epi16((__mmask8)((1u << per) - 1), sr + g0);
        const __m512 sv = _mm512_permutexvar_ps(sidx, _mm512_castps256_ps512(_mm256_cvtph_ps(sh)));
        if (b & 1) acc1 = _mm512_fmadd_ps(_mm512_add_ps(t0, t1), sv, acc1);
        else acc0 = _mm512_fmadd_ps(_mm512_add_ps(t0, t1), sv, acc0);
    }
    /* the offsets: sum_g (c_g - 16 s_g) xg_g */
    __m512 z = _mm512_setzero_ps();
    const __m512 sixteen = _mm512_set1_ps(16.f);
    int64_t g = 0;
    for (; g + 16 <= G; g += 16) {
        const __m512 cg = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(cr + g)));
        const __m512 sg = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sr + g)));
        z = _mm512_fmadd_ps(_mm512_fnmadd_ps(sixteen, sg, cg), _mm512_loadu_ps(xg + g), z);
    }
    float off = _mm512_reduce_add_ps(z);
    for (; g < G; g++) off += ((float)cr[g] - 16.f * (float)sr[g]) * xg[g];
    return 16.f * _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + off;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define I4_X24 1
/* rows of 64k inputs in groups that line up with the lanes (as I4_BLOCKED, the last 64 inputs in 256 bits) */
#define X24_OK(K, gs) (((K) & 63) == 0 && LINED_UP(gs))
/* With VNNI, the same product in integers, still exact to fp32's own rounding: each block of 32 inputs
   becomes 24-bit block floating point, X = rint(x / d) with d = 2^(e - 22) and 2^(e-1) <= max|x| < 2^e
   (|X| <= 2^22: every input kept to 2^-23 of its block's largest, the bound a float sum of the block
   already has), and X is split into three signed bytes, X = b0 + 2^8 b1 + 2^16 b2 (b0, b1 in
   [-128, 127], |b2| <= 65). Then a 128-weight block is 6 vpdpbusd (two nibble halves times three byte
   planes, 64 products each) and 4 shifts and adds to join the planes, where the float path spends 24
   instructions widening and multiplying: on a CPU that retires few 512-bit instructions per ns, the
   difference between its arithmetic roof and the memory roof (gemv_roof.cache_roof). The sums of u.X
   fit int32 (at most 2^29); they become floats, then take d of their block and s of their group. The
   layout per 128 inputs: 3 planes x (64 bytes for the even inputs, 64 for the odd), and where K ends 64
   past a multiple of 128 (SmolLM2's 576), the last 64 as 3 x (32 + 32); then per 8 inputs the d of their
   block, then the fp32 sums per group (the offsets, as in the float path). */
static void i4x24_prepare(const float *xm, int64_t K, int64_t gs, float *out) {
    int8_t *q = (int8_t *)out;
    float *dl = out + 3 * K / 4;
    const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    for (int64_t b = 0; b < K; b += 128) {
        int8_t *c = q + 3 * b;
        const int64_t n = K - b < 128 ? 64 : 128, half = n / 2; /* a chunk of 128, or the last 64 */
        for (int64_t i = 0; i < n / 32; i++) { /* a block of 32: its even inputs, then its odd ones */
            const float *xb = xm + b + 32 * i;
            const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            int e = 0;
            if (amax > 0.f) frexpf(amax, &e);
            const float d = amax > 0.f ? ldexpf(1.f, e - 22) : 0.f, inv = amax > 0.f ? ldexpf(1.f, 22 - e) : 0.f;
            const __m512 halves[2] = {_mm512_permutex2var_ps(v0, ie, v1), _mm512_permutex2var_ps(v0, io, v1)};
            for (int h = 0; h < 2; h++) {
                __m512i X = _mm512_cvtps_epi32(_mm512_mul_ps(halves[h], _mm512_set1_ps(inv))); /* exact scaling */
                for (int p = 0; p < 3; p++) { /* the low byte as signed, then the rest, exactly */
                    _mm_storeu_si128((__m128i *)(c + n * p + half * h + 16 * i), _mm512_cvtepi32_epi8(X));
                    const __m512i low = _mm512_srai_epi32(_mm512_slli_epi32(X, 24), 24);
                    X = _mm512_srai_epi32(_mm512_sub_epi32(X, low), 8);
                }
            }
            for (int64_t j = 4 * i; j < 4 * i + 4; j++) dl[b / 8 + j] = d; /* lanes 4i..4i+3 */
        }
    }
    (void)gs; /* the per-group sums come after (i4_prepare) */
}

static inline float i4x24_row(const float *prep, const uint8_t *pr, const _Float16 *sr, const _Float16 *cr, int64_t K,
                              int64_t gs) {
    const int8_t *q = (const int8_t *)prep;
    const float *dl = prep + 3 * K / 4, *xg = dl + K / 8;
    const int64_t G = K / gs, per = gs < 128 ? 128 / gs : 1;
    const float off = offsets512(cr, xg, G);
    __m512i sidx = _mm512_setzero_si512();
    if (gs < 128) sidx = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), gs == 32 ? 2 : 3);
    const __m512i low4 = _mm512_set1_epi8(15), zero = _mm512_setzero_si512();
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / 128; b++) {
        const __m512i v = _mm512_loadu_si512((const void *)(pr + 64 * b));
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        const int8_t *c = q + 384 * b;
#define X24_PLANE(p) _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo, _mm512_loadu_si512((const void *)(c + 128 * (p)))), hi, \
                                         _mm512_loadu_si512((const void *)(c + 128 * (p) + 64)))
        const __m512i a0 = X24_PLANE(0), a1 = X24_PLANE(1), a2 = X24_PLANE(2);
#undef X24_PLANE
        const __m512i t = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(_mm512_slli_epi32(a2, 8), a1), 8), a0);
        const __m128i sh = _mm_maskz_loadu_epi16((__mmask8)((1u << per) - 1), sr + (128 * b) / gs);
        const __m512 sv = _mm512_permutexvar_ps(sidx, _mm512_castps256_ps512(_mm256_cvtph_ps(sh)));
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(t), _mm512_loadu_ps(dl + 16 * b));
        if (b & 1) acc1 = _mm512_fmadd_ps(f, sv, acc1);
        else acc0 = _mm512_fmadd_ps(f, sv, acc0);
    }
    float tail = 0.f;
    if (K % 128) { /* the last 64 inputs: the same in 256-bit registers, 8 lanes */
        const int64_t k0 = K - 64;
        const int8_t *c = q + 3 * k0;
        const __m256i v = _mm256_loadu_si256((const __m256i *)(pr + k0 / 2)), l4 = _mm256_set1_epi8(15), z8 = _mm256_setzero_si256();
        const __m256i lo = _mm256_and_si256(v, l4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), l4);
#define X24_TAIL(p) _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(z8, lo, _mm256_loadu_si256((const __m256i *)(c + 64 * (p)))), hi, \
                                        _mm256_loadu_si256((const __m256i *)(c + 64 * (p) + 32)))
        const __m256i a0 = X24_TAIL(0), a1 = X24_TAIL(1), a2 = X24_TAIL(2);
#undef X24_TAIL
        const __m256i t = _mm256_add_epi32(_mm256_slli_epi32(_mm256_add_epi32(_mm256_slli_epi32(a2, 8), a1), 8), a0);
        float sl[8];
        for (int64_t j = 0; j < 8; j++) sl[j] = (float)sr[(k0 + 8 * j) / gs];
        const __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(t), _mm256_loadu_ps(dl + k0 / 8)), _mm256_loadu_ps(sl));
        tail = hsum((f32x8)f);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + tail + off;
}
#endif

static inline float i4_row(const float *xe, const float *xo, const float *xg, const uint8_t *pr, const _Float16 *sr,
                           const _Float16 *cr, int64_t G, int64_t gs) {
#ifdef I4_X24
    if (X24_OK(G * gs, gs)) return i4x24_row(xe, pr, sr, cr, G * gs, gs);
#endif
    if (I4_BLOCKED(G * gs, gs)) return i4_row_blocked(xe, xg, pr, sr, cr, G, gs);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    float sf[16] __attribute__((aligned(64)));
    int64_t g = 0;
    if (gs == 32) { /* Q4_1's groups: scales widened 16 at a time (a scalar fp16 widening per group chains
                       through its merged register), then two groups per iteration */
        for (; g + 16 <= G; g += 16) {
            _mm512_store_ps(sf, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sr + g))));
            for (int64_t i = 0; i < 16; i += 2) {
                const int64_t j = 16 * (g + i);
                acc0 = _mm512_fmadd_ps(i4_group512(pr + j, xe + j, xo + j), _mm512_set1_ps(sf[i]), acc0);
                acc1 = _mm512_fmadd_ps(i4_group512(pr + j + 16, xe + j + 16, xo + j + 16), _mm512_set1_ps(sf[i + 1]), acc1);
            }
        }
    }
    for (; g < G; g++) {
        __m512 t = _mm512_setzero_ps();
        for (int64_t j = g * (gs / 2); j < (g + 1) * (gs / 2); j += 16) t = _mm512_add_ps(t, i4_group512(pr + j, xe + j, xo + j));
        acc0 = _mm512_fmadd_ps(t, _mm512_set1_ps((float)sr[g]), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + offsets512(cr, xg, G);
}
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define I4_BLOCKED(K, gs) 0
/* 32 nibbles (16 bytes) against their 16 even and 16 odd inputs, into two accumulators. */
static inline void i4_chunk(const uint8_t *p, const float *e, const float *o, __m256 *t0, __m256 *t1) {
    const __m128i low4 = _mm_set1_epi8(15);
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m128i lo = _mm_and_si128(b, low4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
    *t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), _mm256_loadu_ps(e), *t0);
    *t1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), _mm256_loadu_ps(e + 8), *t1);
    *t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), _mm256_loadu_ps(o), *t0);
    *t1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), _mm256_loadu_ps(o + 8), *t1);
}

static inline float i4_row(const float *xe, const float *xo, const float *xg, const uint8_t *pr, const _Float16 *sr,
                           const _Float16 *cr, int64_t G, int64_t gs) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    if (gs == 32) { /* Q4_1's groups: one chunk per group, two groups per iteration */
        int64_t g = 0;
        for (; g + 2 <= G; g += 2) {
            __m256 t0 = _mm256_setzero_ps(), t1 = _mm256_setzero_ps(), u0 = _mm256_setzero_ps(), u1 = _mm256_setzero_ps();
            i4_chunk(pr + 16 * g, xe + 16 * g, xo + 16 * g, &t0, &t1);
            i4_chunk(pr + 16 * g + 16, xe + 16 * g + 16, xo + 16 * g + 16, &u0, &u1);
            const __m256 s0 = _mm256_set1_ps((float)sr[g]), s1 = _mm256_set1_ps((float)sr[g + 1]);
            acc0 = _mm256_fmadd_ps(t0, s0, acc0);
            acc1 = _mm256_fmadd_ps(t1, s0, acc1);
            acc2 = _mm256_fmadd_ps(u0, s1, acc2);
            acc3 = _mm256_fmadd_ps(u1, s1, acc3);
        }
        if (g < G) {
            __m256 t0 = _mm256_setzero_ps(), t1 = _mm256_setzero_ps();
            i4_chunk(pr + 16 * g, xe + 16 * g, xo + 16 * g, &t0, &t1);
            const __m256 s0 = _mm256_set1_ps((float)sr[g]);
            acc0 = _mm256_fmadd_ps(t0, s0, acc0);
            acc1 = _mm256_fmadd_ps(t1, s0, acc1);
        }
    } else {
        for (int64_t g = 0; g < G; g++) {
            __m256 t0 = _mm256_setzero_ps(), t1 = _mm256_setzero_ps();
            for (int64_t j = g * (gs / 2); j < (g + 1) * (gs / 2); j += 16) i4_chunk(pr + j, xe + j, xo + j, &t0, &t1);
            const __m256 sg = _mm256_set1_ps((float)sr[g]);
            acc0 = _mm256_fmadd_ps(t0, sg, acc0);
            acc1 = _mm256_fmadd_ps(t1, sg, acc1);
        }
    }
    __m256 z = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= G; g += 8) z = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(cr + g))), _mm256_loadu_ps(xg + g), z);
    float zero_term = hsum((f32x8)z);
    for (; g < G; g++) zero_term += (float)cr[g] * xg[g];
    return hsum((f32x8)_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))) + zero_term;
}
#else
#define I4_BLOCKED(K, gs) 0
static inline float i4_row(const float *xe, const float *xo, const float *xg, const uint8_t *pr, const _Float16 *sr,
                           const _Float16 *cr, int64_t G, int64_t gs) {
    f32x8 acc0 = {0}, acc1 = {0};
    float zero_term = 0.f;
    for (int64_t g = 0; g < G; g++) {
        f32x8 t0 = {0}, t1 = {0};
        for (int64_t j = g * gs / 2; j < (g + 1) * gs / 2; j += 16) { /* 16 bytes = 32 weights */
            u8x8 b0, b1;
            memcpy(&b0, pr + j, 8);
            memcpy(&b1, pr + j + 8, 8);
            t0 += u4f(b0 & 15) * ld(xe + j) + u4f(b0 >> 4) * ld(xo + j);
            t1 += u4f(b1 & 15) * ld(xe + j + 8) + u4f(b1 >> 4) * ld(xo + j + 8);
        }
        const float sg = (float)sr[g];
        acc0 += t0 * sg;
        acc1 += t1 * sg;
        zero_term += (float)cr[g] * xg[g];
    }
    return hsum(acc0 + acc1) + zero_term;
}
#endif

/* xg[g] = the sum of group g's gs inputs (gs a multiple of 32): in 16 lanes where AVX-512 is (a scalar
   sum is a serial chain of adds: ~8 us a 4,096-input row on the 2-core Sapphire Rapids VM). */
static inline void group_sums(const float *xm, int64_t K, int64_t gs, float *xg) {
    for (int64_t g = 0; g < K / gs; g++) {
#if defined(__AVX512F__)
        __m512 a = _mm512_loadu_ps(xm + g * gs), b = _mm512_loadu_ps(xm + g * gs + 16);
        for (int64_t k = g * gs + 32; k < (g + 1) * gs; k += 32) {
            a = _mm512_add_ps(a, _mm512_loadu_ps(xm + k));
            b = _mm512_add_ps(b, _mm512_loadu_ps(xm + k + 16));
        }
        xg[g] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
#else
        f32x8 a = {0}, b = {0}, c = {0}, d = {0};
        for (int64_t k = g * gs; k < (g + 1) * gs; k += 32) {
            a += ld(xm + k); b += ld(xm + k + 8); c += ld(xm + k + 16); d += ld(xm + k + 24);
        }
        xg[g] = hsum((a + b) + (c + d));
#endif
    }
}

/* One input row for i4_row: its even and odd elements (xe, xo: K/2 each), or i4_row_blocked's order where
   K is a multiple of 128 on AVX-512, then its sums per group (xg: K/gs), back to back in out (K + K/gs
   floats). */
static inline void i4_prepare(const float *xm, int64_t K, int64_t gs, float *out) {
#ifdef I4_X24
    if (X24_OK(K, gs)) { /* the integer path's layout (it fits in the K + K/gs floats) */
        i4x24_prepare(xm, K, gs, out);
        group_sums(xm, K, gs, out + 3 * K / 4 + K / 8);
        return;
    }
#endif
    const int64_t G = K / gs, half = K / 2;
    float *xe = out, *xo = xe + half, *xg = xo + half;
    if (I4_BLOCKED(K, gs)) /* i4_row_blocked's order: in each block of 128, x of weight 8j + q at 16q + j */
        for (int64_t b = 0; b < K; b += 128)
            for (int64_t j = 0; j < 16; j++)
                for (int64_t q = 0; q < 8; q++) out[b + 16 * q + j] = xm[b + 8 * j + q];
    else
        for (int64_t k = 0; k < half; k++) { xe[k] = xm[2 * k]; xo[k] = xm[2 * k + 1]; }
    (void)G;
    group_sums(xm, K, gs, xg);
}

/* int4 weights in groups of gs inputs (gs a multiple of 32): packed (N, K/2) bytes, low nibble = even input,
   high nibble = odd input; w[n, k] = u * s[n, g] + c[n, g] with u in [0, 15] and g = k / gs (fp16 s and c,
   the layout of llama.cpp's Q4_1 at gs = 32). With each input row split into its even and odd elements
   (xe, xo) and its sums per group (xg), y = sum_g s_g * (lo . xe_g + hi . xo_g) + c_g * xg_g: the nibbles
   never need the offset subtracted. Returns 0, or -1 when the scratch for xe, xo, xg cannot be allocated. */
int gemv_i4(const float *x, const uint8_t *packed, const _Float16 *s, const _Float16 *c, float *y, int64_t M,
            int64_t N, int64_t K, int64_t gs, int threads) {
    const int64_t G = K / gs, half = K / 2, P = pad16(K + G);
    float *scratch = scratch_alloc(M * P);
    if (!scratch) return -1;
    for (int64_t m = 0; m < M; m++) i4_prepare(x + m * K, K, gs, scratch + m * P); /* once per call */
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *pr = packed + n * half;
        const _Float16 *sr = s + n * G, *cr = c + n * G;
        if (n + 1 < N)
            for (int64_t off = 0; off < half; off += 64) PREFETCH(pr + half + off); /* the next row */
        for (int64_t m = 0; m < M; m++) {
            const float *xe = scratch + m * P, *xo = xe + half, *xg = xo + half;
            y[m * N + n] = i4_row(xe, xo, xg, pr, sr, cr, G, gs);
        }
    }
    free(scratch);
    return 0;
}

/* int4 weights against activations rounded to int8: llama.cpp's trade (its Q4_1 x Q8_1 dot), kept beside the
   fp32-activation kernel so the course can show what it buys and what it costs.

   Each input row is rounded per block of 32 to q = round(x / d), d = max|x| / 127 (llama.cpp's Q8 blocks);
   then a byte of 4 unsigned nibbles times 4 signed bytes of q is one lane of one instruction (AVX-512
   VNNI's vpdpbusd: 64 products per instruction, where the fp32 path widens and multiplies 16). Per 128
   weights (64 packed bytes): the low nibbles are the even weights and the high ones the odd weights, so
   the inputs are laid out as q of the even elements, then of the odd ones (64 bytes each); dword lane j
   then sums u.q over weights 8j .. 8j+7, which lie in one group and one activation block. The lanes become
   floats and take s_g d_b in one multiply-add. The offsets use the exact fp32 sums of x per group, as the
   fp32 path does: only the u.x part sees the rounding. Without AVX-512 VNNI, AVX2's vpmaddubsw and vpmaddwd
   do the same 32 bytes at a time (llama.cpp's AVX2 path); without AVX2 a plain C loop runs (correct, slow).
   gs a multiple of 32. */
#define Q8_BLOCK 32
/* The prepared row: per 128 inputs 64 bytes of q (even elements) and 64 (odd), and where K is not a
   multiple of 128, the last 64 as 32 and 32; per 8 inputs one float, the activation scale d of the lane
   that sums them; then the per-group fp32 sums xg (G floats). In floats: K/4 + K/8 + G. */
static inline int64_t i4q8_prep_floats(int64_t K, int64_t gs) { return K / 4 + K / 8 + K / gs; }

static void i4q8_prepare(const float *xm, int64_t K, int64_t gs, float *out) {
    int8_t *q = (int8_t *)out;
    float *dl = out + K / 4, *xg = dl + K / 8;
    for (int64_t b = 0; b < K; b += 128) { /* a chunk of 128 inputs, or the last 64 */
        const int64_t n = K - b < 128 ? 64 : 128, half = n / 2;
        for (int64_t i = 0; i < n / Q8_BLOCK; i++) { /* a block of 32: its even inputs, then its odd ones */
            const float *xb = xm + b + 32 * i;
#if defined(__AVX512F__) && defined(__AVX512BW__)
            const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
            const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
            const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
            const __m512 ev = _mm512_permutex2var_ps(v0, ie, v1), od = _mm512_permutex2var_ps(v0, io, v1);
            /* round to nearest even, as lrintf: the default MXCSR mode */
            _mm_storeu_si128((__m128i *)(q + b + 16 * i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(ev, inv))));
            _mm_storeu_si128((__m128i *)(q + b + half + 16 * i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(od, inv))));
#else
            float amax = 0.f;
            for (int64_t k = 0; k < Q8_BLOCK; k++) amax = fmaxf(amax, fabsf(xb[k]));
            const float inv = amax > 0.f ? 127.f / amax : 0.f;
            for (int64_t t = 0; t < 16; t++) {
                q[b + 16 * i + t] = (int8_t)lrintf(xb[2 * t] * inv);
                q[b + half + 16 * i + t] = (int8_t)lrintf(xb[2 * t + 1] * inv);
            }
#endif
            for (int64_t j = 4 * i; j < 4 * i + 4; j++) dl[b / 8 + j] = amax / 127.f; /* lanes 4i..4i+3 */
        }
    }
    group_sums(xm, K, gs, xg);
}

#if defined(__AVX2__) && !(defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__))
/* 32 packed bytes (64 weights) against the q of their even and odd inputs: 8 lanes of 8 weights each */
static inline __m256i q8_dot64(const uint8_t *p, const int8_t *qe, const int8_t *qo, __m256i low4, __m256i ones) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)qe)),
                                         _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)qo)));
    return _mm256_madd_epi16(s16, ones);
}
#endif

static inline float i4q8_row(const float *prep, const uint8_t *pr, const _Float16 *sr, const _Float16 *cr, int64_t K,
                             int64_t gs) {
    const int8_t *q = (const int8_t *)prep;
    const float *dl = prep + K / 4, *xg = dl + K / 8;
    const int64_t G = K / gs;
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
    const float off = offsets512(cr, xg, G);
    const int64_t per = gs < 128 ? 128 / gs : 1;
    const int lined_up = LINED_UP(gs);
    __m512i sidx = _mm512_setzero_si512();
    if (gs < 128) sidx = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), gs == 32 ? 2 : 3);
    const __m512i low4 = _mm512_set1_epi8(15);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / 128; b++) {
        const __m512i v = _mm512_loadu_si512((const void *)(pr + 64 * b));
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512((const void *)(q + 128 * b)));
        t = _mm512_dpbusd_epi32(t, hi, _mm512_loadu_si512((const void *)(q + 128 * b + 64)));
        const int64_t g0 = (128 * b) / gs;
        __m512 sv;
        if (lined_up) {
            const __m128i sh = _mm_maskz_loadu_epi16((__mmask8)((1u << per) - 1), sr + g0);
            sv = _mm512_permutexvar_ps(sidx, _mm512_castps256_ps512(_mm256_cvtph_ps(sh)));
        } else { /* groups of 96, 160, ...: lane j's 8 weights lie in group (128 b + 8 j) / gs */
            float sl[16];
            for (int64_t j = 0; j < 16; j++) sl[j] = (float)sr[(128 * b + 8 * j) / gs];
            sv = _mm512_loadu_ps(sl);
        }
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(t), _mm512_loadu_ps(dl + 16 * b));
        if (b & 1) acc1 = _mm512_fmadd_ps(f, sv, acc1);
        else acc0 = _mm512_fmadd_ps(f, sv, acc0);
    }
    float tail = 0.f;
    if (K % 128) { /* the last 64 inputs: the same in 256-bit registers, 8 lanes */
        const int64_t k0 = K - 64;
        const __m256i v = _mm256_loadu_si256((const __m256i *)(pr + k0 / 2)), low = _mm256_set1_epi8(15);
        const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        __m256i t = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, _mm256_loadu_si256((const __m256i *)(q + k0)));
        t = _mm256_dpbusd_epi32(t, hi, _mm256_loadu_si256((const __m256i *)(q + k0 + 32)));
        const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(t), _mm256_loadu_ps(dl + k0 / 8));
        float fl[8];
        _mm256_storeu_ps(fl, f);
        for (int64_t j = 0; j < 8; j++) tail += fl[j] * (float)sr[(k0 + 8 * j) / gs];
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + tail + off;
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    /* AVX2, llama.cpp's way: vpmaddubsw multiplies unsigned nibbles by signed bytes and adds pairs into 16
       bits (at most 2 x 15 x 127 per pair, and the low and high nibbles' sums together 7,620: no
       saturation), vpmaddwd by ones adds those into 32-bit lanes; 32 packed bytes (64 weights) at a time,
       dword lane j summing weights 8j .. 8j+7 as on AVX-512. */
    __m256 z = _mm256_setzero_ps(); /* the offsets, 8 groups at a time (one at a time was ~40% of a row) */
    int64_t g = 0;
    for (; g + 8 <= G; g += 8) z = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(cr + g))), _mm256_loadu_ps(xg + g), z);
    float off = hsum((f32x8)z);
    for (; g < G; g++) off += (float)cr[g] * xg[g];
    const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const __m256i first = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0), second = _mm256_set_epi32(3, 3, 3, 3, 2, 2, 2, 2);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 128 <= K; k += 128) { /* a block of 128: its two halves of 64 */
        __m256 s0, s1; /* each lane's scale */
        if (gs == 32) {
            const __m256 s4 = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(sr + k / 32))));
            s0 = _mm256_permutevar8x32_ps(s4, first);
            s1 = _mm256_permutevar8x32_ps(s4, second);
        } else if (gs % 64 == 0) {
            s0 = _mm256_set1_ps((float)sr[k / gs]);
            s1 = _mm256_set1_ps((float)sr[(k + 64) / gs]);
        } else { /* groups of 96, 160, ...: lane j's 8 weights lie in group (k + 8 j) / gs */
            float sl[16];
            for (int64_t j = 0; j < 16; j++) sl[j] = (float)sr[(k + 8 * j) / gs];
            s0 = _mm256_loadu_ps(sl);
            s1 = _mm256_loadu_ps(sl + 8);
        }
        const __m256i t0 = q8_dot64(pr + k / 2, q + k, q + k + 64, low4, ones);
        const __m256i t1 = q8_dot64(pr + k / 2 + 32, q + k + 32, q + k + 96, low4, ones);
        acc0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(t0), _mm256_loadu_ps(dl + k / 8)), s0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(t1), _mm256_loadu_ps(dl + k / 8 + 8)), s1, acc1);
    }
    if (k < K) { /* the last 64 inputs: their even ones' q, then their odd ones' */
        float sl[8];
        for (int64_t j = 0; j < 8; j++) sl[j] = (float)sr[(k + 8 * j) / gs];
        const __m256i t = q8_dot64(pr + k / 2, q + k, q + k + 32, low4, ones);
        acc0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(t), _mm256_loadu_ps(dl + k / 8)), _mm256_loadu_ps(sl), acc0);
    }
    return hsum((f32x8)_mm256_add_ps(acc0, acc1)) + off;
#else
    float off = 0.f;
    for (int64_t g = 0; g < G; g++) off += (float)cr[g] * xg[g];
    float acc = 0.f;
    for (int64_t b = 0; b < K; b += 128) {
        const int64_t half = K - b < 128 ? 32 : 64;
        for (int64_t j = 0; j < half / 4; j++) {
            int32_t t = 0;
            for (int64_t i = 0; i < 4; i++) {
                const uint8_t byte = pr[b / 2 + 4 * j + i];
                t += (byte & 15) * q[b + 4 * j + i] + (byte >> 4) * q[b + half + 4 * j + i];
            }
            acc += (float)t * dl[b / 8 + j] * (float)sr[(b + 8 * j) / gs];
        }
    }
    return acc + off;
#endif
}

/* gemv_i4's weights and call, activations rounded to int8 per block of 32 (above). K a multiple of 64.
   Returns 0, -1 when the scratch cannot be allocated, -2 when K is not a multiple of 64. */
int gemv_i4_q8(const float *x, const uint8_t *packed, const _Float16 *s, const _Float16 *c, float *y, int64_t M,
               int64_t N, int64_t K, int64_t gs, int threads) {
    if (K % 64) return -2;
    const int64_t G = K / gs, half = K / 2, P = pad16(i4q8_prep_floats(K, gs));
    float *scratch = scratch_alloc(M * P);
    if (!scratch) return -1;
    for (int64_t m = 0; m < M; m++) i4q8_prepare(x + m * K, K, gs, scratch + m * P);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *pr = packed + n * half;
        if (n + 1 < N)
            for (int64_t off = 0; off < half; off += 64) PREFETCH(pr + half + off);
        for (int64_t m = 0; m < M; m++) y[m * N + n] = i4q8_row(scratch + m * P, pr, s + n * G, c + n * G, K, gs);
    }
    free(scratch);
    return 0;
}

/* RMSNorm of M rows of D (a decode step's few tokens): y = x / sqrt(mean(x^2) + eps) * w, in fp32, one
   thread (a row of 576 floats is a microsecond of work: torch's reduction costs 20-30 us per call here). */
void rms_norm_rows(const float *x, const float *w, float *y, int64_t M, int64_t D, float eps) {
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * D;
        float *ym = y + m * D;
        f32x8 a = {0};
        int64_t k = 0;
        for (; k + 8 <= D; k += 8) {
            f32x8 v = ld(xm + k);
            a += v * v;
        }
        float ss = hsum(a);
        for (; k < D; k++) ss += xm[k] * xm[k];
        const float r = 1.0f / sqrtf(ss / (float)D + eps);
        for (k = 0; k < D; k++) ym[k] = (xm[k] * r) * w[k];
    }
}
