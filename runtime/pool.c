/* Persistent thread pool. Workers spin briefly on the job generation before
   sleeping on a condition variable, so back-to-back decode steps (tens of
   microseconds apart) do not pay a wake-up each. */
#include "pool.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#define SPIN_ITERS 20000

struct fd_pool {
  int n;
  pthread_t *tids;
  pthread_mutex_t m;
  pthread_cond_t start, done;
  atomic_ulong gen;              /* bumped per job */
  atomic_int pending;            /* workers still in the job */
  int active;
  atomic_int stop;
  fd_task_fn fn;
  void *arg;
};

typedef struct { fd_pool *p; int index; } worker_arg;

/* Wait for a generation other than seen; returns it (spins, then sleeps). */
static unsigned long wait_job(fd_pool *p, unsigned long seen) {
  for (int i = 0; i < SPIN_ITERS; i++) {
    unsigned long g = atomic_load_explicit(&p->gen, memory_order_acquire);
    if (g != seen) return g;
    if (i % 64 == 63) sched_yield();
  }
  pthread_mutex_lock(&p->m);
  while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->start, &p->m);
  pthread_mutex_unlock(&p->m);
  return atomic_load(&p->gen);
}

/* A worker: run each job it takes part in, until stop. */
static void *worker(void *argp) {
  worker_arg wa = *(worker_arg *)argp;
  free(argp);
  fd_pool *p = wa.p;
  unsigned long seen = 0;
  for (;;) {
    seen = wait_job(p, seen);
    if (p->stop) return NULL;
    if (wa.index < p->active) p->fn(p->arg, wa.index);
    /* every worker acknowledges every job, so none can still be reading this
       job's fn, arg and active when the caller starts the next one */
    if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
      pthread_mutex_lock(&p->m);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->m);
    }
  }
}

/* Create a pool of n threads including the caller. */
fd_pool *fd_pool_create(int n) {
  fd_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n < 1 ? 1 : n;
  p->tids = calloc((size_t)p->n, sizeof *p->tids);
  pthread_mutex_init(&p->m, NULL);
  pthread_cond_init(&p->start, NULL);
  pthread_cond_init(&p->done, NULL);
  for (int i = 1; i < p->n; i++) {
    worker_arg *wa = malloc(sizeof *wa);
    if (!wa) { p->n = i; fd_pool_destroy(p); return NULL; }
    wa->p = p; wa->index = i;
    if (pthread_create(&p->tids[i], NULL, worker, wa) != 0) { free(wa); p->n = i; fd_pool_destroy(p); return NULL; }
  }
  return p;
}

/* Run fn on n threads (clamped to the pool size) and wait. */
void fd_pool_run(fd_pool *p, int n, fd_task_fn fn, void *arg) {
  if (n > p->n) n = p->n;
  if (n <= 1) { fn(arg, 0); return; }
  p->fn = fn; p->arg = arg; p->active = n;
  atomic_store(&p->pending, p->n - 1);
  pthread_mutex_lock(&p->m);
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->m);
  fn(arg, 0);
  for (int i = 0; i < SPIN_ITERS && atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++)
    if (i % 64 == 63) sched_yield();
  pthread_mutex_lock(&p->m);
  while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->m);
  pthread_mutex_unlock(&p->m);
}

/* Stop and join all workers, then free the pool. */
void fd_pool_destroy(fd_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->m);
  p->stop = 1;
  atomic_fetch_add(&p->gen, 1);
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->m);
  for (int i = 1; i < p->n; i++) pthread_join(p->tids[i], NULL);
  pthread_mutex_destroy(&p->m);
  pthread_cond_destroy(&p->start);
  pthread_cond_destroy(&p->done);
  free(p->tids);
  free(p);
}
