/*
 * reward.h — rule-based verifiers that score a model's response text against
 * the ground truth carried in a trajectory's meta JSON (rl-reward's built-in
 * tasks), and the task list that combines them into one reward.
 *
 * Each verifier is a pure function of (response text, ground truth): no I/O,
 * no global state, thread-safe.  Scores are 0 or 1 except `length`, which is a
 * penalty in [-1, 0], and dapo's -1 for wrong.  The exact rules are in
 * docs/reward.md and rl-reward(1).  The scorer at the end applies them (and an
 * --exec pool) to trajectory records, to a stream and to the queue.
 *
 * Where each part is: gsm8k, exact, arith, length in reward.c; number scanning
 * in scan.c; math and dapo in math.c; countdown in countdown.c; the task list,
 * ground truth and `auto` in tasks.c; the scorer, the stream and queue loops and
 * the summary in score.c (what they share: reward_int.h).
 *
 * Leaves out: the stream format itself (traj.h), the coprocess protocol
 * (reward_exec.h), learned reward models.
 */
#ifndef RL_REWARD_H
#define RL_REWARD_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "reward/judge.h"
#include "reward/reward_exec.h"
#include "stream/traj.h"

/* ---- verifiers on plain strings -------------------------------------------------
 * `resp` is the response text (UTF-8, need not be NUL-terminated: `n` bytes);
 * `truth` a NUL-terminated ground truth string.  Return 1.0 for correct, 0.0
 * otherwise.  When `why` is not NULL it receives a static string that says why
 * the score is 0 ("no #### in response", ...) or NULL on success. */

enum { RL_GSM8K_STRICT = 0, RL_GSM8K_FLEXIBLE = 1 };

/* gsm8k: strict takes the number after the last "####"; flexible the last
 * number anywhere in the response.  `$` and thousands commas are ignored;
 * both sides are compared as numbers.  A truth that contains "####" (a full
 * GSM8K solution) is reduced to what follows its last "####". */
double rl_reward_gsm8k(const char *resp, size_t n, const char *truth, int mode, const char **why);

/* math: the last \boxed{...} (or \fbox{...}) of the response, brace-matched,
 * normalised (rl_reward_math_normalize) and compared with the normalised
 * truth (itself reduced to its last \boxed{} when it has one); equal strings,
 * or equal numbers when both sides parse as numbers (integers, decimals,
 * a/b, \frac{a}{b}). */
double rl_reward_math(const char *resp, size_t n, const char *truth, const char **why);

/* dapo (verl's math_dapo, the DAPO recipe's reward): the text after the
 * last "Answer:" (any case; then the rest of its line) in the last 300
 * characters of the response, against the truth, both normalised by
 * rl_reward_dapo_normalize and compared as strings: 1 when equal, else -1
 * (no "Answer:" is wrong too), as verl scores it. */
double rl_reward_dapo(const char *resp, size_t n, const char *truth, const char **why);

/* verl's normalize_final_answer for math_dapo (the Minerva rule): the part
 * after the last '=', fixed substitutions and removed words (units, \text{}
 * pieces), the first $..$ of a line, \text{..} \textbf{..} \overline{..}
 * \boxed{..} unwrapped, "\fracab" as "\frac{a}{b}", "\sqrt2" as
 * "\sqrt{2}", '$' removed, commas of a number dropped, whitespace stripped.
 * *out is malloc'd (NUL-terminated); returns its length, -1 on no memory. */
long rl_reward_dapo_normalize(char **out, const char *s, size_t n);

/* Copies the content of the last \boxed{...}/\fbox{...} in s[0..n) into out
 * (NUL-terminated, at most cap-1 bytes).  Returns its length, or -1 when
 * there is none, its braces do not close, or it does not fit. */
long rl_reward_math_last_boxed(char *out, size_t cap, const char *s, size_t n);

/* Normalises a LaTeX answer into out (cap bytes, NUL-terminated): drops
 * whitespace, \left and \right, \!, \, \; \: spacing, `$`, ^\circ and
 * ^{\circ}, \% and %, \$, a trailing `.`, unwraps \text{..}, \textbf{..},
 * \mathrm{..} and \mbox{..} (but "\text{ " after the answer starts units: the
 * answer ends there); \dfrac and \tfrac become \frac; \sqrt and \frac get
 * their arguments in braces ("\frac12" is "\frac{1}{2}"); "x=3" (at most two
 * characters before a single '=') becomes "3".  Returns the length, or -1
 * when it does not fit. */
long rl_reward_math_normalize(char *out, size_t cap, const char *s, size_t n);

/* Parses a normalised answer as a number: integer, decimal, a/b, \frac{a}{b},
 * \fracab (single digits), with an optional leading minus.  0 on success. */
int rl_reward_math_number(double *out, const char *s);

/* d as plain decimal text (no exponent) with the fewest significant digits
 * that read back as d (1e20 -> "100000000000000000000", 1e-7 -> "0.0000001"):
 * how a JSON number ground truth is compared.  0, or -1 when it does not fit
 * in cap or d is not finite. */
int rl_reward_decimal(char *buf, size_t cap, double d);

/* countdown: the equation inside the last <answer>...</answer> must use each
 * of numbers[0..count) exactly once (as a multiset), only + - * / and
 * parentheses, and evaluate exactly (rational arithmetic, 64-bit checked) to
 * target.  An optional "= VALUE" at the end must equal the target too. */
double rl_reward_countdown(const char *resp, size_t n, const int64_t *numbers, size_t count,
			   int64_t target, const char **why);

/* The countdown evaluator on its own: evaluates expr[0..n) exactly; collects
 * the integer literals it meets into lits (at most cap; *nlits gets how many
 * there were).  Returns 0 and *num and *den (den > 0, reduced) on success;
 * RL_EFORMAT for a syntax error, RL_EINVAL for division by zero, RL_ETOOBIG
 * on overflow or nesting deeper than 64; *why says which. */
int rl_reward_countdown_eval(int64_t *num, int64_t *den, int64_t *lits, size_t cap, size_t *nlits,
			     const char *expr, size_t n, const char **why);

/* exact: the response, trimmed of surrounding whitespace, equals the trimmed
 * truth byte for byte. */
double rl_reward_exact(const char *resp, size_t n, const char *truth, const char **why);

/* arith (the synthetic task, synth.h): after optional leading spaces the
 * response is an integer (optional '-', digits) followed by the end, a
 * newline or a space, and that integer's text equals truth exactly. */
double rl_reward_arith(const char *resp, size_t n, const char *truth, const char **why);

/* length: 0 when len <= max_len, else -(len - max_len) / max_len, floored at -1. */
double rl_reward_length(long len, long max_len);

/* Number of UTF-8 code points in s[0..n) (continuation bytes not counted). */
long rl_reward_utf8_len(const char *s, size_t n);

/* ---- tasks ----------------------------------------------------------------------- */

typedef enum rl_reward_kind {
	RL_TASK_GSM8K = 0,
	RL_TASK_MATH,
	RL_TASK_COUNTDOWN,
	RL_TASK_EXACT,
	RL_TASK_REGEX,
	RL_TASK_FORMAT,
	RL_TASK_LENGTH,
	RL_TASK_ARITH,
	RL_TASK_DAPO,      /* verl's math_dapo: "Answer: ...", 1 right, -1 wrong */
	RL_TASK_AUTO,      /* gsm8k, math, dapo, countdown or arith, chosen per record from meta */
	RL_TASK_KIND_COUNT
} rl_reward_kind;

/* One component of the reward.  `name` is the key under meta.scores
 * ("gsm8k", "regex", "regex2" for a second regex task, ...). */
typedef struct rl_reward_task {
	int kind;
	double weight;
	char name[32];
	char *pattern;   /* regex/format: the PCRE2 pattern (owned) */
	void *re;        /* regex/format: compiled pcre2_code (owned) */
} rl_reward_task;

typedef struct rl_reward_opts {
	int gsm8k_mode;   /* RL_GSM8K_STRICT (default) or RL_GSM8K_FLEXIBLE */
	long max_length;  /* length task: the budget (> 0 when that task is used) */
	int length_chars; /* 1: count UTF-8 characters; 0: response tokens when the record has them */
	/* DAPO's soft overlong penalty (verl's overlong_buffer), added to the reward when
	 * overlong_buffer > 0: see rl_reward_overlong */
	long overlong_buffer;    /* buffer length in tokens; 0: off */
	double overlong_penalty; /* penalty_factor (rl-reward's default 1) */
	long max_resp_len;       /* the response budget; 0: each record's max_tokens */
} rl_reward_opts;

/* DAPO's soft overlong punishment as verl's DAPO reward manager computes it:
 * min(-(len - (max_len - buffer)) / buffer * factor, 0) -- 0 up to
 * max_len - buffer tokens, then falling linearly to -factor at max_len.
 * len is the response's token count; buffer > 0. */
double rl_reward_overlong(long len, long max_len, long buffer, double factor);

/* Parses a --task argument into t: "NAME[:WEIGHT]" for gsm8k, math,
 * countdown, exact, length, arith, auto; "regex[:WEIGHT]:PATTERN" and
 * "format[:WEIGHT]:PATTERN" for the pattern tasks (a WEIGHT is taken only
 * when the text before the next ':' is a number).  Compiles patterns (UTF,
 * DOTALL, invalid UTF-8 in subjects tolerated).  `taken` (may be NULL) lists
 * the names already used, so a second task of one kind is named "regex2".
 * Logs the reason and returns RL_EINVAL on a bad spec.  Call
 * rl_reward_task_fini on success. */
int rl_reward_task_parse(rl_reward_task *t, const char *spec, const rl_reward_task *taken, size_t ntaken);
void rl_reward_task_fini(rl_reward_task *t);

/* Ground truth from meta: meta.answer, else meta.reward_model.ground_truth
 * (verl).  A string is returned as is; a number is printed into buf (%.17g,
 * trailing zeros trimmed).  Returns NULL when neither is present or usable. */
const char *rl_reward_truth(const cJSON *meta, char *buf, size_t cap);

/* The task `auto` stands for in this record: meta.task, else
 * meta.data_source, searched (ignoring case) for "gsm8k", "countdown",
 * "arith" and "math", in that order.  -1 when none is found. */
int rl_reward_auto_kind(const cJSON *meta);

/* Scores one component.  resp/n: the response text; meta: the record's meta
 * object (may be NULL); ntokens: response token count (-1 when unknown).
 * Returns 0 and *score, or RL_ENOENT when the ground truth the task needs is
 * missing from meta, RL_EFORMAT when it is unusable (countdown numbers that are
 * not integers, ...); *why (never NULL on error) says which.  A wrong answer
 * is a score of 0, not an error.  Thread-safe (pcre2 match data is per call). */
int rl_reward_task_score(double *score, const char **why, const rl_reward_task *t,
			 const rl_reward_opts *o, const char *resp, size_t n,
			 const cJSON *meta, long ntokens);

/* ---- scoring records -------------------------------------------------------------
 * A scorer combines the tasks (and optionally an --exec worker pool and an
 * LLM judge) into one reward per trajectory record:
 *   reward = sum of weight * score over the components, or NaN when any
 *            component failed (no ground truth, no response_text, an --exec
 *            failure); meta.scores.NAME gets each component's score (null when
 *            it failed), meta.reward_error says what failed ("exec: timeout: ...")
 *            and is removed from records that score cleanly; ts_scored is set.
 *            With opts.overlong_buffer the overlong penalty is added to the sum
 *            and kept in meta.scores.overlong; a record without response tokens,
 *            or without a budget (max_tokens or opts.max_resp_len) at least the
 *            buffer, fails (NaN).
 * A record whose meta is not a JSON object keeps its meta and gets NaN.
 * Not thread-safe; the scorer borrows tasks and exec. */
#define RL_REWARD_MAX_TASKS 32

typedef struct rl_reward_stats {
	size_t records;         /* records scored (written) */
	size_t failed;          /* records with reward NaN */
	size_t no_truth;        /* ... of which: a task found no ground truth / bad meta */
	size_t out_of_range;    /* ... of which: the weighted sum is beyond the f32 range */
	size_t exec_failed[RL_EXEC_STATUS_COUNT]; /* --exec results by status */
	double reward_sum;      /* over records that did not fail */
	size_t judge_failed[RL_EXEC_STATUS_COUNT]; /* --judge results by status */
	double comp_sum[RL_REWARD_MAX_TASKS + 2]; /* per task, then exec, then judge */
	size_t comp_n[RL_REWARD_MAX_TASKS + 2];
	size_t overlong_failed; /* ... records without a length budget for the overlong penalty */
	size_t overlong_n;      /* records the overlong penalty lowered */
	double overlong_sum;    /* the sum of their penalties */
} rl_reward_stats;

typedef struct rl_reward_scorer {
	const rl_reward_task *tasks;
	size_t ntasks;            /* <= RL_REWARD_MAX_TASKS */
	rl_reward_opts opts;
	rl_reward_exec *exec;     /* NULL: no --exec component */
	double exec_weight;
	rl_reward_judge *judge;   /* NULL: no --judge component */
	double judge_weight;
	rl_reward_stats st;
} rl_reward_scorer;

/* Scores recs[0..n) in place (see above), sending each record's JSONL form to
 * the exec pool when there is one and each to the judge when there is one.  Returns 0, or RL_ENOMEM / RL_EIO for a
 * failure of this process (not of a record). */
int rl_reward_score_records(rl_reward_scorer *s, rl_traj *const *recs, size_t n);

/* Reads every record of r, scores them in rounds of `batch` records (1 is
 * fine without exec; with exec, batch >= workers keeps them busy) and writes
 * them to w in input order.  On a read error the records read before it are
 * still scored and written; the reader's error is returned. */
int rl_reward_stream(rl_reward_scorer *s, rl_traj_reader *r, rl_traj_writer *w, size_t batch);

/* Queue mode: leases generated records from the broker (qclient.h) in
 * batches of up to `batch`, scores them and puts them back as scored, until
 * *stop becomes non-zero (checked between batches and every wait_ms while
 * idle) or nothing could be leased for idle_exit_s seconds (<= 0: never).
 * A record is scored at least once: a batch whose put fails is not retried
 * here; its lease expires and the broker hands it out again.  Returns 0, or
 * the client's error (RL_ENET, RL_ETIMEDOUT when the broker did not answer
 * within the client's broker_timeout_ms, ...; logged). */
typedef struct rl_qclient rl_qclient;
typedef struct rl_reward_queue_opts {
	uint32_t batch;        /* records per lease; default 256 */
	uint32_t chunk;        /* records per scoring round within a lease; 0: the whole lease.
	                        * Between rounds the lease is extended once less than half
	                        * of it is left (slow --exec programs). */
	uint32_t wait_ms;      /* long-poll wait per lease request; default 500 */
	double idle_exit_s;    /* <= 0: run until *stop */
	struct rl_wstat *stats; /* borrowed, may be NULL: busy/idle time and records scored (wstat.h) */
} rl_reward_queue_opts;
int rl_reward_queue(rl_reward_scorer *s, rl_qclient *c, const rl_reward_queue_opts *o, volatile sig_atomic_t *stop);

/* Prints the summary (records, failures by kind, mean reward and mean per
 * component) to stderr as "PROG: ..." lines (rl_info: quiet hides it). */
void rl_reward_stats_print(const rl_reward_scorer *s, double seconds);

#endif
