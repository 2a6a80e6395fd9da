/* A whole Llama decode step in one call: what llama.cpp does on a CPU, written beside the torch reference.

   A small model's decode step on a CPU is ~100 weight products and ~1,000 small torch ops; each op costs a
   few microseconds of dispatch and each product a fork and join of the thread pool, which adds up to as
   much as the products themselves on SmolLM2-135M. This step runs every layer inside ONE OpenMP parallel
   region: the products split their rows over the threads (the kernels of gemv.c), the small work (RMSNorm,
   RoPE, the K/V writes, attention for one query per head, SwiGLU) runs between barriers, and nothing
   returns to Python until the logits are written.

   The maths is the reference's (course_lib.engine.model.run_layers), one token per sequence over the
   contiguous cache (rows, kv_heads, max_len, head_dim): RMSNorm -> q/k/v (one product) -> RoPE on q and k
   -> k, v into the cache at the token's position -> softmax(q.K / sqrt(hd)) V over keys 0..pos (GQA: query
   head h reads kv head h / (H / Hkv)) -> o product + residual -> RMSNorm -> gate/up (one product) ->
   silu(gate) * up -> down product + residual; then the final norm and the head. fp32 activations
   throughout; the weights of each product are fp32, int8 per channel or int4 groups (gemv.c's layouts).
   Built and tested by course_lib.kernels.cpu_gemv / course_lib.engine.native_step. */
#include "gemv.c"

/* One product y = x W^T (* scale) + bias. kind 0: fp32 W (N, K); 1: int8 W (N, K) and an fp32 scale per row;
   2: int4 (gemv_i4's layout: packed (N, K/2), fp16 s and c (N, K/gs)); 3: the same int4 with the
   activations rounded to int8 per block of 32 (gemv_i4_q8, K a multiple of 64). */
typedef struct {
    int64_t kind, N, K, gs;
    const void *w, *s, *c;
    const float *bias;
} lin_t;

typedef struct {
    const float *attn_norm, *mlp_norm;
    lin_t qkv, o, gate_up, down;
    float *k, *v; /* this layer's cache, (rows, Hkv, max_len, hd) */
} layer_t;

typedef struct {
    int64_t n_layers, D, H, Hkv, hd, F, V, max_len, kmax;
    float eps, scale;
    const float *embed, *final_norm, *cos, *sin; /* embed (V, D); RoPE tables (positions, hd) */
    lin_t head;
    const layer_t *layers;
} model_t;

/* Inside a parallel region: y (M, N) = x (M, K) W^T, or y += that when acc (the residual). scr holds
   M rows of pad16(kmax + kmax / 32) floats for the int4 path's rearranged inputs, 64-byte aligned. Ends on a
   barrier. */
static void lin_run(const lin_t *L, const float *x, float *y, int64_t M, int acc, float *scr) {
    const int64_t N = L->N, K = L->K;
    const float *bias = L->bias;
    if (L->kind == 2 || L->kind == 3) { /* int4; kind 3 rounds the activations to int8 per 32 (gemv_i4_q8) */
        const int q8 = L->kind == 3;
        const int64_t gs = L->gs, G = K / gs, half = K / 2, P = pad16(q8 ? i4q8_prep_floats(K, gs) : K + G);
        const uint8_t *packed = L->w;
        const _Float16 *s = L->s, *c = L->c;
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            if (q8) i4q8_prepare(x + m * K, K, gs, scr + m * P);
            else i4_prepare(x + m * K, K, gs, scr + m * P);
        }
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const uint8_t *pr = packed + n * half;
            if (n + 1 < N)
                for (int64_t off = 0; off < half; off += 64) PREFETCH(pr + half + off);
            for (int64_t m = 0; m < M; m++) {
                const float *xm = scr + m * P;
                float r = q8 ? i4q8_row(xm, pr, s + n * G, c + n * G, K, gs)
                             : i4_row(xm, xm + half, xm + K, pr, s + n * G, c + n * G, G, gs);
                if (bias) r += bias[n];
                y[m * N + n] = acc ? y[m * N + n] + r : r;
            }
        }
        return;
    }
    const float *scale = L->kind == 1 ? (const float *)L->s : NULL;
    const int64_t blocks = (N + RB - 1) / RB;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t n0 = b * RB, rows = N - n0 < RB ? N - n0 : RB;
        for (int64_t m = 0; m < M; m++) {
            float sv[RB], *ym = y + m * N + n0;
            const float *xm = x + m * K;
            if (L->kind == 0) {
                const float *w = (const float *)L->w + n0 * K;
                if (rows == RB) dot4_float(xm, w, K, sv);
                else for (int64_t r = 0; r < rows; r++) sv[r] = dot1_float(xm, w + r * K, K);
            } else {
                const int8_t *w = (const int8_t *)L->w + n0 * K;
                if (rows == RB) dot4_int8_t(xm, w, K, sv);
                else for (int64_t r = 0; r < rows; r++) sv[r] = dot1_int8_t(xm, w + r * K, K);
            }
            for (int64_t r = 0; r < rows; r++) {
                float v = scale ? sv[r] * scale[n0 + r] : sv[r];
                if (bias) v += bias[n0 + r];
                ym[r] = acc ? ym[r] + v : v;
            }
        }
    }
}

/* RoPE in place on one head of hd floats: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), tables (hd,). */
static inline void rope_head(float *x, const float *cs, const float *sn, int64_t hd) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i + half] + a * sn[i + half];
    }
}

/* softmax(q . K[0..L) * scale) V for one query head: keys and values (L, hd) rows; sc: L floats of scratch. */
static void attend_one(const float *q, const float *keys, const float *vals, int64_t L, int64_t hd, float scale,
                       float *sc, float *out) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < L; j++) {
        const float *kj = keys + j * hd;
        f32x8 a = {0};
        int64_t d = 0;
        for (; d + 8 <= hd; d += 8) a += ld(q + d) * ld(kj + d);
        float s = hsum(a);
        for (; d < hd; d++) s += q[d] * kj[d];
        s *= scale;
        sc[j] = s;
        if (s > mx) mx = s;
    }
    float sum = 0.f;
    for (int64_t j = 0; j < L; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t d = 0; d < hd; d++) out[d] = 0.f;
    for (int64_t j = 0; j < L; j++) {
        const float p = sc[j] * inv, *vj = vals + j * hd;
        for (int64_t d = 0; d < hd; d++) out[d] += p * vj[d];
    }
}

/* Floats of work memory decode_step needs for M rows (the + 32: the int4 scratch starts, and each row's part
   of it, on a cache line). */
int64_t decode_work_floats(const model_t *m, int64_t M) {
    const int64_t Q = (m->H + 2 * m->Hkv) * m->hd;
    return M * (2 * m->D + Q + m->H * m->hd + 3 * m->F + m->H * m->max_len + m->kmax + m->kmax / 32 + 32);
}

/* One decode step for M sequences: token ids[m] at position pos[m] of cache row rows[m]. Writes each layer's
   k, v at that position and logits (M, V). work: decode_work_floats(m, M) floats. Returns 0. */
int decode_step(const model_t *md, const int64_t *ids, const int64_t *pos, const int64_t *rows, int64_t M,
                float *logits, float *work, int threads) {
    const int64_t D = md->D, H = md->H, Hkv = md->Hkv, hd = md->hd, F = md->F, T = md->max_len;
    const int64_t Q = (H + 2 * Hkv) * hd, group = H / Hkv, row_stride = Hkv * T * hd;
    float *x = work, *h = x + M * D, *qkv = h + M * D, *att = qkv + M * Q, *gu = att + M * H * hd;
    float *act = gu + M * 2 * F, *sc = act + M * F;
    float *scr = (float *)(((uintptr_t)(sc + M * H * T) + 63) & ~(uintptr_t)63); /* on a cache line (pad16) */
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) memcpy(x + m * D, md->embed + ids[m] * D, sizeof(float) * D);
        for (int64_t l = 0; l < md->n_layers; l++) {
            const layer_t *L = &md->layers[l];
#pragma omp single
            rms_norm_rows(x, L->attn_norm, h, M, D, md->eps);
            lin_run(&L->qkv, h, qkv, M, 0, scr);
#pragma omp for schedule(static)
            for (int64_t i = 0; i < M * (H + Hkv); i++) { /* RoPE on each query and key head */
                const int64_t m = i / (H + Hkv), j = i % (H + Hkv);
                float *xh = qkv + m * Q + j * hd;
                rope_head(xh, md->cos + pos[m] * hd, md->sin + pos[m] * hd, hd);
                if (j >= H) { /* a key head: it and its value go into the cache */
                    const int64_t kvh = j - H, off = rows[m] * row_stride + kvh * T * hd + pos[m] * hd;
                    memcpy(L->k + off, xh, sizeof(float) * hd);
                    memcpy(L->v + off, qkv + m * Q + (H + Hkv + kvh) * hd, sizeof(float) * hd);
                }
            }
#pragma omp for schedule(static)
            for (int64_t i = 0; i < M * H; i++) { /* attention: one query head over its kv head's keys */
                const int64_t m = i / H, hh = i % H, kvh = hh / group;
                const int64_t off = rows[m] * row_stride + kvh * T * hd;
                attend_one(qkv + m * Q + hh * hd, L->k + off, L->v + off, pos[m] + 1, hd, md->scale, sc + i * T,
                           att + m * H * hd + hh * hd);
            }
            lin_run(&L->o, att, x, M, 1, scr);
#pragma omp single
            rms_norm_rows(x, L->mlp_norm, h, M, D, md->eps);
            lin_run(&L->gate_up, h, gu, M, 0, scr);
#pragma omp for schedule(static)
            for (int64_t i = 0; i < M * F; i++) { /* SwiGLU: silu(gate) * up */
                const int64_t m = i / F, f = i % F;
                const float g = gu[m * 2 * F + f];
                act[i] = g / (1.0f + expf(-g)) * gu[m * 2 * F + F + f];
            }
            lin_run(&L->down, act, x, M, 1, scr);
        }
#pragma omp single
        rms_norm_rows(x, md->final_norm, h, M, D, md->eps);
        lin_run(&md->head, h, logits, M, 0, scr);
    }
    return 0;
}
