/*
 * progress.c — the progress line on stderr (see progress.h).
 */
#include "base/progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

void
rl_progress_init(rl_progress *p, int quiet)
{
	p->on = !quiet && rl_log_level() >= RL_LOG_NORMAL && isatty(STDERR_FILENO);
	p->drawn = 0;
	p->t0 = rl_now();
	p->last = 0;
}

double
rl_progress_elapsed(const rl_progress *p)
{
	return rl_now() - p->t0;
}

void
rl_progress_draw(rl_progress *p, double frac, const char *fmt, ...)
{
	char text[256], bar[64];
	struct winsize ws;
	int cols = 80, width = 20;
	double now;
	va_list ap;

	if (!p->on)
		return;
	now = rl_now();
	if (frac < 1 && now - p->last < 0.2)
		return;
	p->last = now;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
		cols = ws.ws_col;
	if (frac >= 0) {
		int fill;
		frac = frac > 1 ? 1 : frac;
		fill = (int)(frac * width + 0.5);
		for (int i = 0; i < width; i++)
			bar[i] = i < fill ? '#' : '.';
		bar[width] = 0;
		/* \033[K clears what a longer earlier line left; the text is cut at the terminal's width */
		fprintf(stderr, "\r%s: [%s] %3.0f%% %.*s\033[K", rl_log_prog(), bar, 100 * frac,
		    RL_MAX(cols - (int)strlen(rl_log_prog()) - width - 10, 10), text);
	} else {
		fprintf(stderr, "\r%s: %.*s\033[K", rl_log_prog(), RL_MAX(cols - (int)strlen(rl_log_prog()) - 3, 10), text);
	}
	fflush(stderr);
	p->drawn = 1;
}

void
rl_progress_clear(rl_progress *p)
{
	if (!p->on || !p->drawn)
		return;
	fputs("\r\033[K", stderr);
	fflush(stderr);
	p->drawn = 0;
	p->last = 0;
}

void
rl_progress_done(rl_progress *p)
{
	if (!p->on || !p->drawn)
		return;
	fputc('\n', stderr);
	fflush(stderr);
	p->drawn = 0;
}
