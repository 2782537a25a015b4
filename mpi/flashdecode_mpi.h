/* libflashdecode_mpi: context-parallel decode attention over MPI ranks.

   Every rank holds a contiguous shard of every batch row's keys (its own K/V
   cache, of capacity shape.kv_len) and the same queries. fdmpi_run attends
   the local shard with fd_run, giving one partial state (out [B, Hq, D] f32,
   lse [B, Hq]) per rank, and combines the states across the communicator with
   the exact softmax merge: out = sum_r exp(lse_r - lse) out_r, lse = log sum_r
   exp(lse_r). The result is attention over the union of the shards.

   Combine strategies (fdmpi_shard.combine):
   - FDMPI_COMBINE_REDUCE: MPI_Reduce / MPI_Allreduce of (lse, out[D]) records
     with a user-defined MPI_Op (the pairwise merge, computed symmetrically in
     double: exactly commutative, associative up to f32 rounding of each
     intermediate state). Each rank sends one state per tree level: O(state x
     log2 np), and holds one state whatever np.
   - FDMPI_COMBINE_GATHER: MPI_Gather / MPI_Allgather of the states, then
     fd_merge_states over them in rank order (one rounding; the receiver holds
     P states). Bit-identical to fd_merge_states of the same P local results.
   FDMPI_COMBINE_DEFAULT picks GATHER while a receiving rank gets at most
   FDMPI_GATHER_MAX_BYTES of the other ranks' states ((np - 1) x state), REDUCE
   above: GATHER measured as fast or faster at np 2 and 4 on one node
   (results/mpi/), REDUCE's log2(np) states per rank against GATHER's np - 1
   win on a network as np grows (mpi/README.md).

   Validation is collective: every rank returns the same code and the same
   fdmpi_errmsg() text, and writes nothing to args.out / args.lse on failure,
   for bad local input on any rank (the message names the rank and the
   field), shapes, scale, queries, root or combine that differ across ranks,
   and shards that overlap, leave a gap, or (causal) do not reach cur_pos.
   comm == MPI_COMM_NULL (or MPI not initialized, or an inter-communicator)
   is refused locally with FD_EINVAL and no collective call. An MPI call that
   fails gives FDMPI_EMPI (with the communicator's error handler set to
   MPI_ERRORS_RETURN; the default handler aborts the job). Each call makes two
   small validation collectives (an Allgather of 40 bytes per rank, then one
   of 24 bytes per row per rank) before the combine, unless shard.trusted.

   Model features: FD_ALIBI (args.cur_pos is global and a shard's keys sit
   key_offset further, so each rank's lse is shifted from its local positions
   to the global ones before the combine; out is unchanged), FD_SINK_LOGITS
   (each rank attends with -inf sinks, the combine adds args.sink_logits once:
   one more state in GATHER, rank 0's records in REDUCE) and the softcap are
   served; args.alibi_slopes and args.sink_logits must agree across ranks
   (validated). Sliding windows and sink tokens (shape.window, sink_tokens)
   count from the global cur_pos: each rank attends the keys of its shard
   that the window and the first sink_tokens keys of the sequence leave
   visible, running fd_run on views of its shard (from local slot 0, and from
   the first key of a window that starts inside the shard where fd_run's own
   window would not end it: one more pass per distinct such start, merged
   with fd_merge_states; mpi/README.md). With FD_PAGED a window is refused
   with FD_EUNSUPPORTED naming shard.shape.layout (a view cannot start
   inside a page).

   Threads: the MPI rules apply (concurrent calls need MPI_THREAD_MULTIPLE
   and distinct communicators); fdmpi_errmsg is per calling thread.
   q_len > 1 (several query tokens per row) is not supported yet. */
#ifndef FLASHDECODE_MPI_H
#define FLASHDECODE_MPI_H
#include <mpi.h>
#include <stdint.h>
#include "flashdecode.h"

#ifdef __cplusplus
extern "C" {
#endif
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define FDMPI_ALL (-1)       /* root argument: the result on every rank */
enum {
  FDMPI_EMPI = -20,          /* an MPI call failed; fdmpi_errmsg has MPI's error string */
  FDMPI_EREMOTE = -21        /* shard.trusted: another rank failed; its message is on that rank */
};

typedef enum fdmpi_combine {
  FDMPI_COMBINE_DEFAULT = 0, /* GATHER up to FDMPI_GATHER_MAX_BYTES received, else REDUCE */
  FDMPI_COMBINE_REDUCE = 1,  /* MPI_Reduce / MPI_Allreduce with the merge as a user MPI_Op */
  FDMPI_COMBINE_GATHER = 2   /* MPI_Gather / MPI_Allgather, then fd_merge_states in rank order */
} fdmpi_combine;
#define FDMPI_GATHER_MAX_BYTES (128 * 1024)

/* Per-rank timings of one fdmpi_run (seconds), for benchmarks. */
typedef struct fdmpi_stats {
  double attn_s;             /* local fd_run */
  double check_s;            /* the validation collectives (includes waiting for the slowest rank) */
  double merge_s;            /* the combine: collective and merge */
  int64_t state_bytes;       /* one rank's state: B x Hq x (D + 1) floats */
  int combine;               /* the strategy used (FDMPI_COMBINE_REDUCE or _GATHER) */
} fdmpi_stats;

/* What this rank holds. Row b's keys on this rank are the global keys
   key_offset[b] .. key_offset[b] + n_keys[b] - 1, in local slots 0 .. n_keys[b] - 1
   of args.k / args.v (and k_scale, v_scale, mask) of capacity shape->kv_len.
   Over all ranks the non-empty shards of a row must tile 0 .. total - 1 with
   no overlap and no gap (ranks need not be in key order).
   - FD_CAUSAL: args.cur_pos[b] is the GLOBAL position of row b's query, the
     same on every rank; the shards must hold keys 0 .. cur_pos[b] (keys past
     it may be held and are not attended). A rank attends its keys up to
     cur_pos[b]; a shard entirely past it contributes an empty state.
   - FD_FULL, FD_MASK: fd_run attends every local slot, so n_keys[b] must be
     0 or shape->kv_len; args.mask is this rank's [B, Hq, kv_len] slice.
   A row with no attended key on this rank (n_keys[b] == 0, or causal and
   past cur_pos or outside the window and the sinks) contributes out 0, lse
   -inf; its slot 0 is still read by fd_run and its result dropped (with
   fd_config.check_inputs it must be finite; so must slot s of every row when
   a window pass runs from local slot s, see above). */
typedef struct fdmpi_shard {
  const fd_shape *shape;     /* the shape this rank's plan was created with (fd_plan is opaque);
                                out_dtype must be FD_F32: states are merged in f32 */
  const fd_ctx *ctx;         /* the plan's context, to quote fd_run's message; NULL: the code only */
  const int64_t *key_offset; /* [B] global position of local slot 0, >= 0 */
  const int64_t *n_keys;     /* [B] keys held, 0 .. shape->kv_len */
  fdmpi_combine combine;     /* the same on every rank; 0 = default */
  fdmpi_stats *stats;        /* NULL, or filled with this rank's timings */
  int trusted;               /* 0: validate collectively (above). 1: skip the two validation collectives; the
                                caller promises what they check (same shape, scale, q, root and combine on
                                every rank; shards that tile). Local checks still run: a rank that fails one
                                joins the combine with a failure flag, returns its own code and message, and
                                the receiving ranks return FDMPI_EREMOTE, writing nothing. A rank that cannot
                                size or name the collective (NULL plan, args, shard or arrays, a bad shape,
                                root or combine) returns at once, and the other ranks then wait in the
                                combine, as with any MPI collective some ranks do not call. */
} fdmpi_shard;

/* Attend the local shard and combine across comm. args is this rank's fd_args
   (q replicated on every rank, k/v/scales/mask local, cur_pos global; args.scale
   the same everywhere). The result, out [B, Hq, D] f32 and lse [B, Hq] when
   args.lse is not NULL, is written on root only (other ranks' args.out may be
   NULL and is not touched) or, with root == FDMPI_ALL, on every rank,
   bit-identical on every rank (GATHER: each rank merges the same states in the
   same order; REDUCE: the pairwise merge is exactly commutative, and
   tests/test_mpi.c checks it with Open MPI's allreduce). Returns 0 or a negative FD_E* / FDMPI_EMPI
   code, the same on every rank. Collective: every rank of comm must call it. */
int fdmpi_run(const fd_plan *plan, const fd_args *args, const fdmpi_shard *shard, MPI_Comm comm, int root);

/* Why the calling thread's last fdmpi_run failed ("" when it did not). */
const char *fdmpi_errmsg(void);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif
#endif
