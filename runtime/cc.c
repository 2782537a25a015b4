/* cc backend: `cc -O3 -march=native -shared -fPIC` (and -g under $FD_CC_DEBUG)
   into a cache directory named by key + source hash + compiler hash, reused
   across runs; dlopen. */
#include "cc.h"
#include "hash.h"
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct fd_cc_unit { void *dl; };

static pthread_once_t version_once = PTHREAD_ONCE_INIT;
static char version[256];

/* The compiler command: $CC or cc. */
static const char *compiler(void) {
  const char *cc = getenv("CC");
  return cc && *cc ? cc : "cc";
}

/* Read the first line of `cc --version` once. */
static void probe_version(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s --version 2>/dev/null", compiler());
  FILE *p = popen(cmd, "r");
  if (!p) return;
  if (!fgets(version, sizeof version, p)) version[0] = 0;
  if (pclose(p) != 0) version[0] = 0;
  version[strcspn(version, "\n")] = 0;
}

/* The compiler's version line, or NULL when no compiler runs. */
const char *fd_cc_version(void) {
  pthread_once(&version_once, probe_version);
  return version[0] ? version : NULL;
}

/* Whether $FD_CC_DEBUG (set, not "0") asks for kernels a profiler or debugger
   maps back to the templates: generated with #line directives, compiled with -g
   (the same machine code: -g adds only debug sections). */
int fd_cc_debug(void) {
  const char *e = getenv("FD_CC_DEBUG");
  return e && *e && strcmp(e, "0") != 0;
}

/* FNV-1a of a string. */
static uint64_t hash64(const char *s) { return fd_fnv1a(FD_FNV_START, s, strlen(s)); }

/* $FD_CACHE_DIR, $XDG_CACHE_HOME/flashdecode, ~/.cache/flashdecode or /tmp/flashdecode-cache. */
const char *fd_cc_default_dir(void) {
  static _Thread_local char dir[1024];
  const char *e = getenv("FD_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
  if (e && *e) snprintf(dir, sizeof dir, "%s", e);
  else if (x && *x) snprintf(dir, sizeof dir, "%s/flashdecode", x);
  else if (h && *h) snprintf(dir, sizeof dir, "%s/.cache/flashdecode", h);
  else snprintf(dir, sizeof dir, "/tmp/flashdecode-cache");
  return dir;
}

/* mkdir -p. */
static int make_dirs(const char *path) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') { *p = 0; if (mkdir(buf, 0755) && errno != EEXIST) return -1; *p = '/'; }
  return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

/* Whether dir (NULL: the default) can hold the cache: created if missing, a
   directory, and a file can be created in it; 0, or -1 with the reason. */
int fd_cc_check_dir(const char *dir, char *why, size_t whylen) {
  if (!dir) dir = fd_cc_default_dir();
  struct stat st;
  if (make_dirs(dir) || stat(dir, &st)) { snprintf(why, whylen, "cannot create cache directory %s: %s", dir, strerror(errno)); return -1; }
  if (!S_ISDIR(st.st_mode)) { snprintf(why, whylen, "cache directory %s is not a directory", dir); return -1; }
  char probe[1100];
  snprintf(probe, sizeof probe, "%s/.fd-probe-XXXXXX", dir);
  int fd = mkstemp(probe);
  if (fd < 0) { snprintf(why, whylen, "cannot write in cache directory %s: %s", dir, strerror(errno)); return -1; }
  close(fd);
  unlink(probe);
  return 0;
}

/* Write src to path; -1 on failure. */
static int write_file(const char *path, const char *src) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  int ok = fputs(src, f) >= 0;
  return fclose(f) == 0 && ok ? 0 : -1;
}

/* Run the compiler on csrc into so; its messages go to err. */
static int run_compiler(const char *csrc, const char *so, char *err, size_t errlen) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s -O3 -march=native -shared -fPIC -w%s -o '%s' '%s' 2>&1", compiler(),
           fd_cc_debug() ? " -g" : "", so, csrc);
  FILE *p = popen(cmd, "r");
  if (!p) { snprintf(err, errlen, "cc backend: cannot run %s", compiler()); return -1; }
  size_t n = (size_t)snprintf(err, errlen, "cc backend: %s failed: ", compiler());
  if (n >= errlen) n = errlen - 1;
  n += fread(err + n, 1, errlen - n - 1, p);
  err[n] = 0;
  int rc = pclose(p);
  if (rc == 0) err[0] = 0;
  return rc == 0 ? 0 : -1;
}

/* Compile or reuse the cached library of key; see cc.h. */
int fd_cc_compile(const char *src, const char *key, const char *cache_dir, const char *symbol,
                  fd_cc_unit **unit, void **addr, char *err, size_t errlen) {
  const char *ver = fd_cc_version();
  if (!ver) { snprintf(err, errlen, "cc backend: no C compiler (%s) found", compiler()); return -1; }
  if (!cache_dir) cache_dir = fd_cc_default_dir();
  if (make_dirs(cache_dir)) { snprintf(err, errlen, "cc backend: cannot create cache directory %s: %s", cache_dir, strerror(errno)); return -1; }
  char so[1200], tmp_c[1300], tmp_so[1300];
  snprintf(so, sizeof so, "%s/fd_k%s-%016llx-%08llx.so", cache_dir, key,
           (unsigned long long)hash64(src), (unsigned long long)(hash64(ver) & 0xffffffffu));
  if (access(so, R_OK) != 0) {
    snprintf(tmp_c, sizeof tmp_c, "%s.%d.%lx.c", so, (int)getpid(), (unsigned long)pthread_self());
    snprintf(tmp_so, sizeof tmp_so, "%s.%d.%lx.tmp", so, (int)getpid(), (unsigned long)pthread_self());
    if (write_file(tmp_c, src)) { snprintf(err, errlen, "cc backend: cannot write %s: %s", tmp_c, strerror(errno)); return -1; }
    int rc = run_compiler(tmp_c, tmp_so, err, errlen);
    unlink(tmp_c);
    if (rc || rename(tmp_so, so)) { unlink(tmp_so); if (!rc) snprintf(err, errlen, "cc backend: cannot rename into %s", so); return -1; }
  }
  void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!dl) { snprintf(err, errlen, "cc backend: dlopen %s: %s", so, dlerror()); return -1; }
  *addr = dlsym(dl, symbol);
  if (!*addr) { snprintf(err, errlen, "cc backend: symbol %s not in %s", symbol, so); dlclose(dl); return -1; }
  *unit = malloc(sizeof **unit);
  if (!*unit) { dlclose(dl); snprintf(err, errlen, "out of memory"); return -1; }
  (*unit)->dl = dl;
  return 0;
}

/* Close a cached library. */
void fd_cc_free(fd_cc_unit *u) {
  if (!u) return;
  dlclose(u->dl);
  free(u);
}
