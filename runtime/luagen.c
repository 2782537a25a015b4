/* Embedded Lua 5.4 running gen/ from the copies compiled into the library, so
   an installed library needs neither the source tree nor LUA_PATH. */
#include "luagen.h"
#include "embedded.h"
#include "hash.h"
#include "key.h"
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

/* A Lua state whose require() and template reader see the embedded files. */
static lua_State *embedded_state(void) {
  lua_State *L = luaL_newstate();
  if (!L) return NULL;
  luaL_openlibs(L);
  lua_register(L, "fd_read", l_read);
  lua_register(L, "fd_search", l_search);
  if (luaL_dostring(L, "table.insert(package.searchers, 2, fd_search)") != LUA_OK) { lua_close(L); return NULL; }
  return L;
}

/* Two generators over one set of modules: with #line directives back to the
   templates and each instruction's text beside its bytes (for people and error
   messages), and without either (for the JIT: tcc reads a third less text). */
static const char *BOOT =
  "local generate = require('generate')\n"
  "local g = { [true] = generate.new { read = fd_read },\n"
  "            [false] = generate.new { read = fd_read, line_directives = false, annotate = false } }\n"
  "return function(k, lines) return g[lines].source(k) end\n";

/* Start a Lua state whose registry holds the generator's source function. */
fd_gen *fd_gen_new(char *err, size_t errlen) {
  fd_gen *g = calloc(1, sizeof *g);
  if (!g || !(g->L = embedded_state())) { free(g); snprintf(err, errlen, "out of memory starting Lua"); return NULL; }
  if (luaL_loadstring(g->L, BOOT) != LUA_OK || lua_pcall(g->L, 0, 1, 0) != LUA_OK) {
    snprintf(err, errlen, "generator start-up failed: %s", lua_tostring(g->L, -1));
    fd_gen_free(g);
    return NULL;
  }
  lua_setglobal(g->L, "fd_source");
  return g;
}

/* Generate the source of key, with or without #line directives; see luagen.h. */
int fd_gen_source_lines(fd_gen *g, const char *key, int lines, char **src, char *err, size_t errlen) {
  lua_State *L = g->L;
  lua_getglobal(L, "fd_source");
  lua_pushstring(L, key);
  lua_pushboolean(L, lines);
  if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
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

/* Generate the source of key with #line directives; see luagen.h. */
int fd_gen_source(fd_gen *g, const char *key, char **src, char *err, size_t errlen) {
  return fd_gen_source_lines(g, key, 1, src, err, errlen);
}

/* FNV-1a over every embedded file, as 16 hex digits (computed once). */
const char *fd_gen_template_hash(void) {
  static char hex[17];
  if (!hex[0]) {
    uint64_t h = FD_FNV_START;
    for (const fd_embedded_file *f = fd_embedded_files; f->name; f++) h = fd_fnv1a(h, f->text, f->len);
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

/* Set fd_shape field f of s from the table on top of the stack (0 when absent). */
static void shape_field(lua_State *L, const fd_shape_field *f, fd_shape *s) {
  char *at = (char *)s + f->offset;
  lua_getfield(L, -1, f->name);
  double x = lua_tonumber(L, -1);
  lua_pop(L, 1);
  if (f->kind == FD_SF_I64) *(int64_t *)at = (int64_t)x;
  else if (f->kind == FD_SF_FLOAT) *(float *)at = (float)x;
  else if (f->kind == FD_SF_UNSIGNED) *(unsigned *)at = (unsigned)x;
  else *(int *)at = (int)x;
}

/* Copy the numeric shape on top of the stack into e: every fd_shape field
   (fd_shape_fields, from gen/facts.lua), lse and the kv_len list. */
static void read_shape(lua_State *L, fd_gen_shape *e) {
  memset(e, 0, sizeof *e);
  lua_getfield(L, -1, "name");
  snprintf(e->name, sizeof e->name, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "?");
  lua_pop(L, 1);
  fd_shape *s = &e->shape;
  for (int i = 0; i < FD_SHAPE_FIELDS; i++) shape_field(L, &fd_shape_fields[i], s);
  lua_getfield(L, -1, "lse");
  e->lse = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, -1, "kv_len");
  int n = (int)luaL_len(L, -1);
  for (int i = 1; i <= n && i <= 32; i++) {
    lua_geti(L, -1, i);
    e->kv_lens[e->n_lens++] = (int64_t)lua_tonumber(L, -1);
    if (e->kv_lens[e->n_lens - 1] > s->kv_len) s->kv_len = e->kv_lens[e->n_lens - 1];
    lua_pop(L, 1);
  }
  lua_pop(L, 2);   /* kv_len and the shape */
}

static const char *SHAPES =
  "local src, name = ...\n"
  "local space = require('space')\n"
  "local list = src:find('=', 1, true) and { space.parse_spec(src) } or space.load_shapes(src)\n"
  "local out = {}\n"
  "for _, s in ipairs(list) do if not name or s.name == name then out[#out + 1] = space.numeric(s) end end\n"
  "if #out == 0 then error((name and ('no shape called ' .. name .. ' in ') or 'no shapes in ') .. src, 0) end\n"
  "return out\n";

/* Load shapes from a file or inline spec; see luagen.h. */
int fd_gen_shapes(const char *src, const char *name, fd_gen_shape **out, int *n, char *err, size_t errlen) {
  lua_State *L = embedded_state();
  if (!L) { snprintf(err, errlen, "out of memory starting Lua"); return -1; }
  lua_pushstring(L, src);
  name ? (void)lua_pushstring(L, name) : lua_pushnil(L);
  int rc = luaL_loadstring(L, SHAPES);
  if (rc == LUA_OK) { lua_insert(L, -3); rc = lua_pcall(L, 2, 1, 0); }
  if (rc != LUA_OK) { snprintf(err, errlen, "%s", lua_tostring(L, -1)); lua_close(L); return -1; }
  *n = (int)luaL_len(L, -1);
  *out = calloc((size_t)*n, sizeof **out);
  for (int i = 0; *out && i < *n; i++) {
    lua_geti(L, -1, i + 1);
    read_shape(L, &(*out)[i]);
  }
  lua_close(L);
  if (!*out) { snprintf(err, errlen, "out of memory"); return -1; }
  return 0;
}

/* Run the embedded gen/fdgen.lua as a command line. */
int fd_gen_cli(int argc, char **argv) {
  lua_State *L = embedded_state();
  const fd_embedded_file *f = embedded("fdgen.lua");
  if (!L || !f) { fprintf(stderr, "fdgen: cannot start the embedded generator\n"); return 1; }
  lua_createtable(L, argc, 1);
  for (int i = 0; i < argc; i++) { lua_pushstring(L, argv[i]); lua_rawseti(L, -2, i); }
  lua_setglobal(L, "arg");
  int rc = luaL_loadbuffer(L, f->text, f->len, "=fdgen.lua");
  if (rc == LUA_OK) rc = lua_pcall(L, 0, 0, 0);
  if (rc != LUA_OK) fprintf(stderr, "fdgen: %s\n", lua_tostring(L, -1));
  lua_close(L);
  return rc == LUA_OK ? 0 : 1;
}
