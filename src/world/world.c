/* world.c — bb_world with MPI when the build has it (BB_MPI), alone
 * otherwise; see world.h. */
#include <stdlib.h>
#include <string.h>

#include "bigbatch/world.h"

static bb_world world = {.rank = 0, .size = 1, .local_rank = 0, .local_size = 1};

#ifdef BB_MPI
#include <mpi.h>
static MPI_Comm *channels; /* bb_world_open_channels' copies of MPI_COMM_WORLD */
static int channel_count;
#endif

const bb_world *bb_world_get(void) { return &world; }

/* Processes the launcher says it started: Open MPI's mpirun, PMI/PMIx
 * (srun --mpi=pmix, MPICH's hydra); 0 when no launcher is seen (a shell
 * inside a Slurm allocation is not a launch). */
static int launched_size(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return getenv("OMPI_COMM_WORLD_RANK") || getenv("PMIX_RANK") || getenv("PMI_RANK") ? 1 : 0;
}

#ifdef BB_MPI
/* An MPI call's failure as a bb_status naming the call. */
static bb_status mpi_fail(const char *call, int rc)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return bb_fail(BB_ERR_DEVICE, "%s: %s", call, msg);
}
#define MPI_OK(call)                                                                               \
    do {                                                                                           \
        int bb_mpi_rc_ = (call);                                                                   \
        if (bb_mpi_rc_ != MPI_SUCCESS) return mpi_fail(#call, bb_mpi_rc_);                         \
    } while (0)

bb_status bb_world_init(int *argc, char ***argv)
{
    if (!launched_size() || world.mpi) return BB_OK;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return bb_fail(BB_ERR_INTERNAL, "MPI_Init_thread failed");
    world.mpi = true;
    world.thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    if (provided < MPI_THREAD_SERIALIZED) {
        bb_world_finalize();
        return bb_fail(BB_ERR_UNSUPPORTED, "the MPI library gives thread level %d; bigbatch needs "
                       "MPI_THREAD_SERIALIZED (its reducer thread and workers call MPI, never at once; ZeRO-3's "
                       "gathers over processes need MPI_THREAD_MULTIPLE)", provided);
    }
    /* Errors come back as return codes, to be reported as bb_status. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world.size);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &world.local_rank);
    MPI_Comm_size(local, &world.local_size);
    MPI_Comm_free(&local);
    return BB_OK;
}

void bb_world_finalize(void)
{
    if (!world.mpi) return;
    world.mpi = false;
    for (int i = 0; i < channel_count; i++) MPI_Comm_free(&channels[i]);
    free(channels);
    channels = NULL, channel_count = 0;
    MPI_Finalize();
}

bb_status bb_world_open_channels(int n)
{
    if (world.size < 2 || n <= channel_count) return BB_OK;
    if (!world.thread_multiple)
        return bb_fail(BB_ERR_UNSUPPORTED, "the MPI library gives no MPI_THREAD_MULTIPLE: several threads of a process "
                       "cannot each run collectives of their own");
    MPI_Comm *grown = realloc(channels, (size_t)n * sizeof *grown);
    if (!grown) return bb_fail(BB_ERR_NOMEM, "out of memory");
    channels = grown;
    for (; channel_count < n; channel_count++) {
        MPI_OK(MPI_Comm_dup(MPI_COMM_WORLD, &channels[channel_count]));
        MPI_Comm_set_errhandler(channels[channel_count], MPI_ERRORS_RETURN);
    }
    return BB_OK;
}

void bb_world_abort(int code)
{
    if (world.mpi) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

const char *bb_world_library(void)
{
    static char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (!text[0]) {
        MPI_Get_library_version(text, &len);
        text[strcspn(text, ",\n")] = 0; /* "Open MPI v4.1.4, package: ..." */
    }
    return text;
}

bb_status bb_world_sum_floats(float *x, size_t n)
{
    for (size_t done = 0; world.size > 1 && done < n;) { /* counts are ints */
        int count = n - done > (1u << 30) ? 1 << 30 : (int)(n - done);
        MPI_OK(MPI_Allreduce(MPI_IN_PLACE, x + done, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        done += (size_t)count;
    }
    return BB_OK;
}

/* Each process's part in floats (counts) and where it starts (displs, from lo[0]). */
static bb_status parts(const size_t *lo, const size_t *hi, const char *what, int **counts, int **displs)
{
    *counts = malloc((size_t)world.size * sizeof **counts), *displs = malloc((size_t)world.size * sizeof **displs);
    bb_status rc = *counts && *displs ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory");
    for (int p = 0; rc == BB_OK && p < world.size; p++) {
        if (hi[p] - lo[0] >= (size_t)INT32_MAX)
            rc = bb_fail(BB_ERR_ARG, "%s over %zu floats is more than MPI counts take", what, hi[p] - lo[0]);
        else (*counts)[p] = (int)(hi[p] - lo[p]), (*displs)[p] = (int)(lo[p] - lo[0]);
    }
    return rc;
}

static bb_status allgather_on(MPI_Comm comm, float *x, const size_t *lo, const size_t *hi)
{
    if (world.size < 2) return BB_OK;
    int *counts, *displs;
    bb_status rc = parts(lo, hi, "an all-gather", &counts, &displs);
    if (rc == BB_OK) {
        int e = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x + lo[0], counts, displs, MPI_FLOAT, comm);
        if (e != MPI_SUCCESS) rc = mpi_fail("MPI_Allgatherv", e);
    }
    free(counts), free(displs);
    return rc;
}

bb_status bb_world_allgather_floats(float *x, const size_t *lo, const size_t *hi)
{
    return allgather_on(MPI_COMM_WORLD, x, lo, hi);
}

bb_status bb_world_allgather_floats_on(int channel, float *x, const size_t *lo, const size_t *hi)
{
    if (world.size < 2) return BB_OK;
    if (channel < 0 || channel >= channel_count)
        return bb_fail(BB_ERR_INTERNAL, "MPI channel %d of %d opened", channel, channel_count);
    return allgather_on(channels[channel], x, lo, hi);
}

bb_status bb_world_reduce_scatter_floats(float *x, const size_t *lo, const size_t *hi)
{
    if (world.size < 2) return BB_OK;
    int *counts, *displs;
    bb_status rc = parts(lo, hi, "a reduce-scatter", &counts, &displs);
    if (rc == BB_OK) { /* in place, MPI leaves this process's sum at the start of the buffer */
        int e = MPI_Reduce_scatter(MPI_IN_PLACE, x + lo[0], counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (e != MPI_SUCCESS) rc = mpi_fail("MPI_Reduce_scatter", e);
        else memmove(x + lo[world.rank], x + lo[0], (size_t)counts[world.rank] * sizeof *x);
    }
    free(counts), free(displs);
    return rc;
}

bb_status bb_world_sum_doubles(double *x, size_t n)
{
    if (world.size > 1) MPI_OK(MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    return BB_OK;
}

bb_status bb_world_broadcast_doubles(double *x, size_t n, int root)
{
    if (world.size > 1) MPI_OK(MPI_Bcast(x, (int)n, MPI_DOUBLE, root, MPI_COMM_WORLD));
    return BB_OK;
}

bb_status bb_world_broadcast_bytes(void *x, size_t n, int root)
{
    if (world.size > 1) MPI_OK(MPI_Bcast(x, (int)n, MPI_BYTE, root, MPI_COMM_WORLD));
    return BB_OK;
}

bb_status bb_world_max_int(int *x)
{
    if (world.size > 1) MPI_OK(MPI_Allreduce(MPI_IN_PLACE, x, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    return BB_OK;
}

bb_status bb_world_all_equal(uint64_t value, bool *out)
{
    *out = true;
    if (world.size == 1) return BB_OK;
    uint64_t v[2] = {value, ~value}, m[2];
    MPI_OK(MPI_Allreduce(v, m, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD)); /* max of v and of ~v: min */
    *out = m[0] == value && m[1] == ~value;
    return BB_OK;
}

#else /* a build without MPI */

bb_status bb_world_init(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    int n = launched_size();
    if (n > 1)
        return bb_fail(BB_ERR_UNSUPPORTED, "launched as %d processes, but this bigbatch was built without MPI: each "
                       "would train alone; rebuild with Open MPI installed (make deps; make MPI=1)", n);
    return BB_OK;
}

void bb_world_finalize(void) {}
void bb_world_abort(int code) { exit(code); }
const char *bb_world_library(void) { return "none"; }
bb_status bb_world_sum_floats(float *x, size_t n) { return (void)x, (void)n, BB_OK; }
bb_status bb_world_sum_doubles(double *x, size_t n) { return (void)x, (void)n, BB_OK; }
bb_status bb_world_broadcast_doubles(double *x, size_t n, int root) { return (void)x, (void)n, (void)root, BB_OK; }
bb_status bb_world_broadcast_bytes(void *x, size_t n, int root) { return (void)x, (void)n, (void)root, BB_OK; }
bb_status bb_world_max_int(int *x) { return (void)x, BB_OK; }
bb_status bb_world_allgather_floats(float *x, const size_t *lo, const size_t *hi)
{
    return (void)x, (void)lo, (void)hi, BB_OK;
}
bb_status bb_world_open_channels(int n) { return (void)n, BB_OK; }
bb_status bb_world_allgather_floats_on(int channel, float *x, const size_t *lo, const size_t *hi)
{
    return (void)channel, (void)x, (void)lo, (void)hi, BB_OK;
}
bb_status bb_world_reduce_scatter_floats(float *x, const size_t *lo, const size_t *hi)
{
    return (void)x, (void)lo, (void)hi, BB_OK;
}
bb_status bb_world_all_equal(uint64_t value, bool *out) { return (void)value, *out = true, BB_OK; }

#endif
