/* cmd_bench.c — `bigbatch bench <what>`: the built-in benchmarks. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} benches[] = {
    {"queue", bb_bench_queue, "lock-free SPSC ring vs a mutex+condvar queue; idle consumer CPU"},
    {"loader", bb_bench_loader, "records/s and MB/s the loader delivers from a dataset"},
    {"model", bb_bench_model, "forward + backward + AdamW steps of mlp or gpt, on the CPU or a GPU"},
    {"copy", bb_bench_copy, "host-to-device copies from pinned and pageable memory (GPU)"},
    {"attention", bb_bench_attention, "the attention op alone, forward and backward (cuDNN or bigbatch's kernels)"},
};

static void print_usage(FILE *out)
{
    fprintf(out, "usage: bigbatch bench <what> [options]\n\n");
    for (size_t i = 0; i < sizeof benches / sizeof *benches; i++)
        fprintf(out, "  %-10s %s\n", benches[i].name, benches[i].summary);
    fprintf(out, "\n'bigbatch bench <what> --help' explains its options. perf/*.sh run them beside\n"
                 "their peers and perf/RESULTS.md records the figures.\n");
}

int bb_cmd_bench(int argc, char **argv)
{
    if (argc < 1 || !strcmp(argv[0], "-h") || !strcmp(argv[0], "--help")) {
        print_usage(argc < 1 ? stderr : stdout);
        return argc < 1 ? BB_EXIT_USAGE : BB_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof benches / sizeof *benches; i++)
        if (!strcmp(argv[0], benches[i].name)) return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "bigbatch: error: unknown benchmark '%s'\n\n", argv[0]);
    print_usage(stderr);
    return BB_EXIT_USAGE;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bb_bench_median(double *values, int n)
{
    if (n <= 0) return 0;
    qsort(values, (size_t)n, sizeof *values, compare_doubles);
    return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}
