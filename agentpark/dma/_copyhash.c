/*
 * agentpark/dma/_copyhash.c: copy rows (KV blocks) and hash them with xxh3-64 in one pass.
 *
 * Why native: numpy can copy and xxhash can hash, but not in the same pass, so a
 * checksummed copy reads every byte twice (once from memory, once from cache) and costs
 * 20-30% more than a plain memcpy (README, Benchmarks). Here each 64-byte stripe is loaded
 * once, stored to the destination (with non-temporal stores when asked: a parked copy is
 * not read again soon, and the copy then moves no read-for-ownership traffic), and folded
 * into the hash while it is in registers; the copy stays bound by memory, not by the hash.
 *
 * The digest is exactly XXH3_64bits (seed 0, default secret) of the concatenated rows of a
 * piece: the long-input algorithm of xxHash (github.com/Cyan4973/xxHash, xxhash.h:
 * XXH3_hashLong_64b), re-derived here for a piece whose length is a multiple of 64 bytes
 * and over 240 (the Python side calls this only then, and checks every digest against the
 * xxhash package in tests/dma/test_native.py). Loaded with ctypes (agentpark.dma.native),
 * which lets go of the GIL for the call; the module has no Python API.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define AP_X86 1
#endif

#define STRIPE 64
#define STRIPES_PER_BLOCK 16 /* (sizeof kSecret - STRIPE) / 8 */

static const uint8_t kSecret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};
#define SECRET_SCRAMBLE (sizeof kSecret - STRIPE)      /* 128 */
#define SECRET_LAST_STRIPE (sizeof kSecret - STRIPE - 7) /* 121 */
#define SECRET_MERGE 11

#define P32_1 0x9E3779B1U
#define P32_2 0x85EBCA77U
#define P32_3 0xC2B2AE3DU
#define P64_1 0x9E3779B185EBCA87ULL
#define P64_2 0xC2B2AE3D27D4EB4FULL
#define P64_3 0x165667B19E3779F9ULL
#define P64_4 0x85EBCA77C2B2AE63ULL
#define P64_5 0x27D4EB2F165667C5ULL

static inline uint64_t read64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian hosts only: checked by the Python side */
    return v;
}

static void init_acc(uint64_t acc[8]) {
    const uint64_t init[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    memcpy(acc, init, sizeof init);
}

static void scramble(uint64_t acc[8]) {
    for (int i = 0; i < 8; i++) {
        uint64_t v = acc[i];
        v ^= v >> 47;
        v ^= read64(kSecret + SECRET_SCRAMBLE + 8 * i);
        acc[i] = v * P32_1;
    }
}

static uint64_t merge(const uint64_t acc[8], uint64_t total) {
    uint64_t h = total * P64_1;
    for (int i = 0; i < 4; i++) {
        const uint8_t *s = kSecret + SECRET_MERGE + 16 * i;
        __uint128_t p = (__uint128_t)(acc[2 * i] ^ read64(s)) * (acc[2 * i + 1] ^ read64(s + 8));
        h += (uint64_t)p ^ (uint64_t)(p >> 64);
    }
    h ^= h >> 37; /* XXH3_avalanche */
    h *= 0x165667919E3779F9ULL;
    return h ^ (h >> 32);
}

/* Where the stripe at global index g of a piece of `last + 1` stripes takes its secret:
   the block's stripes in turn, except the very last stripe (xxh3's "last stripe"). */
typedef struct {
    uint64_t g, last;
    unsigned in_block;
} Stripes;

static inline const uint8_t *stripe_secret(const Stripes *st) {
    return st->g < st->last ? kSecret + 8 * st->in_block : kSecret + SECRET_LAST_STRIPE;
}

/* After the stripe: scramble at the end of every full block (never after the last). */
static inline int stripe_done(Stripes *st) {
    int full = st->g < st->last && ++st->in_block == STRIPES_PER_BLOCK;
    if (full) st->in_block = 0;
    st->g++;
    return full;
}

/* Portable path: any CPU, plain stores. */
static uint64_t piece_scalar(uint8_t *dst, const int64_t *dst_rows, const uint8_t *src,
                             const int64_t *src_rows, size_t nrows, size_t row_bytes, int hash) {
    uint64_t acc[8];
    init_acc(acc);
    Stripes st = {0, (uint64_t)(nrows * row_bytes / STRIPE) - 1, 0};
    for (size_t r = 0; r < nrows; r++) {
        const uint8_t *s = src + (size_t)src_rows[r] * row_bytes;
        uint8_t *d = dst + (size_t)dst_rows[r] * row_bytes;
        memcpy(d, s, row_bytes);
        if (!hash) continue;
        for (size_t off = 0; off < row_bytes; off += STRIPE) {
            const uint8_t *key = stripe_secret(&st);
            for (int i = 0; i < 8; i++) {
                uint64_t v = read64(s + off + 8 * i), k = v ^ read64(key + 8 * i);
                acc[i ^ 1] += v;
                acc[i] += (k & 0xFFFFFFFFULL) * (k >> 32);
            }
            if (stripe_done(&st)) scramble(acc);
        }
    }
    return hash ? merge(acc, (uint64_t)(nrows * row_bytes)) : 0;
}

#ifdef AP_X86
/* AVX2 path: each stripe is two 32-byte loads, two stores, and the accumulate on the same
   registers (xxhash.h's XXH3_accumulate_512_avx2). */
__attribute__((target("avx2"))) static inline void acc_stripe_avx2(__m256i acc[2], __m256i d0,
                                                                    __m256i d1,
                                                                    const uint8_t *key) {
    __m256i k0 = _mm256_xor_si256(d0, _mm256_loadu_si256((const __m256i *)key));
    __m256i k1 = _mm256_xor_si256(d1, _mm256_loadu_si256((const __m256i *)(key + 32)));
    __m256i p0 = _mm256_mul_epu32(k0, _mm256_srli_epi64(k0, 32));
    __m256i p1 = _mm256_mul_epu32(k1, _mm256_srli_epi64(k1, 32));
    __m256i s0 = _mm256_shuffle_epi32(d0, _MM_SHUFFLE(1, 0, 3, 2));
    __m256i s1 = _mm256_shuffle_epi32(d1, _MM_SHUFFLE(1, 0, 3, 2));
    acc[0] = _mm256_add_epi64(acc[0], _mm256_add_epi64(p0, s0));
    acc[1] = _mm256_add_epi64(acc[1], _mm256_add_epi64(p1, s1));
}

__attribute__((target("avx2"))) static uint64_t piece_avx2(uint8_t *dst, const int64_t *dst_rows,
                                                           const uint8_t *src,
                                                           const int64_t *src_rows, size_t nrows,
                                                           size_t row_bytes, int hash, int stream) {
    uint64_t lanes[8];
    init_acc(lanes);
    __m256i acc[2] = {_mm256_loadu_si256((const __m256i *)lanes),
                      _mm256_loadu_si256((const __m256i *)(lanes + 4))};
    Stripes st = {0, (uint64_t)(nrows * row_bytes / STRIPE) - 1, 0};
    for (size_t r = 0; r < nrows; r++) {
        const uint8_t *s = src + (size_t)src_rows[r] * row_bytes;
        uint8_t *d = dst + (size_t)dst_rows[r] * row_bytes;
        for (size_t off = 0; off < row_bytes; off += STRIPE) {
            __m256i d0 = _mm256_loadu_si256((const __m256i *)(s + off));
            __m256i d1 = _mm256_loadu_si256((const __m256i *)(s + off + 32));
            if (stream) {
                _mm256_stream_si256((__m256i *)(d + off), d0);
                _mm256_stream_si256((__m256i *)(d + off + 32), d1);
            } else {
                _mm256_storeu_si256((__m256i *)(d + off), d0);
                _mm256_storeu_si256((__m256i *)(d + off + 32), d1);
            }
            if (!hash) continue;
            acc_stripe_avx2(acc, d0, d1, stripe_secret(&st));
            if (stripe_done(&st)) {
                _mm256_storeu_si256((__m256i *)lanes, acc[0]);
                _mm256_storeu_si256((__m256i *)(lanes + 4), acc[1]);
                scramble(lanes);
                acc[0] = _mm256_loadu_si256((const __m256i *)lanes);
                acc[1] = _mm256_loadu_si256((const __m256i *)(lanes + 4));
            }
        }
    }
    if (!hash) return 0;
    _mm256_storeu_si256((__m256i *)lanes, acc[0]);
    _mm256_storeu_si256((__m256i *)(lanes + 4), acc[1]);
    return merge(lanes, (uint64_t)(nrows * row_bytes));
}
#endif

/* Which path this CPU runs: 2 = AVX2 (non-temporal stores possible), 1 = portable. */
int agentpark_copyhash_path(void) {
#ifdef AP_X86
    if (__builtin_cpu_supports("avx2")) return 2;
#endif
    return 1;
}

#define FLAG_STREAM 1   /* non-temporal stores where the destination allows */
#define FLAG_PORTABLE 2 /* the portable path even on an AVX2 CPU (tests) */

/*
 * Copy src row src_rows[i] to dst row dst_rows[i] for i < nrows (rows of row_bytes, a
 * multiple of 64). With digests != NULL, rows go in pieces of piece_rows rows (the last
 * may be shorter) and digests[j * digest_stride] gets piece j's xxh3-64; every piece must
 * then be over 240 bytes. FLAG_STREAM: non-temporal stores where the destination allows
 * (AVX2, 32-byte aligned), fenced before returning. The caller checks every row index.
 * Returns 0, or -1 for arguments this kernel does not take (nothing is copied then).
 */
int agentpark_copy_rows(uint8_t *dst, const int64_t *dst_rows, const uint8_t *src,
                        const int64_t *src_rows, size_t nrows, size_t row_bytes,
                        size_t piece_rows, uint64_t *digests, size_t digest_stride, int flags) {
    int stream = flags & FLAG_STREAM;
    if (row_bytes == 0 || row_bytes % STRIPE) return -1;
    int hash = digests != NULL;
    if (!hash || piece_rows == 0) piece_rows = nrows ? nrows : 1;
    if (hash && (nrows % piece_rows ? nrows % piece_rows : piece_rows) * row_bytes <= 240)
        return -1;
    int path = flags & FLAG_PORTABLE ? 1 : agentpark_copyhash_path();
#ifdef AP_X86
    stream = stream && path == 2 && ((uintptr_t)dst & 31) == 0;
#else
    stream = 0;
#endif
    for (size_t lo = 0, j = 0; lo < nrows; lo += piece_rows, j++) {
        size_t n = nrows - lo < piece_rows ? nrows - lo : piece_rows;
        uint64_t h;
#ifdef AP_X86
        if (path == 2)
            h = piece_avx2(dst, dst_rows + lo, src, src_rows + lo, n, row_bytes, hash, stream);
        else
#endif
            h = piece_scalar(dst, dst_rows + lo, src, src_rows + lo, n, row_bytes, hash);
        if (hash) digests[j * digest_stride] = h;
    }
#ifdef AP_X86
    if (stream) _mm_sfence();
#endif
    return 0;
}
