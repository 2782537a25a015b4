/* CPU identification through CPUID: the brand string, and the features and
   register state the ISA records of gen/facts.lua (fd_keydefs.h) need. */
#include "cpu.h"
#include "flashdecode.h"
#include "fd_keydefs.h"
#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>
#include <ctype.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char model[64], features[128], vendor[13];

/* XCR0: the register state the OS saves (0 when XGETBV is unavailable). */
static unsigned long long xcr0(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0;   /* OSXSAVE */
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}

/* Whether the CPU reports feature f and the OS saves the register state of its isa. */
static int has_feature(const fd_cpuid_bit *f) {
  unsigned r[4];
  if (__get_cpuid_max(f->leaf & 0x80000000u, NULL) < f->leaf) return 0;
  if (!__get_cpuid_count(f->leaf, f->subleaf, &r[0], &r[1], &r[2], &r[3])) return 0;
  unsigned long long want = fd_isa_table[f->isa].xcr0;
  return (r[f->reg] >> f->bit) & 1 && (xcr0() & want) == want;
}

/* Fill model and features once. */
static void probe(void) {
  unsigned r[12] = { 0 };
  if (__get_cpuid(0, &r[0], &r[1], &r[3], &r[2])) memcpy(vendor, &r[1], 12);   /* ebx, edx, ecx */
  if (__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
    for (unsigned i = 0; i < 3; i++) __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    memcpy(model, r, 48);
  }
  char *s = model;
  while (*s == ' ') s++;
  memmove(model, s, strlen(s) + 1);
  for (size_t n = strlen(model); n > 0 && model[n - 1] == ' '; n--) model[n - 1] = 0;
  if (!model[0]) snprintf(model, sizeof model, "unknown x86-64");
  for (int i = 0; i < FD_CPUID_FEATURES; i++)
    if (has_feature(&fd_cpuid_bits[i]))
      snprintf(features + strlen(features), sizeof features - strlen(features), "%s%s", features[0] ? " " : "",
               fd_cpuid_bits[i].name);
}

/* The CPU brand string. */
const char *fd_cpu_model(void) { pthread_once(&once, probe); return model; }
/* Whether the vendor is Intel (cpu.h). */
int fd_cpu_intel(void) { pthread_once(&once, probe); return strcmp(vendor, "GenuineIntel") == 0; }
/* The SIMD features present. */
const char *fd_cpu_features(void) { pthread_once(&once, probe); return features; }
/* Whether every CPU feature of isa's record, and of each record on its
   fallback chain, is present; isa 0 (portable C) needs none. */
static int isa_present(int isa) {
  for (; isa >= 0; isa = fd_isa_table[isa].fallback)
    for (int i = 0; i < FD_CPUID_FEATURES; i++)
      if ((fd_isa_table[isa].cpuid_mask >> i) & 1 && !has_feature(&fd_cpuid_bits[i])) return 0;
  return 1;
}

/* The isa digit of the highest rank whose record's features the CPU has and
   whose register state the OS saves (xcr0); 0 = portable C. */
int fd_cpu_max_isa(void) {
  int best = 0;
  for (int isa = 1; isa < FD_ISA_COUNT; isa++)
    if (isa_present(isa) && fd_isa_table[isa].rank > fd_isa_table[best].rank) best = isa;
  return best;
}

/* Whether the CPU and OS support isa (cpu.h). */
int fd_cpu_has_isa(int isa) { return isa >= 0 && isa < FD_ISA_COUNT && isa_present(isa); }

/* Whether isa ranks at most max (cpu.h): the records form one fallback chain. */
int fd_isa_within(int isa, int max) {
  return isa >= 0 && isa < FD_ISA_COUNT && max >= 0 && max < FD_ISA_COUNT && fd_isa_table[isa].rank <= fd_isa_table[max].rank;
}

static pthread_once_t name_once = PTHREAD_ONCE_INIT;
static char machine[96];

/* The words the slug leaves out: the marks (R) and (TM) and two generic
   nouns. fd_machine_slug also cuts the clock (from '@') and "N-Core" (a
   word of digits, '-', then "core"). */
static const char *const SLUG_DROP[] = { "r", "tm", "processor", "cpu" };

/* Whether word w (n bytes) is one the slug leaves out. */
static int slug_drops(const char *w, size_t n) {
  for (size_t i = 0; i < sizeof SLUG_DROP / sizeof *SLUG_DROP; i++)
    if (strlen(SLUG_DROP[i]) == n && strncmp(w, SLUG_DROP[i], n) == 0) return 1;
  return 0;
}

/* Whether the n bytes at w are all digits. */
static int all_digits(const char *w, size_t n) {
  for (size_t i = 0; i < n; i++) if (!isdigit((unsigned char)w[i])) return 0;
  return n > 0;
}

/* The machine slug of model, cores and isa (cpu.h). */
int fd_machine_slug(const char *model, long cores, const char *isa, char *out, size_t len) {
  char low[128];
  size_t m = 0, n = 0;
  for (const char *c = model; *c && *c != '@' && m < sizeof low - 1; c++) low[m++] = (char)tolower((unsigned char)*c);
  low[m] = 0;
  for (size_t i = 0; i < m;) {
    if (!isalnum((unsigned char)low[i])) { i++; continue; }
    size_t j = i;
    while (j < m && isalnum((unsigned char)low[j])) j++;
    int core_count = all_digits(low + i, j - i) && strncmp(low + j, "-core", 5) == 0 &&
                     !isalnum((unsigned char)low[j + 5]);
    if (core_count) j += 5;
    else if (!slug_drops(low + i, j - i)) {
      if (n && n < len) out[n++] = '-';
      for (size_t k = i; k < j && n < len; k++) out[n++] = low[k];
    }
    i = j;
  }
  if (n >= len) return -1;
  int r = snprintf(out + n, len - n, n ? "-%ldc%s%s" : "cpu-%ldc%s%s", cores, isa && *isa ? "-" : "", isa ? isa : "");
  return r < 0 || n + (size_t)r >= len ? -1 : 0;
}

/* Build this machine's slug. */
static void make_name(void) {
  const char *isa = fd_isa_table[fd_cpu_max_isa()].name;
  if (fd_machine_slug(fd_cpu_model(), sysconf(_SC_NPROCESSORS_ONLN), isa, machine, sizeof machine))
    snprintf(machine, sizeof machine, "cpu-%ldc-%s", sysconf(_SC_NPROCESSORS_ONLN), isa);
}

/* A short name for this machine. */
const char *fd_machine_name(void) { pthread_once(&name_once, make_name); return machine; }
