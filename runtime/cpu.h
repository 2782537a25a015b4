/* What this CPU is and can run. */
#ifndef FD_CPU_H
#define FD_CPU_H
/* The CPU brand string, trimmed ("AMD EPYC 9654 96-Core Processor"). */
const char *fd_cpu_model(void);
/* The SIMD features the kernels may use, space-separated, e.g. "avx2 fma f16c avx512f". */
const char *fd_cpu_features(void);
/* The highest ISA digit this CPU and OS support: 0 portable C, 1 AVX2+FMA+F16C, 2 AVX-512. */
int fd_cpu_max_isa(void);
#endif
