/*
 * core.h — error codes, logging and small checked helpers shared by every
 * rlpipe module and program.
 *
 * Leaves out: file I/O (io.h), JSON helpers (json.h).
 *
 * Errors: library functions return int, 0 (RL_OK) or an rl_err.  The detail
 * (file, byte offset, key path, what a foreign library said) is logged with
 * rl_error() where it is found; the code travels up.
 */
#ifndef RL_CORE_H
#define RL_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>

typedef enum rl_err {
	RL_OK = 0,
	RL_EINVAL,      /* invalid argument or option */
	RL_ENOMEM,      /* out of memory */
	RL_EIO,         /* read/write/system call failed */
	RL_ENOENT,      /* no such file, key or record */
	RL_EFORMAT,     /* malformed input: bad magic, length, JSON, ... */
	RL_EVERSION,    /* unsupported format or protocol version */
	RL_ECHECKSUM,   /* checksum mismatch */
	RL_ETOOBIG,     /* a size above a configured limit */
	RL_ESHAPE,      /* tensor shape or dtype mismatch */
	RL_ETIMEDOUT,   /* deadline passed */
	RL_ECLOSED,     /* peer or stream closed */
	RL_EBUSY,       /* try again later (backpressure) */
	RL_ESTALE,      /* data older than the staleness bound */
	RL_ENOTSUP,     /* not supported by this build or backend */
	RL_ENODEV,      /* no such device */
	RL_EDEVICE,     /* CUDA/NCCL/device failure */
	RL_ENET,        /* network (nng) failure */
	RL_EEXIST,      /* already exists */
	RL_EINTR,       /* interrupted by a signal */
	RL_ERR_COUNT
} rl_err;

/* rl_strerror returns a static, lowercase description of rv ("unknown error"
 * for codes outside the enum).  Thread-safe. */
const char *rl_strerror(int rv);

/* ---- element types ------------------------------------------------------------
 * Shared by tensors, safetensors files, the stream format and the backends. */
typedef enum rl_dtype {
	RL_F32 = 0, RL_BF16, RL_F16, RL_F64, RL_I8, RL_U8, RL_I16, RL_I32, RL_U32, RL_I64, RL_U64, RL_BOOL,
	RL_DTYPE_COUNT
} rl_dtype;
size_t rl_dtype_size(int dt);          /* bytes per element; 0 for an invalid dtype */
const char *rl_dtype_name(int dt);     /* "F32", "BF16", ... as safetensors spells them */
int rl_dtype_parse(const char *name);  /* inverse of rl_dtype_name; -1 if unknown */

/* bf16 <-> f32 on the host: round to nearest even, NaN kept a quiet NaN. */
static inline uint16_t
rl_f32_to_bf16(float f)
{
	union { float f; uint32_t u; } v = { f };
	if ((v.u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((v.u >> 16) | 0x40);
	return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
static inline float
rl_bf16_to_f32(uint16_t h)
{
	union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
	return v.f;
}
float rl_f16_to_f32(uint16_t h);
uint16_t rl_f32_to_f16(float f);

/* ---- logging ---------------------------------------------------------------
 * Messages go to stderr as "PROG: message" (no full stop; quote paths).
 * Levels: 0 quiet (errors only), 1 normal (warnings + info), 2 verbose, 3 debug.
 * rl_log_init sets the program name (borrowed, must outlive logging) and level.
 * Thread-safe: each message is written with one fprintf under a lock. */
enum { RL_LOG_QUIET = 0, RL_LOG_NORMAL = 1, RL_LOG_VERBOSE = 2, RL_LOG_DEBUG = 3 };
void rl_log_init(const char *prog, int level);
void rl_log_set_level(int level);
int  rl_log_level(void);
const char *rl_log_prog(void);

#if defined(__GNUC__)
#define RL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define RL_PRINTF(a, b)
#endif
void rl_error(const char *fmt, ...) RL_PRINTF(1, 2);   /* always printed */
void rl_warn(const char *fmt, ...) RL_PRINTF(1, 2);    /* level >= 1, "warning: " prefix */
void rl_info(const char *fmt, ...) RL_PRINTF(1, 2);    /* level >= 1 */
void rl_verbose(const char *fmt, ...) RL_PRINTF(1, 2); /* level >= 2 */
void rl_debug(const char *fmt, ...) RL_PRINTF(1, 2);   /* level >= 3 */
void rl_hint(const char *fmt, ...) RL_PRINTF(1, 2);    /* "PROG: hint: ..." always */
void rl_vlog(int level, const char *prefix, const char *fmt, va_list ap);

/* ---- small helpers -----------------------------------------------------------
 * Try-form allocation for sizes that come from input: on failure logs what was
 * asked for and returns NULL (callers return RL_ENOMEM). */
void *rl_try_malloc(size_t n, const char *what);
void *rl_try_calloc(size_t count, size_t size, const char *what);
/* Aborting allocation for small fixed sizes (and cmd/, tests). */
void *rl_xmalloc(size_t n);
void *rl_xcalloc(size_t count, size_t size);
char *rl_xstrdup(const char *s);

/* Overflow-checked size arithmetic: return 0 on success, RL_ETOOBIG on overflow. */
int rl_mul_size(size_t *out, size_t a, size_t b);
int rl_add_size(size_t *out, size_t a, size_t b);

/* The stop signals of a long-running stage: SIGTERM, and SIGINT, to handler h
 * with sigaction flags sa_flags (an empty mask).  SIGINT stays ignored when
 * the process started with it ignored, as a shell starts the background jobs
 * of a script: a Ctrl-C is then the script's to act on (the recipes stop
 * their workers first and the broker last), not every process's at once.
 * A second stop signal ends the process at once (exit status 128 + the
 * signal, a line on stderr): a stage stuck where its flag is not looked at
 * (inside nng, a stalled connection) still stops when told twice, as
 * Ctrl-C twice.  SA_RESETHAND in sa_flags is taken as this rule. */
void rl_stop_signals(void (*h)(int), int sa_flags);

/* Monotonic time in seconds / wall time in seconds since the epoch. */
double rl_now(void);
double rl_wall(void);

#define RL_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define RL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define RL_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
