/* Debian ships libtcc only as a non-PIC static archive. Linked into a shared
   object, its PC-relative references to glibc's stdout, stderr and environ
   cannot be resolved, so this file (compiled only into libflashdecode.so)
   gives them hidden local definitions, copied from glibc's at load time. The
   archive's own symbols are made local with --exclude-libs. */
#include <dlfcn.h>

#define HIDDEN __attribute__((visibility("hidden")))
HIDDEN void *stdout;
HIDDEN void *stderr;
HIDDEN char **environ;

/* Copy glibc's values into the local definitions before anything runs. */
__attribute__((constructor)) static void fd_tcc_shim_init(void) {
  void **out = dlsym(RTLD_DEFAULT, "stdout"), **err = dlsym(RTLD_DEFAULT, "stderr");
  char ***env = dlsym(RTLD_DEFAULT, "environ");
  if (out) stdout = *out;
  if (err) stderr = *err;
  if (env) environ = *env;
}
