/* The cost model a tuned table may carry (tuner/model.lua fits it; its
   features are gen/facts.lua MODEL_FEATURES, generated into fd_keydefs.h as
   fd_model_features): ranks the planner's candidate configurations for a
   shape and length the table has no row for. */
#ifndef FD_MODEL_H
#define FD_MODEL_H
#include "flashdecode.h"
#include "key.h"
#include <stdint.h>

typedef struct fd_model {
  int present;                         /* 0: the table has no model lines */
  double coef[FD_MODEL_NFEATURES];     /* by feature, MODEL_FEATURES' order */
  double limit[FD_MODEL_NLIMITS];      /* by MODEL_LIMITS: chunk_min, chunk_max, splits_max, threads_max, items_max */
} fd_model;

/* One configuration and its score (predicted log time, up to a constant of the job). */
typedef struct fd_model_pick { int chunk, tile, isa, splits, threads; double score; } fd_model_pick;

/* The model's score of configuration c for shape s (the shape it executes) at len keys. */
double fd_model_score(const fd_model *m, const fd_shape *s, int64_t len, const fd_model_pick *c);
/* The k best candidates (lowest score first, ties in enumeration order, as
   tuner/model.lua rank) for s at len keys with isas up to max_isa and up to
   threads threads, into out; the count (0 when none). */
int fd_model_rank(const fd_model *m, const fd_shape *s, int64_t len, int max_isa, int threads, fd_model_pick *out, int k);

#endif
