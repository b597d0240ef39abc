/*
 * algo.h — the RL algorithms' arithmetic that is not a kernel: advantage
 * estimators (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++, ReMax, PPO's GAE) and
 * the per-token loss weights that implement the loss aggregation modes.
 *
 * The per-token policy loss itself (ratio, clipping, KL, entropy) is the
 * backend op pg_loss (ops.h); rl-train feeds it adv and w computed here.
 * The value loss of PPO is here too (it is tiny: one number per token).
 * Leaves out: the value head's forward/backward (model.h), batching (train.h).
 *
 * Layout: a batch holds S sequences ordered by group; group g owns sequences
 * [goff[g], goff[g+1]).  Per-token arrays are the sequences' response tokens
 * concatenated: sequence s owns [toff[s], toff[s+1]).
 * All functions are pure and thread-safe; they allocate nothing.
 */
#ifndef RL_ALGO_H
#define RL_ALGO_H

#include <stddef.h>
#include <stdint.h>

typedef enum rl_algo {
	RL_ALGO_GRPO = 0,   /* (r - mean_g) / (std_g + eps), std optional */
	RL_ALGO_DRGRPO,     /* r - mean_g, seq-mean-token-sum-norm */
	RL_ALGO_DAPO,       /* GRPO advantage, clip-higher, zero-variance groups dropped, token-mean */
	RL_ALGO_RLOO,       /* r - mean of the other samples of the group */
	RL_ALGO_REINFORCEPP,/* token returns (KL in reward), whitened over the batch */
	RL_ALGO_REMAX,      /* r - r(greedy sample of the same prompt) */
	RL_ALGO_PPO,        /* GAE over a value head */
	RL_ALGO_SFT,        /* cross-entropy on given completions */
	RL_ALGO_GSPO,       /* GRPO advantage, the sequence's importance ratio at every token
	                     * (Qwen's GSPO; verl's loss mode "gspo"), seq-mean-token-mean */
	RL_ALGO_DPO,        /* preference pairs: TRL's DPO losses (rl_dpo_loss) */
	RL_ALGO_RM,         /* preference pairs: a Bradley-Terry reward model (a score head) */
	RL_ALGO_COUNT
} rl_algo;

typedef enum rl_agg {
	RL_AGG_TOKEN_MEAN = 0,          /* sum_t l / (valid tokens in the batch) */
	RL_AGG_SEQ_MEAN_TOKEN_SUM,      /* mean over sequences of sum_t l */
	RL_AGG_SEQ_MEAN_TOKEN_MEAN,     /* mean over sequences of mean_t l */
	RL_AGG_SEQ_MEAN_TOKEN_SUM_NORM, /* sum_s sum_t l / (S * norm_len)  (Dr. GRPO) */
	RL_AGG_COUNT
} rl_agg;

/* Names as on the command line ("grpo", "dr-grpo", "token-mean", ...);
 * parse returns -1 for an unknown name. */
const char *rl_algo_name(int a);
int rl_algo_parse(const char *s);
const char *rl_agg_name(int a);
int rl_agg_parse(const char *s);
/* The aggregation an algorithm uses unless the user overrides it. */
int rl_algo_default_agg(int algo);

typedef struct rl_adv_cfg {
	int algo;
	int norm_std;   /* GRPO/DAPO: divide by the group's std (default 1) */
	float eps;      /* added to std (1e-6) */
	float gamma;    /* discount for REINFORCE++ and GAE (1.0) */
	float lambda;   /* GAE lambda (1.0) */
} rl_adv_cfg;

void rl_adv_cfg_default(rl_adv_cfg *c, int algo);

/* Outcome advantage per sequence for GRPO, Dr. GRPO, DAPO, RLOO.
 * adv (S) out; reward (S); goff (G+1).  A group of one sample gets advantage 0
 * (there is nothing to compare it with).  std is the unbiased sample std (as
 * torch.std), so a group of identical rewards has advantage 0.
 * Returns RL_OK or RL_EINVAL (bad offsets, algo not outcome-based). */
int rl_adv_outcome(float *adv, const float *reward, const int *goff, int G, const rl_adv_cfg *c);

/* ReMax: adv[s] = reward[s] - baseline[s], baseline[s] the reward of the greedy
 * sample of the same prompt. */
int rl_adv_remax(float *adv, const float *reward, const float *baseline, int S);

/* ReMax on token rewards, as verl's compute_remax_outcome_advantage: token t of
 * sequence s gets the sum of the sequence's token rewards from t on (-kl_coef *
 * kl[t'] per token, kl (toff[S]) may be NULL, plus reward[s] at its last token)
 * minus baseline[s].  Without kl that is reward[s] - baseline[s] on every token.
 * adv_tok (toff[S]).  Returns RL_OK or RL_EINVAL (bad offsets). */
int rl_adv_remax_tok(float *adv_tok, const float *reward, const float *baseline, const float *kl,
    float kl_coef, const int *toff, int S);

/* Broadcast a per-sequence advantage to its tokens: adv_tok (toff[S]). */
void rl_adv_broadcast(float *adv_tok, const float *adv_seq, const int *toff, int S);

/* REINFORCE++: token reward = -kl_coef * kl[t] (kl may be NULL) plus reward[s] at the
 * sequence's last token; returns R_t = r_t + gamma R_{t+1}; then whitened over all
 * tokens of the batch (mean 0, unbiased std 1; std + 1e-8).  adv_tok (toff[S]). */
int rl_adv_reinforcepp(float *adv_tok, const float *reward, const float *kl, float kl_coef,
    const int *toff, int S, float gamma);

/* GAE for PPO: token rewards as REINFORCE++ (reward at the last token, minus
 * kl_coef*kl), values (toff[S]) from the value head; V after the last token is 0.
 * delta_t = r_t + gamma V_{t+1} - V_t;  A_t = delta_t + gamma lambda A_{t+1};
 * ret_t = A_t + V_t;  then, when whiten, adv is whitened over the batch
 * (mean 0, unbiased std 1, as REINFORCE++; ret never is). */
int rl_adv_gae(float *adv_tok, float *ret_tok, const float *reward, const float *kl,
    float kl_coef, const float *values, const int *toff, int S, float gamma, float lambda,
    int whiten);

/* ---- multi-turn responses: a loss mask and token rewards --------------------------
 * mask (toff[S], 0 or 1; NULL: every token 1) marks the tokens the policy
 * sampled; 0 marks tokens inserted into the response (an environment's
 * observation, a tool's output).  The estimators below treat the sampled
 * tokens of a sequence as its whole trajectory: an inserted token is no step
 * (no reward, no value, no discount), as verl's GAE skips observation tokens. */

/* The token rewards trew (toff[S]) of the token-level estimators: at each
 * sampled token -kl_coef * kl[t] (kl (toff[S]) may be NULL), plus tokrew[t]
 * (toff[S], may be NULL: per-turn rewards), plus reward[s] at the sequence's
 * last sampled token.  A token reward at an inserted token goes to the
 * nearest sampled token before it (the action it answers), or when none is
 * before it to the first one after it; inserted tokens get 0.  A sequence
 * with no sampled token gets 0 everywhere.  trew may alias tokrew or kl.
 * Returns RL_OK or RL_EINVAL (bad offsets). */
int rl_tok_rewards(float *trew, const float *reward, const float *tokrew, const float *kl,
    float kl_coef, const int *toff, int S, const uint8_t *mask);

/* Reward-to-go over the sampled tokens: adv[t] = trew[t] + gamma * R(next
 * sampled token), less base[s] when base (S) is given; 0 at inserted tokens.
 * adv may alias trew. */
int rl_adv_rtg_masked(float *adv, const float *trew, const float *base, const int *toff, int S,
    float gamma, const uint8_t *mask);

/* GAE over the sampled tokens (verl's multi-turn rule): delta_t = trew[t] +
 * gamma V(next sampled) - V_t, A_t = delta_t + gamma lambda A(next sampled),
 * ret_t = A_t + V_t; at inserted tokens adv 0 and ret = V.  adv may alias trew. */
int rl_adv_gae_masked(float *adv, float *ret, const float *trew, const float *values, const int *toff,
    int S, float gamma, float lambda, const uint8_t *mask);

/* Whitens x (n) over the tokens whose mask is 1 (NULL: all): mean 0,
 * unbiased std 1 (std + 1e-8); the others are set to 0. */
void rl_whiten_masked(float *x, int n, const uint8_t *mask);

/* PPO's clipped value loss (verl's compute_value_loss), per token n < N with
 * weight w[n] (aggregation x mask; 0 = ignored):
 *   vc = old + clamp(v - old, -clip, clip)   (clip <= 0: no clipping, vc = v)
 *   l  = 0.5 * max((v - ret)^2, (vc - ret)^2)
 * Returns sum_n w[n] l[n]; dv[n] = w[n] dl/dv[n]: w (v - ret) when the
 * unclipped term is the larger (ties included), else 0 (then v is outside the
 * clip range and vc does not depend on it).  *nclipped (optional) gets the
 * number of tokens with w != 0 where the clipped term is strictly larger
 * (critic/vf_clipfrac).  Pure; dv may not alias the inputs. */
double rl_value_loss(float *dv, const float *v, const float *old, const float *ret, const float *w,
    int N, float clip, int *nclipped);

/* Explained variance of values as a predictor of returns (verl's
 * critic/vf_explained_var): 1 - var(ret - v) / var(ret), over n tokens;
 * NaN when var(ret) is 0. */
double rl_explained_var(const float *v, const float *ret, int n);

/* Per-token loss weights w (toff[S]) for aggregation mode agg, over the S sequences of
 * one optimizer step (all its micro-batches): loss = sum_t w[t] * l[t].
 * norm_len is the constant of seq-mean-token-sum-norm (the maximum response length).
 * Sequences with no tokens get no weight and do not count in S.  Returns RL_OK or RL_EINVAL. */
int rl_loss_weights(float *w, const int *toff, int S, int agg, int norm_len);
/* The same over the tokens whose mask (toff[S], 0 or 1; NULL: all) is 1: the
 * others get weight 0 and do not count in the token or sequence counts (a
 * sequence with none counts as an empty one), as verl's response_mask. */
int rl_loss_weights_masked(float *w, const int *toff, int S, int agg, int norm_len, const uint8_t *mask);

/* ---- DPO (preference pairs) ------------------------------------------------------
 * TRL's DPOTrainer losses over P pairs, from the policy's and the reference's
 * log-probs of the chosen and rejected completions (pc, pr, rc, rr: summed
 * over each completion's tokens; for ipo the caller passes means over the
 * tokens, as TRL's ipo averages them).  z = (pc - pr) - (rc - rr):
 *   sigmoid  -(1 - ls) log sigmoid(beta z) - ls log sigmoid(-beta z)
 *   hinge    max(0, 1 - beta z)
 *   ipo      (z - 1 / (2 beta))^2
 * loss = the mean over pairs.  dc[i], dr[i] (may be NULL) get d loss / d pc[i]
 * and d loss / d pr[i] (the reference is constant); hinge's derivative is 0
 * where 1 - beta z = 0 (as torch.relu's). */
enum { RL_DPO_SIGMOID = 0, RL_DPO_IPO, RL_DPO_HINGE, RL_DPO_COUNT };
const char *rl_dpo_loss_name(int t);
int rl_dpo_loss_parse(const char *s);   /* -1: unknown */

/* TRL's metrics of those pairs (means over pairs): rewards/chosen = beta (pc - rc),
 * rewards/rejected = beta (pr - rr), rewards/accuracies (chosen > rejected),
 * rewards/margins, logps/chosen = pc, logps/rejected = pr. */
typedef struct rl_dpo_stats {
	double loss, reward_chosen, reward_rejected, accuracy, margin, logp_chosen, logp_rejected;
} rl_dpo_stats;

/* Returns RL_OK, or RL_EINVAL (P < 1, beta <= 0, ls outside [0, 0.5), type unknown). */
int rl_dpo_loss(double *dc, double *dr, rl_dpo_stats *st, const double *pc, const double *pr,
    const double *rc, const double *rr, int P, int type, double beta, double ls);

/* DAPO's dynamic sampling: keep[g] = 0 for groups whose rewards are all equal
 * (no learning signal), 1 otherwise; returns the number kept. */
int rl_groups_with_signal(int *keep, const float *reward, const int *goff, int G);

/* Scalar statistics of a float array (mean, min, max), ignoring NaN; n > 0. */
typedef struct rl_stat3 { double mean, min, max; size_t n; } rl_stat3;
rl_stat3 rl_stat_f32(const float *x, size_t n);



/* ---- learning-rate schedule -------------------------------------------------------
 * lr at optimizer step t (1-based): linear warmup from 0 over `warmup` steps, then
 * constant, or cosine from lr down to lr*min_ratio at step `total`. */
enum { RL_SCHED_CONSTANT = 0, RL_SCHED_COSINE = 1 };
double rl_lr_at(int t, double lr, int warmup, int total, int kind, double min_ratio);
#endif
