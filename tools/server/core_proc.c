/* osprey serve --engine-process: the EngineCore in a child process (issue 23; vLLM V1's
 * EngineCoreProc), and the frontend's supervisor of it.
 *
 * The frontend makes a private directory (mkdtemp, mode 0700) for the ipc:// endpoint, starts the
 * core client (src/engine/core_client.h) and a supervisor thread. The supervisor runs this binary as
 * `osprey __engine-core ENDPOINT EPOCH <serve's own flags>` (fork + exec: the child parses the same
 * flags, so its engine is built exactly as the in-process one would be), with signals unblocked,
 * inherited descriptors closed and PR_SET_PDEATHSIG so a frontend that dies takes its core along. It
 * waits for the child; when it dies (crash, kill -9, OOM killer) the supervisor counts a restart,
 * tells the client (every in-flight request ends at once with an error: a 503 or an SSE error event),
 * and starts a new core of the next epoch, which reloads the model and recomputes any KV state from
 * scratch (nothing is carried over); /health says not-ready until its READY arrives. A core that
 * dies again within a second of starting is restarted after a growing pause (up to 5 s). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "osprey_internal.h"
#include "serve_internal.h"

struct srv_core_proc {
    srv_server *srv;
    char dir[64], endpoint[128];
    char **argv;              /* [exe, "__engine-core", endpoint, epoch, serve args..., NULL] */
    char epoch_str[16];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pid_t pid;                /* the running core, or 0 */
    uint32_t epoch;
    bool stopping, ever_ready, first_failed;
    char first_why[160];      /* how the first core ended when it never came up */
    int64_t restarts;
};

static pid_t spawn(srv_core_proc *p) {
    snprintf(p->epoch_str, sizeof p->epoch_str, "%u", p->epoch);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid != 0) return pid; /* -1: fork failed */
    /* the child: only async-signal-safe calls until exec */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); /* serve blocks SIGTERM/SIGINT for sigwait; the core takes them */
    signal(SIGPIPE, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1); /* the frontend died before the line above */
    for (int fd = 3; fd < 1024; fd++) close(fd);
    execv("/proc/self/exe", p->argv);
    _exit(127);
}

static void *supervise(void *arg) {
    srv_core_proc *p = arg;
    srv_server *srv = p->srv;
    double pause = 0.1;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (p->stopping) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        const pid_t pid = spawn(p);
        const int fork_err = errno;
        p->pid = pid > 0 ? pid : 0;
        pthread_mutex_unlock(&p->mu);
        const time_t started = time(NULL);
        int status = 0;
        if (pid > 0) {
            srv_log(srv, SRV_LOG_INFO, "engine core process %d started (epoch %u)", (int)pid, p->epoch);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
        } else {
            srv_log(srv, SRV_LOG_WARNING, "cannot fork the engine core: %s", strerror(fork_err));
        }
        char why[160];
        if (pid <= 0) snprintf(why, sizeof why, "the engine core process could not be forked (%s)", strerror(fork_err));
        else if (WIFSIGNALED(status)) snprintf(why, sizeof why, "the engine core process died (signal %d)", WTERMSIG(status));
        else snprintf(why, sizeof why, "the engine core process exited (status %d)", WEXITSTATUS(status));
        pthread_mutex_lock(&p->mu);
        p->pid = 0;
        const bool stopping = p->stopping, ever = p->ever_ready;
        if (!stopping && ever) p->restarts++;
        if (!ever) {
            p->first_failed = true;
            snprintf(p->first_why, sizeof p->first_why, "%s", why);
        }
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        if (stopping) break;
        if (!ever) break; /* it never came up: srv_core_start reports it, and nothing was sent to it */
        srv_log(srv, SRV_LOG_WARNING, "%s; failing its requests and restarting it", why);
        osp_core_client_core_lost(srv->core, p->epoch + 1, why);
        p->epoch++;
        if (time(NULL) - started <= 1) { /* dying at once: back off */
            struct timespec ts = {.tv_sec = (time_t)pause, .tv_nsec = (long)((pause - (double)(time_t)pause) * 1e9)};
            nanosleep(&ts, NULL);
            pause = pause * 2 > 5 ? 5 : pause * 2;
        } else {
            pause = 0.1;
        }
    }
    return NULL;
}

int srv_core_start(srv_server *srv, int serve_argc, char **serve_argv, osp_ipc_ready *info, char *why, size_t why_cap) {
    if (why_cap) snprintf(why, why_cap, "it could not be set up");
    srv_core_proc *p = calloc(1, sizeof *p);
    if (!p) return -1;
    p->srv = srv;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    snprintf(p->dir, sizeof p->dir, "%s/osprey-core-XXXXXX", getenv("TMPDIR") && strlen(getenv("TMPDIR")) < 32 ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(p->dir)) {
        fprintf(stderr, "osprey: error: cannot make a directory for the engine core's socket: %s\n", strerror(errno));
        return -1;
    }
    snprintf(p->endpoint, sizeof p->endpoint, "ipc://%s/core", p->dir);
    p->argv = calloc((size_t)serve_argc + 5, sizeof *p->argv); /* + the NULL at the end */
    if (!p->argv) return -1;
    p->argv[0] = "osprey";
    p->argv[1] = "__engine-core";
    p->argv[2] = p->endpoint;
    p->argv[3] = p->epoch_str;
    for (int i = 0; i < serve_argc; i++) p->argv[4 + i] = serve_argv[i];
    srv->proc = p;
    const osp_core_client_params cp = {.endpoint = p->endpoint, .fe = 0, .heartbeat_ms = 200, .ack_timeout_ms = 60000};
    if (osp_core_client_create(&cp, &srv->core) != OSP_OK) {
        fprintf(stderr, "osprey: error: %s\n", osp_last_error());
        return -1;
    }
    if (pthread_create(&p->thread, NULL, supervise, p) != 0) return -1;
    /* the first READY, or the first core's death (a bad flag, a model that does not load) */
    for (;;) {
        if (osp_core_client_wait_ready(srv->core, 100, info)) break;
        pthread_mutex_lock(&p->mu);
        const bool failed = p->first_failed;
        pthread_mutex_unlock(&p->mu);
        if (failed) {
            pthread_join(p->thread, NULL);
            if (why_cap) snprintf(why, why_cap, "%s before it was ready", p->first_why);
            char path[160];
            snprintf(path, sizeof path, "%s/core", p->dir);
            unlink(path);
            rmdir(p->dir);
            return -1;
        }
    }
    pthread_mutex_lock(&p->mu);
    p->ever_ready = true;
    const bool died = p->first_failed; /* it died after READY but before ever_ready was set */
    if (died && why_cap) snprintf(why, why_cap, "%s just after it was ready", p->first_why);
    pthread_mutex_unlock(&p->mu);
    return died ? -1 : 0;
}

int srv_core_attach(srv_server *srv, const char *endpoint, uint32_t fe, osp_ipc_ready *info) {
    const osp_core_client_params cp = {.endpoint = endpoint, .fe = fe, .heartbeat_ms = 200, .ack_timeout_ms = 60000,
                                       .watch_disconnect = true};
    if (osp_core_client_create(&cp, &srv->core) != OSP_OK) {
        fprintf(stderr, "osprey: error: %s\n", osp_last_error());
        return -1;
    }
    return osp_core_client_wait_ready(srv->core, 600000, info) ? 0 : -1;
}

int srv_api_servers_start(srv_server *srv, int serve_argc, char **serve_argv) {
    if (!srv->proc) return -1;
    char **argv = calloc((size_t)serve_argc + 5, sizeof *argv);
    if (!argv) return -1;
    char idx[16];
    argv[0] = "osprey";
    argv[1] = "__api-server";
    argv[2] = idx;
    argv[3] = srv->proc->endpoint;
    for (int i = 0; i < serve_argc; i++) argv[4 + i] = serve_argv[i];
    int rc = 0;
    for (int k = 1; k < srv->cfg.api_server_count && k <= 64; k++) {
        snprintf(idx, sizeof idx, "%d", k);
        const pid_t parent = getpid();
        const pid_t pid = fork();
        if (pid == 0) { /* as spawn(): signals back to default, dies with this process, nothing inherited */
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            for (int fd = 3; fd < 1024; fd++) close(fd);
            execv("/proc/self/exe", argv);
            _exit(127);
        }
        if (pid < 0) {
            rc = -1;
            break;
        }
        srv->api_pids[srv->n_api_pids++] = (int)pid;
        srv_log(srv, SRV_LOG_INFO, "API server %d started (pid %d)", k, (int)pid);
    }
    free(argv);
    return rc;
}

void srv_api_servers_stop(srv_server *srv) {
    for (int i = 0; i < srv->n_api_pids; i++) kill(srv->api_pids[i], SIGTERM);
    for (int i = 0; i < srv->n_api_pids; i++) {
        int st;
        while (waitpid(srv->api_pids[i], &st, 0) < 0 && errno == EINTR) {
        }
    }
    srv->n_api_pids = 0;
}

void srv_core_stop(srv_server *srv) {
    srv_core_proc *p = srv->proc;
    if (!p) { /* an attached API server: only its client */
        osp_core_client_free(srv->core);
        srv->core = NULL;
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    if (p->pid > 0) kill(p->pid, SIGTERM);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    osp_core_client_free(srv->core);
    srv->core = NULL;
    char path[160];
    snprintf(path, sizeof path, "%s/core", p->dir);
    unlink(path);
    rmdir(p->dir);
    free(p->argv);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
    srv->proc = NULL;
}

int64_t srv_core_restarts(srv_server *srv) {
    srv_core_proc *p = srv->proc;
    if (!p) return 0;
    pthread_mutex_lock(&p->mu);
    const int64_t n = p->restarts;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* ---- the core process ------------------------------------------------------------------------ */

static atomic_int g_stop;
static void on_term(int sig) {
    (void)sig;
    atomic_store(&g_stop, 1);
}

int cmd_engine_core(int argc, char **argv) {
    if (argc < 4) cli_die(OSP_OK, "__engine-core is started by `osprey serve --engine-process`, not by hand");
    const char *endpoint = argv[1];
    const uint32_t epoch = (uint32_t)cli_int("epoch", argv[2], 0, UINT32_MAX);
    const srv_config cfg = srv_parse_flags(argc - 3, argv + 3);
    struct sigaction sa = {.sa_handler = on_term};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* a test hook: a restarted core (epoch >= 1) waits this long before loading, so the suite can see
     * the frontend while no core is ready (tests/integration/test_engine_process.py) */
    const char *delay = getenv("OSPREY_ENGINE_CORE_RESTART_DELAY_MS");
    if (epoch > 0 && delay) {
        const long ms = strtol(delay, NULL, 10);
        if (ms > 0 && ms < 60000) {
            const struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    osp_engine_params ep = srv_engine_params(&cfg);
    if (epoch == 0 && isatty(STDERR_FILENO)) ep.load_progress = srv_load_bar; /* the terminal the server has */
    /* --kv-events-config: the block pool lives here, so this process publishes (a restarted core binds
     * the same endpoints again; its sequence numbers start over) */
    srv_server pub_srv = {.cfg = cfg};
    const char *base = strrchr(cfg.model_path, '/');
    pub_srv.model_name = cfg.served_model_name ? cfg.served_model_name : base ? base + 1 : cfg.model_path;
    osp_kv_publisher *pub = srv_kv_events_open(&pub_srv);
    if (pub) ep.kv_event_sink = osp_kv_publisher_sink(pub);
    osp_engine *e;
    osp_status s = osp_engine_create(&ep, &e);
    if (s != OSP_OK) cli_die(s, "engine core: cannot start the engine");
    if (epoch == 0) {
        cli_report_device(e);
        srv_log_memory(&pub_srv, e);
    }
    const osp_core_server_params sp = {.endpoint = endpoint, .epoch = epoch, .frontend_timeout_ms = cfg.core_frontend_timeout_ms,
                                       .idle_stats_ms = 250, .stop = &g_stop};
    s = osp_core_serve(e, &sp, NULL);
    osp_engine_free(e);
    osp_kv_publisher_free(pub); /* after the engine: its pool reports to it */
    if (s != OSP_OK) cli_die(s, "engine core");
    return 0;
}
