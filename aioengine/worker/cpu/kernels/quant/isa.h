/* Which code paths this CPU runs (CPUID, asked once), and the cap qk_set_max_level puts on
 * them (CpuKernelConfig.quant_isa: forcing the AVX2 path on an AVX-512 machine measures what
 * AVX2-only CPUs run). */
#ifndef QK_ISA_H
#define QK_ISA_H

int qk_have_avx2(void);
int qk_have_avx512(void);
int qk_have_vnni(void);
/* the best level this CPU runs under the cap: QK_SCALAR, QK_AVX2 or QK_AVX512 */
int qk_best_level(void);
void qk_set_max_level(int level);

#endif
