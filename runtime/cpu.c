/* CPU identification through CPUID (brand string) and the compiler's feature checks. */
#include "cpu.h"
#include "flashdecode.h"
#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>
#include <ctype.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char model[64], features[128];

/* Fill model and features once. */
static void probe(void) {
  unsigned r[12] = { 0 };
  if (__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
    for (unsigned i = 0; i < 3; i++) __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    memcpy(model, r, 48);
  }
  char *s = model;
  while (*s == ' ') s++;
  memmove(model, s, strlen(s) + 1);
  for (size_t n = strlen(model); n > 0 && model[n - 1] == ' '; n--) model[n - 1] = 0;
  if (!model[0]) snprintf(model, sizeof model, "unknown x86-64");
  __builtin_cpu_init();
  static const char *names[] = { "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl" };
  int have[] = { __builtin_cpu_supports("avx2"), __builtin_cpu_supports("fma"), 0,
                 __builtin_cpu_supports("avx512f"), __builtin_cpu_supports("avx512bw"),
                 __builtin_cpu_supports("avx512vl") };
  unsigned a, b, c, d;
  if (__get_cpuid(1, &a, &b, &c, &d)) have[2] = (c >> 29) & 1;   /* F16C */
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (have[i]) snprintf(features + strlen(features), sizeof features - strlen(features), "%s%s", features[0] ? " " : "", names[i]);
}

/* The CPU brand string. */
const char *fd_cpu_model(void) { pthread_once(&once, probe); return model; }
/* The SIMD features present. */
const char *fd_cpu_features(void) { pthread_once(&once, probe); return features; }
/* XCR0: the register state the OS saves (0 when XGETBV is unavailable). */
static unsigned long long xcr0(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0;   /* OSXSAVE */
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}

/* The highest isa digit the CPU has and the OS enables:
   1 = AVX2 + FMA + F16C with YMM state; 2 = AVX-512 F, BW, VL with opmask and ZMM state too. */
int fd_cpu_max_isa(void) {
  unsigned long long x = xcr0();
  unsigned a, b, c, d;
  int avx_os = (x & 0x6) == 0x6, avx512_os = (x & 0xe6) == 0xe6;
  if (!avx_os || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
  int fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  int avx2 = (b >> 5) & 1, f = (b >> 16) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
  if (!(avx2 && fma && f16c)) return 0;
  return avx512_os && f && bw && vl ? 2 : 1;
}

static pthread_once_t name_once = PTHREAD_ONCE_INIT;
static char machine[96];

/* Build the machine slug: lower-case model words joined by '-', then the core count. */
static void make_name(void) {
  size_t n = 0;
  for (const char *c = fd_cpu_model(); *c && n < 60; c++) {
    if (isalnum((unsigned char)*c)) machine[n++] = (char)tolower((unsigned char)*c);
    else if (n && machine[n - 1] != '-') machine[n++] = '-';
  }
  while (n && machine[n - 1] == '-') n--;
  snprintf(machine + n, sizeof machine - n, "-%ldc", sysconf(_SC_NPROCESSORS_ONLN));
}

/* A short name for this machine. */
const char *fd_machine_name(void) { pthread_once(&name_once, make_name); return machine; }
