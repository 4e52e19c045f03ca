#include "base.h"
#include "isa.h"

#include <stdatomic.h>

#if QK_X86
int qk_have_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                 __builtin_cpu_supports("f16c");
    }
    return cached;
}

int qk_have_avx512(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = qk_have_avx2() && __builtin_cpu_supports("avx512f");
    }
    return cached;
}

int qk_have_vnni(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = qk_have_avx512() && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512vnni");
    }
    return cached;
}
#else
int qk_have_avx2(void) { return 0; }
int qk_have_avx512(void) { return 0; }
int qk_have_vnni(void) { return 0; }
#endif

int qk_version(void) { return QK_VERSION; }

static _Atomic int max_level = QK_AVX512;

int qk_best_level(void) {
    int best = qk_have_avx512() ? QK_AVX512 : qk_have_avx2() ? QK_AVX2 : QK_SCALAR;
    int cap = atomic_load(&max_level);
    return best < cap ? best : cap;
}

void qk_set_max_level(int level) {
    atomic_store(&max_level, level < 0 ? 0 : level > QK_AVX512 ? QK_AVX512 : level);
}
