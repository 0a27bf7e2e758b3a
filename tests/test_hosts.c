/* test_hosts.c — training across two hosts over a real network, on one
 * machine: two network namespaces (`ip netns`), each a host with its own
 * address (10.231.0.1 and .2) and hostname, joined by one link, and
 * `mpirun` across them with a hostfile, over TCP. Open MPI's launcher agent
 * is a small script that runs the remote side with `ip netns exec` where a
 * cluster would use ssh. The namespaces hold nothing but that link and
 * their loopback: no other network is reachable from them.
 *
 * The link is a veth pair (the 2-host run, the link that goes down), or
 * for delay and loss a userspace wire: two TUN devices and a process that
 * forwards each packet after a fixed delay, or drops it with a seeded
 * probability, in both directions (what `tc netem delay 20ms loss 5%` on
 * both ends does, on any kernel: this one's has no netem). Skipped, saying
 * why, where MPI is absent or namespaces are refused (not root). */
#include <linux/if.h>
#include <linux/if_tun.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/ioctl.h>

#include "bigbatch/world.h"
#include "train_fixture.h"

TestSuite(hosts, .init = fixture_setup, .fini = fixture_teardown);

static const char *const host_addr[2] = {"10.231.0.1", "10.231.0.2"};

typedef struct hosts {
    char ns[2][32];  /* the namespaces: "bb<pid>a", "bb<pid>b" */
    char *hostfile, *agent;
    pid_t wire;      /* the userspace wire's process; 0: a veth pair */
} hosts;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

/* ---- the userspace wire ---------------------------------------------------- */
enum { WIRE_QUEUE = 1000, WIRE_MTU = 1500 }; /* netem's default queue limit */

typedef struct wire_packet {
    double due;
    int len;
    uint8_t data[WIRE_MTU + 64];
} wire_packet;

typedef struct wire_queue {
    wire_packet *p;
    int head, count;
} wire_queue;

/* A TUN device named eth0 in namespace `ns` (this thread enters it). */
static int tun_in(const char *ns)
{
    char path[64];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    int nsfd = open(path, O_RDONLY);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) return -1;
    close(nsfd);
    int fd = open("/dev/net/tun", O_RDWR);
    struct ifreq ifr = {.ifr_flags = IFF_TUN | IFF_NO_PI};
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "eth0");
    if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr) != 0) return -1;
    return fd;
}

/* The wire's process: packets from each side to the other after delay_s,
 * or dropped with probability `loss`; never returns. Writes one byte to
 * `ready` once both devices exist (0 when they cannot be made). */
__attribute__((noreturn)) static void wire_main(const hosts *h, double delay_s, double loss, int ready)
{
    int fd[2] = {tun_in(h->ns[0]), tun_in(h->ns[1])};
    char ok = fd[0] >= 0 && fd[1] >= 0;
    if (write(ready, &ok, 1) != 1 || !ok) _exit(1);
    wire_queue q[2] = {{calloc(WIRE_QUEUE, sizeof(wire_packet))}, {calloc(WIRE_QUEUE, sizeof(wire_packet))}};
    uint64_t rng = 0x9e3779b97f4a7c15ull; /* seeded: the same drops every run */
    for (;;) {
        double now = now_s(), next = 1.0;
        for (int s = 0; s < 2; s++) { /* q[s]: from side s, due out on the other */
            while (q[s].count && q[s].p[q[s].head].due <= now) {
                wire_packet *p = &q[s].p[q[s].head];
                ssize_t w = write(fd[!s], p->data, (size_t)p->len);
                (void)w; /* a device that refuses a packet loses it, as a link would */
                q[s].head = (q[s].head + 1) % WIRE_QUEUE, q[s].count--;
            }
            if (q[s].count && q[s].p[q[s].head].due - now < next) next = q[s].p[q[s].head].due - now;
        }
        struct pollfd pf[2] = {{fd[0], POLLIN, 0}, {fd[1], POLLIN, 0}};
        if (poll(pf, 2, (int)(next * 1000) + 1) < 0 && errno != EINTR) _exit(1);
        for (int s = 0; s < 2; s++) {
            if (!(pf[s].revents & POLLIN)) continue;
            wire_packet in;
            in.len = (int)read(fd[s], in.data, sizeof in.data);
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            if (in.len <= 0 || (double)(rng >> 11) / 9007199254740992.0 < loss || q[s].count == WIRE_QUEUE) continue;
            in.due = now_s() + delay_s;
            q[s].p[(q[s].head + q[s].count++) % WIRE_QUEUE] = in;
        }
    }
}

/* ---- the two hosts ----------------------------------------------------------- */
static void need_hosts(void)
{
    if (!strcmp(bb_world_library(), "none")) fixture_skip("skipped: this build has no MPI (make deps; make MPI=1)");
    if (access("/usr/bin/mpirun", X_OK) != 0) fixture_skip("skipped: no mpirun on this machine");
    if (geteuid() != 0) fixture_skip("skipped: network namespaces need root (CI runs as root)");
    if (sh("command -v ip >/dev/null && command -v unshare >/dev/null") != 0)
        fixture_skip("skipped: no ip (iproute2) or unshare (util-linux) on this machine");
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1); /* the harness says so, not the program */
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
}

static void hosts_down(hosts *h)
{
    if (h->wire) kill(h->wire, SIGKILL), waitpid(h->wire, NULL, 0);
    for (int i = 0; i < 2; i++) sh("ip netns del %s 2>/dev/null", h->ns[i]);
    free(h->hostfile), free(h->agent);
}

/* Two hosts joined by a veth pair, or (wire) by the userspace wire with
 * this delay each way and loss; skips the test when namespaces are refused. */
static void hosts_up(hosts *h, bool wire, double delay_s, double loss)
{
    memset(h, 0, sizeof *h);
    for (int i = 0; i < 2; i++) snprintf(h->ns[i], sizeof h->ns[i], "bb%d%c", (int)getpid(), 'a' + i);
    if (sh("ip netns add %s 2>/dev/null && ip netns add %s", h->ns[0], h->ns[1]) != 0) {
        hosts_down(h);
        fixture_skip("skipped: `ip netns add` is refused here (a container without CAP_SYS_ADMIN?)");
    }
    if (wire) {
        int ready[2];
        cr_assert_eq(pipe(ready), 0);
        h->wire = fork();
        cr_assert_geq(h->wire, 0);
        if (h->wire == 0) wire_main(h, delay_s, loss, ready[1]);
        char ok = 0;
        cr_assert(read(ready[0], &ok, 1) == 1 && ok, "the wire's TUN devices could not be made");
        close(ready[0]), close(ready[1]);
    } else {
        cr_assert_eq(sh("ip link add name eth0 netns %s type veth peer name eth0 netns %s", h->ns[0], h->ns[1]), 0);
    }
    for (int i = 0; i < 2; i++)
        cr_assert_eq(sh("ip -n %s link set lo up && ip -n %s addr add %s/24 dev eth0 && ip -n %s link set eth0 up",
                        h->ns[i], h->ns[i], host_addr[i], h->ns[i]), 0);
    h->hostfile = tu_path(tmp, "hostfile");
    h->agent = tu_path(tmp, "agent.sh");
    FILE *f = fopen(h->hostfile, "w");
    fprintf(f, "%s slots=2\n%s slots=2\n", host_addr[0], host_addr[1]);
    fclose(f);
    /* mpirun's agent: "AGENT [options] HOST orted ARGS", ssh's place */
    f = fopen(h->agent, "w");
    fprintf(f, "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in -*) shift;; *) break;; esac; done\n"
               "case \"$1\" in %s) ns=%s;; %s) ns=%s;; *) echo \"agent: no host $1\" >&2; exit 1;; esac\n"
               "shift\nexec ip netns exec $ns unshare --uts sh -c \"hostname $ns && $*\"\n",
            host_addr[0], h->ns[0], host_addr[1], h->ns[1]);
    fclose(f);
    chmod(h->agent, 0755);
}

/* The command line of `mpirun -np P` from host a, P/2 processes per host,
 * running `bigbatch train ARGS` (each process writes its pid to
 * DIR/pid.RANK). */
static void job_command(const hosts *h, int P, const char *args, char *cmd, size_t cap)
{
    snprintf(cmd, cap,
             "ip netns exec %s unshare --uts sh -c 'hostname %s && exec /usr/bin/mpirun --hostfile %s -np %d "
             "--map-by ppr:%d:node --mca plm_rsh_agent %s --mca oob_tcp_if_include 10.231.0.0/24 "
             "--mca btl_tcp_if_include 10.231.0.0/24 sh -c \"echo \\$\\$ > %s/pid.\\$OMPI_COMM_WORLD_RANK; exec %s "
             "train %s\"'",
             h->ns[0], h->ns[0], h->hostfile, P, P / 2, h->agent, tmp, tu_bigbatch_bin(), args);
}

static tu_run job(const hosts *h, int P, const char *args)
{
    char cmd[16384];
    job_command(h, P, args, cmd, sizeof cmd);
    return tu_run_argv((char *const[]){"/bin/sh", "-c", cmd, NULL});
}

/* Bytes host a's eth0 sent and received. */
static double link_bytes(const hosts *h)
{
    char cmd[256], path[64];
    double total = 0;
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s_bytes", i ? "rx" : "tx");
        snprintf(cmd, sizeof cmd, "ip netns exec %s cat /sys/class/net/eth0/statistics/%s", h->ns[0], path);
        FILE *p = popen(cmd, "r");
        double v = 0;
        if (p && fscanf(p, "%lf", &v) == 1) total += v;
        if (p) pclose(p);
    }
    return total;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorted in place), and its mean into *mean. */
static double median_of(double *v, int n, double *mean)
{
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    qsort(v, (size_t)n, sizeof *v, by_value);
    *mean = sum / n;
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define GPT "--model gpt --layers 2 --heads 2 --d-model 32 --global-batch 16 --micro-batch 2 --lr 3e-3 --log-every 0"

/* 2 hosts x 2 processes over the veth: the losses of one process on cpu:4
 * within 1e-5, the same parameters on every rank, and the gradients did
 * cross the link. */
Test(hosts, two_hosts_by_two_processes_train_as_one_process_on_cpu_4)
{
    need_hosts();
    hosts h;
    hosts_up(&h, false, 0, 0);
    char *data = make_tokens("tokens", 400), *m1 = tu_path(tmp, "one.jsonl"), *m4 = tu_path(tmp, "hosts.jsonl");
    char args[8192];
    tu_run r = tu_bigbatch("train", "--data", data, "--model", "gpt", "--layers", "2", "--heads", "2", "--d-model",
                           "32", "--global-batch", "16", "--micro-batch", "2", "--lr", "3e-3", "--log-every", "0",
                           "--steps", "6", "--devices", "cpu:4", "--metrics", m1);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    double before = link_bytes(&h);
    snprintf(args, sizeof args, "--data %s " GPT " --steps 6 --devices cpu:1 --metrics %s", data, m4);
    r = job(&h, 4, args);
    double crossed = link_bytes(&h) - before;
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "the 4 processes' parameters are identical"), "%s", r.err);
    expect_metrics_losses(m1, m4, 1, "2 hosts x 2 processes");
    cr_assert_gt(crossed, 100e3, "only %.0f bytes crossed the link between the hosts", crossed);
    double one, two;
    metric_values(m1, "loss", 6, &one, 1), metric_values(m4, "loss", 6, &two, 1);
    cr_log_info("2 hosts x 2 processes (cpu:1 each) over a veth: the losses of 1 process on cpu:4 within 1e-5 "
                "(step 6: %.7f and %.7f), parameters identical on all 4 ranks, %.2f MB crossed the link",
                two, one, crossed / 1e6);
    tu_run_free(&r);
    hosts_down(&h);
    free(data), free(m1), free(m4);
}

/* The same job over the userspace wire, as is, with 20 ms each way, and
 * with 5% of packets lost each way: the losses stay those of the clean
 * link (within 1e-5); the step time and the reducer's overlap are logged
 * against it (perf/network_bench.sh takes the medians of 5 runs). */
Test(hosts, delay_and_loss_on_the_link_change_the_time_not_the_losses)
{
    need_hosts();
    static const struct { double delay_s, loss; const char *what; } links[] = {
        {0, 0, "no delay"}, {0.020, 0, "20 ms each way"}, {0, 0.05, "5% loss each way"}};
    char *data = make_tokens("tokens", 400), *metrics[3];
    double med[3], mean[3], ov[3], ov_mean;
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "m%d.jsonl", i);
        metrics[i] = tu_path(tmp, name);
        hosts h;
        hosts_up(&h, true, links[i].delay_s, links[i].loss);
        char args[8192];
        snprintf(args, sizeof args, "--data %s --model gpt --layers 2 --heads 2 --d-model 64 --global-batch 16 "
                 "--micro-batch 2 --lr 3e-3 --log-every 0 --bucket-mib 0.05 --steps 12 --devices cpu:2 --metrics %s",
                 data, metrics[i]);
        tu_run r = job(&h, 2, args);
        cr_assert_eq(r.exit_code, 0, "%s: %s", links[i].what, r.err);
        tu_run_free(&r);
        hosts_down(&h);
        if (i) expect_metrics_losses(metrics[0], metrics[i], 1, links[i].what);
        double rate[64], overlap[64]; /* step 1 warms up */
        int n = metric_values(metrics[i], "samples_per_s", 2, rate, 64);
        cr_assert_eq(metric_values(metrics[i], "overlap_pct", 2, overlap, 64), n);
        for (int k = 0; k < n; k++) rate[k] = 1e3 * 16 / rate[k]; /* ms a step of 16 samples */
        med[i] = median_of(rate, n, &mean[i]);
        ov[i] = median_of(overlap, n, &ov_mean);
        cr_log_info("2 hosts x 1 process (cpu:2), %s: step %.1f ms median, %.1f ms mean (x%.2f the clean link's), "
                    "overlap %.0f%%", links[i].what, med[i], mean[i], mean[i] / mean[0], ov[i]);
    }
    /* Every step crosses the link (the buckets, the loss, the stop): 20 ms each way puts at least one 40 ms
     * round trip in each, whatever the machine's load. How much loss costs is a matter of timing (TCP's
     * retransmissions): perf/network_bench.sh measures it, this test only that it trains the same. */
    cr_assert_geq(med[1], 40, "20 ms each way must add a round trip to every step: %.1f ms a step", med[1]);
    for (int i = 0; i < 3; i++) free(metrics[i]);
    free(data);
}

/* True while any process of the job (its pid files) is alive. */
static bool job_alive(int P)
{
    for (int rank = 0; rank < P; rank++) {
        char name[32], *path;
        snprintf(name, sizeof name, "pid.%d", rank);
        path = tu_path(tmp, name);
        char *text = tu_exists(path) ? (char *)tu_read_file(path, NULL) : NULL;
        pid_t pid = text ? (pid_t)atoi(text) : 0;
        free(text), free(path);
        if (pid > 0 && kill(pid, 0) == 0) {
            char stat[64], state = 0;
            snprintf(stat, sizeof stat, "/proc/%d/stat", (int)pid);
            FILE *f = fopen(stat, "r");
            if (f && fscanf(f, "%*d %*s %c", &state) == 1 && state != 'Z') {
                fclose(f);
                return true;
            }
            if (f) fclose(f);
        }
    }
    return false;
}

/* The link goes down in the middle of training, for longer than --timeout:
 * every process of the job ends within the timeout + 10 s, naming its rank
 * and the collective it waits in; when the link is back, mpirun ends too,
 * non-zero; and the last checkpoint loads and resumes. */
Test(hosts, a_link_down_longer_than_the_timeout_ends_the_job_and_the_checkpoint_loads)
{
    need_hosts();
    hosts h;
    hosts_up(&h, false, 0, 0);
    const double timeout = 5;
    char *data = make_tokens("tokens", 400), *ckpt = tu_path(tmp, "ckpt"), *latest = tu_path(ckpt, "latest");
    char *out = tu_path(tmp, "out"), *err = tu_path(tmp, "err"), args[8192], cmd[16384];
    snprintf(args, sizeof args, "--data %s " GPT " --steps 100000 --devices cpu:1 --timeout %g --save %s "
             "--save-every 20 --quiet", data, timeout, ckpt);
    job_command(&h, 2, args, cmd, sizeof cmd);
    pid_t pid = start_logged((char *const[]){"/bin/sh", "-c", cmd, NULL}, out, err);
    for (double t0 = now_s(); !tu_exists(latest) && now_s() - t0 < 60;) usleep(20000);
    cr_assert(tu_exists(latest), "no checkpoint within 60 s");
    usleep(300000); /* mid-step */
    cr_assert_eq(sh("ip -n %s link set eth0 down", h.ns[0]), 0);
    double t0 = now_s(), ended = -1;
    while (now_s() - t0 < timeout + 30 && (ended = job_alive(2) ? -1 : now_s() - t0) < 0) usleep(50000);
    /* the link comes back (after at least timeout + 3 s down): the launcher can tidy up */
    while (now_s() - t0 < timeout + 3) usleep(50000);
    cr_assert_eq(sh("ip -n %s link set eth0 up", h.ns[0]), 0);
    double up = now_s() - t0;
    int code = exit_within(pid, 120);
    double launcher = now_s() - t0;
    char *e = (char *)tu_read_file(err, NULL);
    cr_log_info("link down %.1f s (--timeout %g): every process ended %.1f s after it went down; mpirun exited %d, "
                "%.1f s after (%.1f s after the link was back)", up, timeout, ended, code, launcher, launcher - up);
    cr_assert(ended >= timeout - 0.5 && ended <= timeout + 10, "the processes ended %.1f s after the link went down, "
              "not within --timeout %g + 10 s: %s", ended, timeout, e);
    cr_assert(code > 0, "the job should end non-zero (exit %d): %s", code, e);
    for (int rank = 0; rank < 2; rank++) {
        char line[64];
        snprintf(line, sizeof line, "bigbatch: rank %d: error: no progress for", rank);
        const char *at = strstr(e, line);
        cr_assert_not_null(at, "rank %d's line: %s", rank, e);
        cr_assert_null(strstr(at + 1, line), "one line per rank: %s", e);
    }
    cr_assert(strstr(e, "all-reduce") || strstr(e, "broadcast"), "the collective waited in: %s", e);
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
    char stop[32];
    snprintf(stop, sizeof stop, "%llu", (unsigned long long)info.step + 2);
    tu_run r = tu_bigbatch("train", "--resume", ckpt, "--stop-after", stop, "--devices", "cpu:2", "--quiet");
    cr_assert_eq(r.exit_code, 0, "the checkpoint of step %llu does not resume: %s", (unsigned long long)info.step,
                 r.err);
    tu_run_free(&r);
    hosts_down(&h);
    free(e), free(out), free(err), free(latest), free(ckpt), free(data);
}
