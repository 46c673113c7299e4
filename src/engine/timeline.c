/* The step timeline: see timeline.h. */
#include "engine/timeline.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/status_internal.h"

struct osp_timeline {
    FILE *f;
    char *path;
    double t0;          /* the first step's schedule start: the trace's zero */
    bool started, failed;
    bool have_prev;     /* the previous step, for the idle figures */
    osp_timeline_step prev;
    int64_t steps, pairs; /* steps written; consecutive decode-only pairs measured */
    double period_s, busy_s, gap_before_s, gap_mid_s;
};

static const char *const k_phase[OSP_TL_PHASES] = {"schedule", "prepare", "forward", "sample", "update"};

static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

osp_status osp_timeline_open(const char *path, bool device, const char *const *keep, int n_keep, osp_timeline **out) {
    *out = NULL;
    for (int i = 0; i < n_keep; i++)
        if (keep[i] && same_file(path, keep[i]))
            return osp_set_error(OSP_ERR_INVALID_ARG, "trace: %s would overwrite %s, which this run reads: give the trace another file",
                                 path, keep[i]);
    osp_timeline *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return osp_set_error(OSP_ERR_NOMEM, "trace: out of memory");
    }
    if (!(t->f = fopen(path, "w"))) {
        const int e = errno;
        free(t->path), free(t);
        return osp_set_error(OSP_ERR_IO, "trace: cannot open %s: %s", path, strerror(e));
    }
    fprintf(t->f, "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"osprey engine\"}},\n"
                  "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"engine (host)\"}}");
    if (device) fprintf(t->f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,\"args\":{\"name\":\"device\"}}");
    if (fflush(t->f) != 0) t->failed = true;
    *out = t;
    return OSP_OK;
}

static void event(osp_timeline *t, const osp_timeline_step *s, const char *name, int tid, double a, double b) {
    if (b < a) b = a;
    if (fprintf(t->f, ",\n{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                      "\"args\":{\"step\":%lld,\"rows\":%d,\"tokens\":%d,\"decode\":%s}}",
                name, tid, 1e6 * (a - t->t0), 1e6 * (b - a), (long long)s->step, s->rows, s->tokens,
                s->decode_only ? "true" : "false") < 0)
        t->failed = true;
}

/* the end of a step's last device span, or -1 */
static double dev_end(const osp_timeline_step *s) { return s->dev.sample[1] >= 0 ? s->dev.sample[1] : s->dev.run[1]; }

void osp_timeline_add(osp_timeline *t, const osp_timeline_step *s) {
    if (t->failed) return;
    if (!t->started) t->t0 = s->host[0], t->started = true;
    for (int i = 0; i < OSP_TL_PHASES; i++) event(t, s, k_phase[i], 1, s->host[i], s->host[i + 1]);
    if (s->dev.run[0] >= 0 && s->dev.run[1] >= 0) event(t, s, "forward", 2, s->dev.run[0], s->dev.run[1]);
    if (s->dev.sample[0] >= 0 && s->dev.sample[1] >= 0) event(t, s, "sample", 2, s->dev.sample[0], s->dev.sample[1]);
    t->steps++;
    /* idle between decode steps: this step against the one before it, both decode-only with device spans */
    if (t->have_prev && t->prev.decode_only && s->decode_only && dev_end(&t->prev) >= 0 && s->dev.run[0] >= 0 &&
        dev_end(s) >= 0) {
        const double end0 = dev_end(&t->prev), end1 = dev_end(s);
        const double before = s->dev.run[0] > end0 ? s->dev.run[0] - end0 : 0.0;
        const double mid = s->dev.sample[0] > s->dev.run[1] ? s->dev.sample[0] - s->dev.run[1] : 0.0;
        if (end1 > end0) {
            t->pairs++;
            t->period_s += end1 - end0;
            t->gap_before_s += before;
            t->gap_mid_s += mid;
            t->busy_s += (end1 - end0) - before - mid;
        }
    }
    t->prev = *s;
    t->have_prev = true;
    if (fflush(t->f) != 0) t->failed = true; /* whole events on disk if the process is killed next */
    if (t->failed) fprintf(stderr, "osprey: trace: writing %s failed: %s; the timeline stops here\n", t->path, strerror(errno));
}

void osp_timeline_summary(const osp_timeline *t, char *buf, size_t n) {
    if (t->failed) {
        snprintf(buf, n, "trace: writing %s failed after %lld steps (the file is incomplete)", t->path, (long long)t->steps);
        return;
    }
    if (t->pairs == 0) {
        snprintf(buf, n, "trace: %lld steps in %s; no consecutive decode steps with device times (no device clock, "
                         "or no decoding)", (long long)t->steps, t->path);
        return;
    }
    const double p = (double)t->pairs;
    snprintf(buf, n,
             "trace: %lld steps in %s; %lld consecutive decode steps: period %.3f ms, device busy %.3f ms, idle "
             "%.1f%% of the period (%.3f ms before the forward, %.3f ms between forward and sampler), means",
             (long long)t->steps, t->path, (long long)t->pairs, 1e3 * t->period_s / p, 1e3 * t->busy_s / p,
             100.0 * (t->gap_before_s + t->gap_mid_s) / t->period_s, 1e3 * t->gap_before_s / p, 1e3 * t->gap_mid_s / p);
}

osp_status osp_timeline_close(osp_timeline *t) {
    if (!t) return OSP_OK;
    bool failed = t->failed;
    if (!failed && fprintf(t->f, "\n]\n") < 0) failed = true;
    if (fclose(t->f) != 0) failed = true;
    const osp_status s = failed ? osp_set_error(OSP_ERR_IO, "trace: writing %s failed", t->path) : OSP_OK;
    free(t->path);
    free(t);
    return s;
}
