/* A persistent thread pool: n-1 workers plus the calling thread. */
#ifndef FD_POOL_H
#define FD_POOL_H

typedef struct fd_pool fd_pool;
typedef void (*fd_task_fn)(void *arg, int thread_index);

/* Start n-1 worker threads (n >= 1); NULL on failure. */
fd_pool *fd_pool_create(int n);
/* Run fn(arg, i) on threads i = 0..n-1 (0 is the caller) and wait for all.
   One caller at a time: the runtime serializes runs. */
void fd_pool_run(fd_pool *p, int n, fd_task_fn fn, void *arg);
/* Stop and join the workers. */
void fd_pool_destroy(fd_pool *p);

#endif
