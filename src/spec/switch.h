/* The engine-wide speculation switch. Per-request adaptive k (engine_core.c) sees acceptance, not cost:
 * whether a verification row of k + 1 tokens plus the proposer's work beats k + 1 plain decode steps
 * depends on the model, the machine and the batch. So the engine measures it: over decode-only steps
 * (every row a decode or a verification row, no prompt tokens) it runs a main phase in one mode and then
 * a short probe of the other, adds up output tokens and seconds (the step plus the proposer's call
 * after it) in each, and at the end keeps speculation on only where it made at least 2 % more tokens a
 * second (a tie goes to plain decoding). Steps of an on phase
 * that verified no drafts (the n-gram proposer found nothing) measure plain decoding too: with at least
 * OSP_SPEC_OFF_PROBE of them the on phase is judged without an off probe. Phases: on 64 decode steps,
 * off 256, probes of 4 off or 8 on; the first look is 4 steps off then the 8-step on probe, so short
 * generations get a verdict and every on phase has a plain rate to compare with; a mode that keeps
 * winning doubles its main phase up to 1,024 steps (fewer probes), the loser's goes back to its first
 * length. An on phase whose rate after OSP_SPEC_EARLY_STEPS measured steps is more than
 * OSP_SPEC_EARLY_LOSS below the latest off rate ends there, off (a method that loses by 37 % costs
 * three rows per look instead of eight or 64). The first step of each phase is not measured: it verifies the drafts the other mode
 * proposed (or has none to verify). Outputs never depend on the switch: drafts only change time.
 *
 * Contract: osp_spec_switch_init before the first step; osp_spec_switch_step once per decode-only step
 * with its wall time in seconds (>= 0), the output tokens it produced (>= 0) and whether any row of it
 * verified drafts; `off` says whether the next step proposes drafts. Deterministic in its inputs; no
 * allocation; not thread-safe (the engine's step thread). */
#ifndef OSP_SPEC_SWITCH_H
#define OSP_SPEC_SWITCH_H

#include <stdbool.h>
#include <stdint.h>

#define OSP_SPEC_FIRST_OFF 4
#define OSP_SPEC_ON_STEPS 64
#define OSP_SPEC_OFF_PROBE 4
#define OSP_SPEC_OFF_STEPS 256
#define OSP_SPEC_ON_PROBE 8
#define OSP_SPEC_MAX_STEPS 1024
#define OSP_SPEC_MARGIN 0.02 /* speculation stays on only when 2 % faster */
#define OSP_SPEC_EARLY_STEPS 3
#define OSP_SPEC_EARLY_LOSS 0.3 /* an on phase below 70 % of the off rate ends early */

typedef struct osp_spec_switch {
    bool off;        /* the current phase's mode: true = no drafts */
    bool probe;      /* the current phase is the probe of the other mode */
    bool transition; /* the phase's first step (not measured) */
    int32_t left;    /* decode-only steps left in the phase */
    double sec[2];   /* [on, off]: seconds and output tokens of each mode's latest phase */
    int64_t tok[2];
    double plain_sec; /* the on phase's steps that verified no drafts: plain decoding's evidence */
    int64_t plain_tok;
    int32_t plain_steps;
    int32_t measured;  /* measured steps of the current on phase */
    int32_t on_steps, off_steps;      /* the next main phases' lengths */
    int64_t decisions, decisions_off; /* verdicts, and of those the ones that chose off */
    int64_t early_exits;              /* on phases ended early (OSP_SPEC_EARLY_LOSS) */
} osp_spec_switch;

void osp_spec_switch_init(osp_spec_switch *w);
void osp_spec_switch_step(osp_spec_switch *w, double sec, int64_t tokens, bool drafted);

#endif
