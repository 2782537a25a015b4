/* Embedded Lua 5.4 running gen/ from the copies compiled into the library, so
   an installed library needs neither the source tree nor LUA_PATH. */
#include "luagen.h"
#include "embedded.h"
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fd_gen { lua_State *L; };

/* The embedded file called name, or NULL. */
static const fd_embedded_file *embedded(const char *name) {
  for (const fd_embedded_file *f = fd_embedded_files; f->name; f++)
    if (strcmp(f->name, name) == 0) return f;
  return NULL;
}

/* Lua: fd_read(name) -> text | nil, err (the template reader). */
static int l_read(lua_State *L) {
  const fd_embedded_file *f = embedded(luaL_checkstring(L, 1));
  if (!f) { lua_pushnil(L); lua_pushstring(L, "not embedded"); return 2; }
  lua_pushlstring(L, f->text, f->len);
  return 1;
}

/* Lua package searcher over the embedded modules: require("key") -> key.lua. */
static int l_search(lua_State *L) {
  char name[128];
  snprintf(name, sizeof name, "%s.lua", luaL_checkstring(L, 1));
  const fd_embedded_file *f = embedded(name);
  if (!f) { lua_pushfstring(L, "no embedded module %s", name); return 1; }
  if (luaL_loadbuffer(L, f->text, f->len, name) != LUA_OK) return lua_error(L);
  lua_pushstring(L, name);
  return 2;
}

static const char *BOOT =
  "table.insert(package.searchers, 2, fd_search)\n"
  "local g = require('generate').new { read = fd_read }\n"
  "return function(k) return g.source(k) end\n";

/* Start a Lua state whose registry holds the generator's source function. */
fd_gen *fd_gen_new(char *err, size_t errlen) {
  fd_gen *g = calloc(1, sizeof *g);
  if (!g || !(g->L = luaL_newstate())) { free(g); snprintf(err, errlen, "out of memory starting Lua"); return NULL; }
  luaL_openlibs(g->L);
  lua_register(g->L, "fd_read", l_read);
  lua_register(g->L, "fd_search", l_search);
  if (luaL_loadstring(g->L, BOOT) != LUA_OK || lua_pcall(g->L, 0, 1, 0) != LUA_OK) {
    snprintf(err, errlen, "generator start-up failed: %s", lua_tostring(g->L, -1));
    fd_gen_free(g);
    return NULL;
  }
  lua_setglobal(g->L, "fd_source");
  return g;
}

/* Generate the source of key; see luagen.h. */
int fd_gen_source(fd_gen *g, const char *key, char **src, char *err, size_t errlen) {
  lua_State *L = g->L;
  lua_getglobal(L, "fd_source");
  lua_pushstring(L, key);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    snprintf(err, errlen, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    return -1;
  }
  size_t n;
  const char *s = lua_tolstring(L, -1, &n);
  *src = malloc(n + 1);
  if (*src) memcpy(*src, s, n + 1);
  lua_pop(L, 1);
  if (!*src) { snprintf(err, errlen, "out of memory"); return -1; }
  return 0;
}

/* FNV-1a over every embedded file, as 16 hex digits (computed once). */
const char *fd_gen_template_hash(void) {
  static char hex[17];
  if (!hex[0]) {
    uint64_t h = 1469598103934665603ull;
    for (const fd_embedded_file *f = fd_embedded_files; f->name; f++)
      for (size_t i = 0; i < f->len; i++) h = (h ^ (unsigned char)f->text[i]) * 1099511628211ull;
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  }
  return hex;
}

/* Close the Lua state. */
void fd_gen_free(fd_gen *g) {
  if (!g) return;
  if (g->L) lua_close(g->L);
  free(g);
}
