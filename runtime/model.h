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
  double limit[FD_MODEL_NLIMITS];      /* by MODEL_LIMITS: gen/facts.lua MODEL_LIMITS' order */
} fd_model;

/* One configuration and its score (predicted log time, up to a constant of the job). */
typedef struct fd_model_pick { int chunk, tile, isa, splits, threads; double score; } fd_model_pick;

/* The model's score of configuration c for shape s (the shape it executes) at len keys. */
double fd_model_score(const fd_model *m, const fd_shape *s, int64_t len, const fd_model_pick *c);
/* The k best candidates (lowest score first, ties in enumeration order, as
   tuner/model.lua rank) for s at len keys with isas up to max_isa and up to
   threads threads, into out; the count (0 when none). */
int fd_model_rank(const fd_model *m, const fd_shape *s, int64_t len, int max_isa, int threads, fd_model_pick *out, int k);

/* The planner's decision for s at len given the heuristic's configuration h
   (tuner/model.lua decide, the same order and arithmetic): among the
   candidates with at most splits_up x h's splits (h's beyond splits_up_len
   keys), the lowest score plus its
   margin from h (the largest margin_* of the classes it moves: kernel,
   splits, threads); 1 with it in out when that is more than FD_MODEL_MARGIN
   below h's score, else 0 (keep h; also for a shape or length outside the
   measured range: len_max, G, D, kvb, rows, q within their _min.._max). */
int fd_model_decide(const fd_model *m, const fd_shape *s, int64_t len, int max_isa, int threads, const fd_model_pick *h,
                    fd_model_pick *out);

#endif
