/*
 * progress.h — one progress line on stderr for long work (rl-rollout's
 * prompts, rl-train's steps, rl-queue put's records), redrawn in place with
 * '\r' at most five times a second.  Drawn only when stderr is a terminal
 * and the program is not quiet; otherwise every call does nothing, so
 * logs and pipes stay clean.
 *
 *   PROG: [##########..........]  50% 4/8 steps, 1.2 steps/s
 *
 * Leaves out: several bars at once, ETA smoothing.  Not thread-safe: one
 * rl_progress per thread that draws it.
 */
#ifndef RL_PROGRESS_H
#define RL_PROGRESS_H

#include "base/core.h"

typedef struct rl_progress {
	int on;          /* drawing at all */
	int drawn;       /* a line is on the screen now */
	double t0;       /* rl_now() at init */
	double last;     /* last draw */
} rl_progress;

/* rl_progress_init: on when fd 2 is a terminal, quiet is 0 and the log
 * level is at least normal. */
void rl_progress_init(rl_progress *p, int quiet);
/* Seconds since init. */
double rl_progress_elapsed(const rl_progress *p);
/* rl_progress_draw: frac in [0, 1] draws a bar and a percentage, frac < 0
 * (total unknown) only the text; the text is printf-style.  Skipped when
 * the last draw was less than 0.2 s ago, unless frac >= 1. */
void rl_progress_draw(rl_progress *p, double frac, const char *fmt, ...) RL_PRINTF(3, 4);
/* Erases the line (before other output to stderr); the next draw brings it back. */
void rl_progress_clear(rl_progress *p);
/* Ends the line with a newline when one is drawn; later draws start a new one. */
void rl_progress_done(rl_progress *p);

#endif
