/* The engine-wide speculation switch (see switch.h). */
#include "spec/switch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void begin(osp_spec_switch *w, bool off, bool probe) {
    w->off = off, w->probe = probe;
    w->left = off ? (probe ? OSP_SPEC_OFF_PROBE : OSP_SPEC_OFF_STEPS) : (probe ? OSP_SPEC_ON_PROBE : OSP_SPEC_ON_STEPS);
    w->sec[off] = 0, w->tok[off] = 0;
    w->transition = true;
}

void osp_spec_switch_init(osp_spec_switch *w) {
    memset(w, 0, sizeof *w);
    begin(w, false, false);
    w->left = OSP_SPEC_FIRST_ON;
}

void osp_spec_switch_step(osp_spec_switch *w, double sec, int64_t tokens) {
    if (!w->transition) w->sec[w->off] += sec, w->tok[w->off] += tokens;
    w->transition = false;
    if (--w->left > 0) return;
    if (!w->probe) {
        begin(w, !w->off, true); /* probe the other mode */
        return;
    }
    const double on = w->sec[0] > 0 ? (double)w->tok[0] / w->sec[0] : 0;
    const double off = w->sec[1] > 0 ? (double)w->tok[1] / w->sec[1] : 0;
    w->decisions++;
    w->decisions_off += off > on;
    if (getenv("OSPREY_SPEC_DEBUG"))
        fprintf(stderr, "osprey: speculation switch: on %.1f tokens/s (%lld in %.3f s), off %.1f (%lld in %.3f s): %s\n",
                on, (long long)w->tok[0], w->sec[0], off, (long long)w->tok[1], w->sec[1], off > on ? "off" : "on");
    begin(w, off > on, false);
}
