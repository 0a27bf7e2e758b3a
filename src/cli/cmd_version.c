/* cmd_version.c — `bigbatch version`: version and what this build can use. */
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "bigbatch/backend.h"
#include "bigbatch/world.h"
#include "commands.h"

int bb_cmd_version(int argc, char **argv)
{
    const bb_opt opts[] = {{0}};
    bb_status rc = argc ? bb_cli_parse("version", opts, argc, argv, NULL) : BB_OK;
    if (rc != BB_OK) return bb_cli_report(rc, "bigbatch version", "Prints the version and build.", opts);
    printf("bigbatch %s (zstd %s, %d CPUs)\n", BB_VERSION, ZSTD_versionString(), bb_cpu_count());
    const char *forced = getenv("OPENBLAS_CORETYPE");
    printf("cpu: OpenBLAS %s kernels%s%s%s", bb_cpu_blas_core(), forced ? " (OPENBLAS_CORETYPE=" : "",
           forced ? forced : "", forced ? ")" : "");
    bb_backend_t *cpu;
    if (bb_backend_create_cpu(&(bb_backend_options){.threads = 1}, &cpu) == BB_OK) {
        printf("; bf16 products: %s", bb_backend_bf16_products(cpu));
        bb_backend_destroy(cpu);
    }
    printf("\n");
    bb_cuda_info info;
    bb_cuda_probe(&info);
    if (!info.compiled) {
        printf("cuda: %s\n", info.reason);
    } else if (info.device_count == 0) {
        printf("cuda: runtime %d.%d, no usable device: %s\n", info.runtime_version / 1000,
               info.runtime_version % 1000 / 10, info.reason);
    } else {
        char mem[32];
        printf("cuda: runtime %d.%d, driver %d.%d, %d device%s; device 0: %s (sm_%d%d, %s)\n",
               info.runtime_version / 1000, info.runtime_version % 1000 / 10, info.driver_version / 1000,
               info.driver_version % 1000 / 10, info.device_count, info.device_count == 1 ? "" : "s",
               info.device_name, info.compute_major, info.compute_minor,
               bb_format_bytes(info.device_memory, mem, sizeof mem));
    }
    const bb_world *w = bb_world_get();
    if (!strcmp(bb_world_library(), "none"))
        printf("mpi: not built in (make deps, then make MPI=1): one process only\n");
    else if (w->size > 1)
        printf("mpi: %s; rank %d of %d (%d on this machine)\n", bb_world_library(), w->rank, w->size, w->local_size);
    else
        printf("mpi: %s; launch several processes with mpirun or srun\n", bb_world_library());
    return BB_EXIT_OK;
}
