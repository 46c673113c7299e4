/* The engine-wide speculation switch (see switch.h). */
#include "spec/switch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void begin(osp_spec_switch *w, bool off, bool probe) {
    w->off = off, w->probe = probe;
    w->left = off ? (probe ? OSP_SPEC_OFF_PROBE : w->off_steps) : (probe ? OSP_SPEC_ON_PROBE : w->on_steps);
    w->sec[off] = 0, w->tok[off] = 0, w->measured = 0;
    if (!off) w->plain_sec = 0, w->plain_tok = 0, w->plain_steps = 0;
    w->transition = true;
}

void osp_spec_switch_init(osp_spec_switch *w) {
    memset(w, 0, sizeof *w);
    w->on_steps = OSP_SPEC_ON_STEPS;
    w->off_steps = OSP_SPEC_OFF_STEPS;
    /* the first look: a short off phase, so every on phase after it has a plain rate to lose against
       early, then the usual on probe and verdict */
    begin(w, true, false);
    w->left = OSP_SPEC_FIRST_OFF;
}

/* The verdict on the latest rates of both modes; the winner's main phases lengthen while it keeps
 * winning (fewer probes), the loser's go back to their first length. */
static void decide(osp_spec_switch *w, double on, double off) {
    /* speculation must win by OSP_SPEC_MARGIN: on a tie (an on phase that drafted nothing measures the
       plain rate twice) plain decoding is the safe side, and the on probe comes back for it anyway */
    const bool go_off = on < off * (1.0 + OSP_SPEC_MARGIN);
    w->decisions++;
    w->decisions_off += go_off;
    if (getenv("OSPREY_SPEC_DEBUG"))
        fprintf(stderr, "osprey: speculation switch: on %.1f tokens/s (%lld in %.3f s), off %.1f: %s\n", on,
                (long long)w->tok[0], w->sec[0], off, go_off ? "off" : "on");
    if (go_off) {
        if (w->off) w->off_steps = w->off_steps * 2 > OSP_SPEC_MAX_STEPS ? OSP_SPEC_MAX_STEPS : w->off_steps * 2;
        w->on_steps = OSP_SPEC_ON_STEPS;
    } else {
        if (!w->off) w->on_steps = w->on_steps * 2 > OSP_SPEC_MAX_STEPS ? OSP_SPEC_MAX_STEPS : w->on_steps * 2;
        w->off_steps = OSP_SPEC_OFF_STEPS;
    }
    begin(w, go_off, false);
}

static double rate(int64_t tok, double sec) { return sec > 0 ? (double)tok / sec : 0; }

void osp_spec_switch_step(osp_spec_switch *w, double sec, int64_t tokens, bool drafted) {
    if (!w->transition) {
        w->sec[w->off] += sec, w->tok[w->off] += tokens;
        if (!w->off) w->measured++;
        if (!w->off && !drafted) w->plain_sec += sec, w->plain_tok += tokens, w->plain_steps++;
    }
    w->transition = false;
    /* an on phase (main or probe) losing clearly to the latest plain rate ends early, off: a method that
       does not pay costs a few steps per look, not the whole look */
    if (!w->off && w->measured >= OSP_SPEC_EARLY_STEPS && w->tok[1] > 0) {
        const double on = rate(w->tok[0], w->sec[0]), off = rate(w->tok[1], w->sec[1]);
        if (on < off * (1.0 - OSP_SPEC_EARLY_LOSS)) {
            w->early_exits++;
            decide(w, on, off);
            return;
        }
    }
    if (--w->left > 0) return;
    if (!w->probe) {
        /* an on phase whose own steps without drafts measured plain decoding needs no off probe */
        if (!w->off && w->plain_steps >= OSP_SPEC_OFF_PROBE) {
            const double on = rate(w->tok[0], w->sec[0]), off = rate(w->plain_tok, w->plain_sec);
            w->off = false; /* deciding from the on side */
            decide(w, on, off);
            return;
        }
        begin(w, !w->off, true); /* probe the other mode */
        return;
    }
    /* the probe just ended: w->off is the probed mode, the main phase was the other */
    const bool probed_off = w->off;
    const double on = rate(w->tok[0], w->sec[0]), off = rate(w->tok[1], w->sec[1]);
    w->off = !probed_off; /* the main phase's mode: the winner lengthens it if it keeps it */
    decide(w, on, off);
}
