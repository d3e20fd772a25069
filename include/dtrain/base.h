/* dtrain base layer: status codes and error messages, logging, timing,
 * aligned allocation, dtypes and their conversions, size parsing.
 * Everything here is independent of ranks and models. */
#ifndef DTRAIN_BASE_H
#define DTRAIN_BASE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Functions that can fail return dt_status; 0 is success and the message of
 * the most recent failure on this thread is in dt_last_error(). */
typedef enum {
    DT_OK = 0,
    DT_ERR_ARG,      /* bad argument from the caller */
    DT_ERR_NOMEM,    /* allocation failed */
    DT_ERR_SYS,      /* a system call failed */
    DT_ERR_PEER,     /* a peer rank died, left or aborted */
    DT_ERR_MISMATCH, /* ranks called different collectives */
    DT_ERR_IO,       /* file or format problem */
    DT_ERR_UNSUPPORTED,
    DT_ERR_NUMERIC   /* the numbers went non-finite where nothing can recover */
} dt_status;

const char *dt_last_error(void);
const char *dt_status_name(dt_status s);
/* Records a message for dt_last_error() and returns s, so callers can write
 * `return dt_error(DT_ERR_ARG, "...", ...)`. */
dt_status dt_error(dt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Classifies a stop signal as its handler receives it (SA_SIGINFO; async-
 * signal-safe): 1 for the first request, 0 for a copy of it (another sender
 * within a second: the terminal's Ctrl-C and a wrapper's copy of it), 2 for
 * a second request (the same sender again, or a second or more later). */
int dt_stop_request_classify(const siginfo_t *si);

/* Logging: messages carry a "[rank r]" prefix once dt_log_set_rank is called. */
typedef enum { DT_LOG_ERROR = 0, DT_LOG_WARN, DT_LOG_INFO, DT_LOG_DEBUG } dt_log_level;
/* n bytes as valid UTF-8 (JSON's strings must be): each byte that does not start a whole character becomes U+FFFD
 * (base/utf8.c). Caller frees; NULL: no memory. */
char *dt_utf8_clean(const char *s, size_t n, size_t *out_len);
/* Where n bytes stop being UTF-8: the offset of the first byte that starts no whole character, n if every one does. */
size_t dt_utf8_find_invalid(const char *s, size_t n);
void dt_log_set_rank(int rank);
void dt_log_set_level(dt_log_level level);
void dt_log(dt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Monotonic wall clock in seconds, and this process's CPU time. */
double dt_time_now(void);
double dt_time_cpu(void);
/* CPU seconds the whole machine has spent busy (every process; the hypervisor's steal too), from /proc/stat. */
double dt_machine_busy(void);
/* This process's CPU seconds and its waited-for children's. */
double dt_time_cpu_all(void);
/* Whether others used more than a tenth of a core over the last `seconds` of this process's work (its children's
 * too), which began at dt_machine_busy() = busy0 and dt_time_cpu_all() = cpu0: a measurement then is not the
 * machine's. */
bool dt_others_busy(double busy0, double cpu0, double seconds);
/* The median of v[0..n) (sorted in place: its middle element, or for n even the mean of the two middle ones, so that
 * two rounds give their mean rather than the better one). */
double dt_median(double *v, size_t n);
/* The q quantile of v[0..n) (sorted in place) by linear interpolation between the two values around q (n - 1), as
 * torch.quantile's default; 0 for none. */
double dt_quantile(double *v, size_t n, double q);

/* The trace recorder (obs writes what it holds as Chrome trace-event JSON).
 * Off, a trace point is one relaxed load and a branch; on, a begin or end is
 * appended under a mutex (a few hundred events per step). Events go on
 * tracks, which a trace shows as threads: a thread's own track unless named
 * (the progress thread's is communication). Names are copied (31 chars). */
/* DT_TRACK_DEVICE: work on a GPU, its times read from the device's events (dt_trace_span). */
typedef enum { DT_TRACK_COMPUTE = 0, DT_TRACK_COMM, DT_TRACK_DATA, DT_TRACK_IO, DT_TRACK_DEVICE, DT_TRACK_COUNT } dt_track;
#define DT_TRACK_SELF (-1)
typedef struct {
    double ts;        /* dt_time_now() seconds */
    char ph;          /* 'B' begin, 'E' end */
    signed char track;
    char name[32];
    char args[94];    /* JSON members without braces ("bytes":64,"algo":"ring"), or "" */
} dt_trace_event;
extern int dt_trace_active; /* read with dt_trace_on() */
static inline int dt_trace_on(void) { return __atomic_load_n(&dt_trace_active, __ATOMIC_RELAXED); }
/* Records (while on) and keeps at most max_events (0: 1M); off by default. */
void dt_trace_enable(int on);
void dt_trace_set_thread_track(int track);
void dt_trace_begin(int track, const char *name, const char *args_fmt, ...) __attribute__((format(printf, 3, 4)));
void dt_trace_end(int track);
/* A whole event whose times were read elsewhere (dt_time_now() seconds, t0 <= t1): a device's work, timed by its events
 * once it is done. */
void dt_trace_span(int track, const char *name, double t0, double t1);
/* The events so far (in order of recording) and how many did not fit;
 * valid until dt_trace_clear. */
const dt_trace_event *dt_trace_events(size_t *n, size_t *dropped);
void dt_trace_clear(void);
/* The call sites: nothing is evaluated while tracing is off. */
#define DT_TRACE_BEGIN(track, ...) do { if (dt_trace_on()) dt_trace_begin((track), __VA_ARGS__); } while (0)
#define DT_TRACE_END(track) do { if (dt_trace_on()) dt_trace_end(track); } while (0)

/* I/O counters of this process: bytes and seconds spent reading training
 * data and writing (or reading) checkpoints, summed since the start. */
typedef enum { DT_IO_DATA_READ = 0, DT_IO_CKPT_WRITE, DT_IO_CKPT_READ, DT_IO_COUNT } dt_io_kind;
void dt_io_count(dt_io_kind kind, size_t bytes, double seconds);
void dt_io_get(dt_io_kind kind, uint64_t *bytes, double *seconds);

/* /proc/cpuinfo's model name into out ("unknown CPU" if none); returns out. */
const char *dt_cpu_model(char *out, size_t cap);
/* Whether the CPU's flags in /proc/cpuinfo include flag (false if unreadable). */
bool dt_cpu_has(const char *flag);
/* The cores this machine gives the job: the online ones, no more than its control group's CPU quota buys in whole
 * cores (Docker's --cpus 2.5 on 64 cores: 2); every process in the group shares them. */
int dt_cpu_cores(void);
/* The cores this process may run on: dt_cpu_cores, no more than its affinity mask holds (taskset, a Slurm step). */
int dt_cpu_allowed(void);
/* The tightest limits this process's control groups (v1 or v2: its own group, every parent, the root) put on memory
 * (bytes; SIZE_MAX: none) and on CPU time (cores' worth, quota / period, as 2.5; 0: none). root and self: the cgroup
 * mount and /proc/self/cgroup, both NULL for those (or for a made tree in $DTRAIN_CGROUP_ROOT, whose file "self"
 * stands for /proc/self/cgroup: tests). */
size_t dt_cgroup_memory_limit(const char *root, const char *self);
double dt_cgroup_cpu_limit(const char *root, const char *self);

/* 64-byte aligned allocation (cache line; AVX-512 friendly). */
void *dt_alloc_aligned(size_t bytes);
/* The same for weights that kernels stream through whole (8 MB and more):
 * 2 MB aligned and advised to take the system's huge pages (transparent
 * huge pages in madvise mode, Debian's default), so that a decoding step's
 * pass over 500 MB of weights misses the TLB 250 times, not 122,000.
 * Freed with dt_free_aligned. */
void *dt_alloc_streamed(size_t bytes);
void dt_free_aligned(void *p);
/* Zeroed, 64-byte aligned memory whose pages the system provides only as
 * they are first written (a store that may never be touched whole: the
 * model's own gradients, moved to the shared arena by data parallelism).
 * Freed with dt_free_zeroed. */
void *dt_alloc_zeroed(size_t bytes);
void dt_free_zeroed(void *p);
/* Private memory that is not needed for a while (a gradient or parameter
 * shard's neighbours under ZeRO): the whole pages of [p, p + bytes) go back
 * to the system and read as zeros when touched again; the bytes of the
 * partial pages at its ends are zeroed, so all of it reads as zeros. */
void dt_mem_release(void *p, size_t bytes);
/* Its first half: zeroes the bytes of [p, p + bytes) outside whole pages and
 * returns the first whole page, *whole getting their length (0 and NULL if
 * none; all of it is zeroed then): the caller gives those pages back its way. */
void *dt_mem_zero_edges(void *p, size_t bytes, size_t *whole);
/* The bytes of [p, p + bytes) that the system holds in memory now (mincore;
 * shared pages count where this process maps them), at most bytes. */
size_t dt_mem_resident(const void *p, size_t bytes);
/* Peak resident memory of this process, in bytes (VmHWM). */
size_t dt_peak_memory(void);
/* This process's resident memory now (VmRSS), in bytes. */
size_t dt_resident_memory(void);
/* A child process: exe run with argv, with fd3 and fd4 as its fds 3 and 4 (every other fd from 5 up closed), its
 * standard output on its standard error, killed when this process dies (PR_SET_PDEATHSIG), SIGINT ignored (the
 * parent decides when it ends). Fork and exec only: the parent may have threads. */
dt_status dt_child_start(const char *exe, char *const argv[], int fd3, int fd4, int *pid);
/* How a child process ended (a wait status), in words: "was killed by signal 9 (Killed)", "exited with status 1". */
void dt_exit_describe(int status, char *buf, size_t cap);
/* A child that closed its end of a pipe or socket: reaped within wait_s seconds (1, and how it ended in buf), or
 * not (0, buf says it "closed its end"). */
int dt_child_reap(int pid, double wait_s, char *buf, size_t cap);

/* Element types. bf16 and f16 are stored as uint16_t and computed in f32. */
typedef enum { DT_F32 = 0, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I64, DT_DTYPE_COUNT } dt_dtype;
static inline size_t dt_dtype_size(dt_dtype t) {
    static const unsigned char sizes[DT_DTYPE_COUNT] = { 4, 8, 2, 2, 4, 8 };
    return (unsigned)t < DT_DTYPE_COUNT ? sizes[t] : 0;
}
const char *dt_dtype_name(dt_dtype t);
dt_status dt_dtype_parse(const char *s, dt_dtype *out);
/* A training precision as the flags, configs and manifests spell it (DeepSpeed's
 * words): "fp32", "bf16", "fp16"; parse refuses anything else (DT_ERR_ARG). */
const char *dt_precision_name(dt_dtype t);
dt_status dt_precision_parse(const char *s, dt_dtype *out);

static inline float dt_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}
/* Round to nearest even (a NaN stays a quiet NaN); without a branch, so
 * that loops over arrays vectorise. */
static inline uint16_t dt_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = { f };
    uint32_t rounded = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16, nan = (v.u & 0x7fffffffu) > 0x7f800000u;
    return (uint16_t)(nan ? (v.u >> 16) | 0x40u : rounded);
}
float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_f16(float f);
/* The shortest decimal that reads back as v, as a double (0.2f: 0.2, not 0.200000003): for the files people read. */
double dt_f32_decimal(float v);

/* splitmix64: a small, fast, seedable generator that gives the same stream on
 * every machine (initialisation, shuffling, synthetic data). */
uint64_t dt_rng_next(uint64_t *state);

/* FNV-1a over 32-bit words, continuing from h (DT_HASH_INIT to start): the
 * fingerprint of parameter stores and checkpoint files (~1 ns per word). */
#define DT_HASH_INIT 1469598103934665603ull
uint64_t dt_hash_words(uint64_t h, const void *words, size_t n);
/* The cache folder, ${XDG_CACHE_HOME:-~/.cache}/dtrain (sub NULL) or a folder sub in it, into out; with make,
 * created. -1: no HOME nor XDG_CACHE_HOME, a path too long, or (make) a folder that cannot be made. */
int dt_cache_dir(const char *sub, char *out, size_t cap, bool make);
/* CRC-32C (Castagnoli) of n bytes, continuing crc (0 to start): TensorBoard's record checksum. */
uint32_t dt_crc32c(uint32_t crc, const void *data, size_t n);
/* Standard normal (Box-Muller) from the same stream. */
/* perm = a permutation of 0..n-1 (Fisher-Yates) from seed's stream (0: 1): the same on every rank. */
void dt_rng_shuffle(int *perm, int n, uint64_t seed);
/* Place i of a permutation of 0..n-1 drawn from seed, computed alone (no table: a file's rows, however many). */
uint64_t dt_rng_permute(uint64_t i, uint64_t n, uint64_t seed);
/* Uniform in [0, 1) from one draw: its top 24 bits. */
float dt_rng_uniform(uint64_t *state);
/* Uniform in [0, 1) as a double from one draw: its top 53 bits (numpy's random()). */
double dt_rng_double(uint64_t *state);
float dt_rng_normal(uint64_t *state);
/* The k-th (0-based) normal dt_rng_normal would give from state seed. */
float dt_rng_normal_at(uint64_t seed, uint64_t k);

/* "64", "4K", "1M", "2G" (powers of 1024) -> bytes. */
dt_status dt_parse_size(const char *s, size_t *out);
/* Formats bytes as "8B", "64KiB", "1MiB" into buf. */
const char *dt_format_size(size_t bytes, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
