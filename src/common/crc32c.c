/* crc32c.c: CRC-32C (Castagnoli), the checksum safetensors files carry.
 *
 * Slicing-by-8 over the reflected polynomial 0x82F63B78: eight 256-entry
 * tables let one step consume 8 bytes, several times faster than the
 * classic byte table, which is still used for the unaligned head and tail.
 * The tables are computed once (pthread_once) rather than spelled out here.
 * Init and final xor are 0xFFFFFFFF and undone between calls, so
 * crc32c(crc32c(0, a, n), b, m) equals the checksum of a followed by b.
 *
 * On x86-64 processors with SSE4.2 the CRC32 instruction computes the same
 * polynomial 8 bytes at a time (several times the tables' speed: what lets
 * a start check gigabytes of token files in well under a second); the
 * choice is made once, at run time, and crc32c_portable keeps the tables'
 * path callable so the test holds both to the same reference.
 */
#include "safetensors.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY_REFLECTED 0x82F63B78u

static uint32_t g_crc_table[8][256]; /* read-only after g_crc_once */
static pthread_once_t g_crc_once = PTHREAD_ONCE_INIT;

static void crc32c_init_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1u) ? (c >> 1) ^ CRC32C_POLY_REFLECTED : c >> 1;
        g_crc_table[0][i] = c;
    }
    /* table[s][i]: the crc of byte i followed by s zero bytes */
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = g_crc_table[0][i];
        for (int s = 1; s < 8; s++) {
            c = g_crc_table[0][c & 0xFFu] ^ (c >> 8);
            g_crc_table[s][i] = c;
        }
    }
}

uint32_t crc32c_portable(uint32_t crc, const void *buf, size_t n_bytes) {
    pthread_once(&g_crc_once, crc32c_init_tables);
    const uint32_t (*t)[256] = (const uint32_t (*)[256])g_crc_table;
    const uint8_t *p = buf;
    uint32_t c = ~crc;

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n_bytes > 0 && ((uintptr_t)p & 7u) != 0) {
        c = t[0][(c ^ *p++) & 0xFFu] ^ (c >> 8);
        n_bytes--;
    }
    while (n_bytes >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = t[7][w & 0xFFu] ^ t[6][(w >> 8) & 0xFFu] ^
            t[5][(w >> 16) & 0xFFu] ^ t[4][(w >> 24) & 0xFFu] ^
            t[3][(w >> 32) & 0xFFu] ^ t[2][(w >> 40) & 0xFFu] ^
            t[1][(w >> 48) & 0xFFu] ^ t[0][w >> 56];
        p += 8;
        n_bytes -= 8;
    }
#endif
    while (n_bytes > 0) {
        c = t[0][(c ^ *p++) & 0xFFu] ^ (c >> 8);
        n_bytes--;
    }
    return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *buf, size_t n_bytes) {
    const uint8_t *p = buf;
    uint64_t c = ~crc;
    while (n_bytes > 0 && ((uintptr_t)p & 7u) != 0) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        n_bytes--;
    }
    while (n_bytes >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n_bytes -= 8;
    }
    while (n_bytes > 0) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        n_bytes--;
    }
    return ~(uint32_t)c;
}

static int g_crc_hw = -1; /* -1 unknown, 0 tables, 1 SSE4.2; a benign race: every thread stores the same value */

uint32_t crc32c(uint32_t crc, const void *buf, size_t n_bytes) {
    int hw = __atomic_load_n(&g_crc_hw, __ATOMIC_RELAXED);
    if (hw < 0) {
        __builtin_cpu_init();
        hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
        __atomic_store_n(&g_crc_hw, hw, __ATOMIC_RELAXED);
    }
    return hw ? crc32c_sse42(crc, buf, n_bytes) : crc32c_portable(crc, buf, n_bytes);
}

bool crc32c_hardware(void) {
    (void)crc32c(0, "", 0);
    return __atomic_load_n(&g_crc_hw, __ATOMIC_RELAXED) == 1;
}
#else
uint32_t crc32c(uint32_t crc, const void *buf, size_t n_bytes) { return crc32c_portable(crc, buf, n_bytes); }
bool crc32c_hardware(void) { return false; }
#endif
