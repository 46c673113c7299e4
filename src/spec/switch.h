/* The engine-wide speculation switch. Per-request adaptive k (engine_core.c) sees acceptance, not cost:
 * whether a verification row of k + 1 tokens plus the proposer's work beats k + 1 plain decode steps
 * depends on the model, the machine and the batch. So the engine measures it: over decode-only steps
 * (every row a decode or a verification row, no prompt tokens) it runs a main phase in one mode and then
 * a short probe of the other, adds up output tokens and seconds (the step plus the proposer's call
 * after it) in each, and at the end of the probe keeps the mode with more tokens a second. Speculation
 * on: 64 steps (8 the first time, so short generations get a verdict), then 8 off; off: 256 steps,
 * then 8 on. Where speculation loses it runs off ~97 % of decode steps; where it wins, on ~89 %.
 * The first step of each phase is not measured: it verifies the drafts the other mode proposed (or has
 * none to verify). Outputs never depend on the switch: drafts only change time.
 *
 * Contract: osp_spec_switch_init before the first step; osp_spec_switch_step once per decode-only step
 * with its wall time in seconds (>= 0) and the output tokens it produced (>= 0); `off` says whether the
 * next step proposes drafts. Deterministic in its inputs; no allocation; not thread-safe (the engine's
 * step thread). */
#ifndef OSP_SPEC_SWITCH_H
#define OSP_SPEC_SWITCH_H

#include <stdbool.h>
#include <stdint.h>

#define OSP_SPEC_FIRST_ON 8
#define OSP_SPEC_ON_STEPS 64
#define OSP_SPEC_OFF_PROBE 8
#define OSP_SPEC_OFF_STEPS 256
#define OSP_SPEC_ON_PROBE 8

typedef struct osp_spec_switch {
    bool off;        /* the current phase's mode: true = no drafts */
    bool probe;      /* the current phase is the probe of the other mode */
    bool transition; /* the phase's first step (not measured) */
    int32_t left;    /* decode-only steps left in the phase */
    double sec[2];   /* [on, off]: seconds and output tokens of each mode's latest phase */
    int64_t tok[2];
    int64_t decisions, decisions_off; /* probes decided, and of those the ones that chose off */
} osp_spec_switch;

void osp_spec_switch_init(osp_spec_switch *w);
void osp_spec_switch_step(osp_spec_switch *w, double sec, int64_t tokens);

#endif
