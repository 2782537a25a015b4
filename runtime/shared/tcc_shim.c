/* libflashdecode.so links two non-PIC static archives: Debian's libtcc.a
   (there is no shared libtcc) and liblua5.4.a (linked statically so that a
   host embedding another Lua, such as LuaJIT running the tuner, cannot capture
   the library's lua_* calls). Their PC-relative references to glibc's stdin,
   stdout, stderr and environ cannot be resolved in a shared object, so this
   file (compiled only into the .so) gives them hidden local definitions,
   copied from glibc's at load time. The archives' own symbols are made local
   with --exclude-libs. */
#include <dlfcn.h>

#define HIDDEN __attribute__((visibility("hidden")))
HIDDEN void *stdin;
HIDDEN void *stdout;
HIDDEN void *stderr;
HIDDEN char **environ;

/* Copy glibc's values into the local definitions before anything runs. */
__attribute__((constructor)) static void fd_tcc_shim_init(void) {
  void **in = dlsym(RTLD_DEFAULT, "stdin");
  void **out = dlsym(RTLD_DEFAULT, "stdout"), **err = dlsym(RTLD_DEFAULT, "stderr");
  char ***env = dlsym(RTLD_DEFAULT, "environ");
  if (in) stdin = *in;
  if (out) stdout = *out;
  if (err) stderr = *err;
  if (env) environ = *env;
}
