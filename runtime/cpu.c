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
/* Only portable C kernels are generated so far. */
int fd_cpu_max_isa(void) { return 0; }

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
