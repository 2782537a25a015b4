/* What this CPU is and can run. */
#ifndef FD_CPU_H
#define FD_CPU_H
#include <stddef.h>
/* The CPU brand string, trimmed ("AMD EPYC 9654 96-Core Processor"). */
const char *fd_cpu_model(void);
/* Whether the CPU's vendor is Intel (CPUID leaf 0: "GenuineIntel"). */
int fd_cpu_intel(void);
/* The SIMD features the kernels may use, space-separated, e.g. "avx2 fma f16c avx512f". */
const char *fd_cpu_features(void);
/* The best ISA digit this CPU and OS support (of the highest rank, gen/facts.lua
   isa_rank): 0 portable C, 1 AVX2+FMA+F16C, 2 AVX-512, 4 AVX-512+VNNI, 3 AVX-512+BF16+VNNI. */
int fd_cpu_max_isa(void);
/* Whether this CPU and OS support isa digit isa (its record and those it falls back to). */
int fd_cpu_has_isa(int isa);
/* Whether isa digit isa is one a context of best digit max may use: rank at most max's. */
int fd_isa_within(int isa, int max);
/* The machine slug of result file names (fd_machine_name) into out: the model
   lowercased, up to any '@' (the clock), without the words (R), (TM),
   Processor, CPU and "N-Core", its words joined by '-', then "-<cores>c" and,
   unless isa is NULL or "", "-<isa>", the name of the best isa record
   ("AMD EPYC 9654 96-Core Processor", 2, "avx512bf16" ->
   "amd-epyc-9654-2c-avx512bf16"): two CPUs of one brand string, as a VM
   shows a Zen 3 and a Zen 5 EPYC, get the tuned table and reports of their
   own isa; 0, or -1 when it does not fit in len bytes. */
int fd_machine_slug(const char *model, long cores, const char *isa, char *out, size_t len);
#endif
