/*
 * vgct_fpenv.h -- the floating-point environment the engines compute in.
 *
 * Every statistic of docs/metrics.md is defined in IEEE 754 binary64 with the
 * default environment: round to nearest (ties to even), subnormal operands
 * and results kept (gradual underflow), every exception masked (an overflow
 * gives +-Inf, an invalid operation a NaN, and the program goes on).  The
 * caller's thread may run with another one:
 *   - torch.set_flush_denormal(True) sets MXCSR.FTZ and MXCSR.DAZ on x86-64
 *     (FPCR.FZ on AArch64): a float32 subnormal would then be read as 0, so
 *     a pair differing by subnormals would count as equal (n_unequal 0,
 *     max_abs_err 0) -- and the GPU, which never flushes here, would disagree;
 *   - fesetround(FE_UPWARD) would round every sum and difference up;
 *   - feenableexcept(FE_OVERFLOW | FE_INVALID) would turn the engine's
 *     documented Inf/NaN handling into SIGFPE.
 * vgct_fpenv_enter saves the calling thread's floating-point control and status
 * registers and sets the default environment; vgct_fpenv_leave restores the
 * saved values, status flags included (the flags the engine raised are not
 * the caller's); vgct_fpenv_sync, for a point where Python code may have run
 * since enter (a producer's __dlpack__, a signal handler), takes a control
 * value other than the default as the caller's new one and sets the default
 * The bridge (module_args.c, vgpy_in_fpenv_*) brackets each Python entry
 * point that computes, syncs before each computation that follows Python code
 * (vgpy_fpenv_sync), and runs the signal handlers of the Ctrl-C poll in the
 * caller's environment; the CPU
 * engine's worker threads (cpu_threads.inc, par_worker) set the default
 * themselves, whatever a new thread inherits on the platform.
 *
 * Ordering: the computing code runs in functions called between enter and
 * leave through a function pointer or across translation units, which a
 * compiler cannot move across the register accesses (GCC and clang do not
 * model the floating-point environment, #pragma STDC FENV_ACCESS); the
 * AArch64 accesses are volatile asm with a memory clobber.
 *
 * Registers: x86-64 MXCSR (Intel SDM vol. 1, 10.2.3: default 0x1F80 -- all
 * six exception masks set, RC = 00 nearest, FZ (bit 15) = DAZ (bit 6) = 0);
 * AArch64 FPCR (Arm ARM, "FPCR": 0 -- RMode nearest, FZ/FZ16/DN/AH/FIZ off,
 * no trap enabled; no RES1 bits) and FPSR (the cumulative flags).  Elsewhere
 * C99 <fenv.h> fesetenv(FE_DFL_ENV), which sets rounding and exceptions (a
 * platform's flush-to-zero mode, if any, is not covered there).
 */
#ifndef VGCT_FPENV_H
#define VGCT_FPENV_H

#include <stdint.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>

#define VGCT_MXCSR_DEFAULT 0x1F80u /* masks set, round to nearest, FTZ = DAZ = 0 */
#define VGCT_MXCSR_FLAGS 0x3Fu     /* the six status flags                       */

typedef struct {
  unsigned int saved; /* the caller's MXCSR, flags included */
} vgct_fpenv;

static inline void vgct_fpenv_enter(vgct_fpenv *env) {
  env->saved = _mm_getcsr();
  if ((env->saved & ~VGCT_MXCSR_FLAGS) != VGCT_MXCSR_DEFAULT) _mm_setcsr(VGCT_MXCSR_DEFAULT);
}

static inline void vgct_fpenv_leave(const vgct_fpenv *env) { _mm_setcsr(env->saved); }

#define VGCT_MXCSR_RC 0x6000u /* the rounding-control field */

static inline void vgct_fpenv_sync(vgct_fpenv *env) {
  const unsigned int raw = _mm_getcsr(), now = raw & ~VGCT_MXCSR_FLAGS;
  if (now == VGCT_MXCSR_DEFAULT) return;
  /* Python code changed the default it ran in: apply ITS changes to the
     caller's saved value -- the bits it set (FTZ, DAZ), the masks it cleared
     (a trap unmasked), a rounding direction -- keeping the caller's other bits */
  const unsigned int set = now & ~VGCT_MXCSR_DEFAULT & ~VGCT_MXCSR_RC;
  const unsigned int cleared = VGCT_MXCSR_DEFAULT & ~now;
  unsigned int c = ((env->saved & ~VGCT_MXCSR_FLAGS) | set) & ~cleared;
  if (now & VGCT_MXCSR_RC) c = (c & ~VGCT_MXCSR_RC) | (now & VGCT_MXCSR_RC);
  env->saved = c | (env->saved & VGCT_MXCSR_FLAGS);
  _mm_setcsr(VGCT_MXCSR_DEFAULT | (raw & VGCT_MXCSR_FLAGS));
}

#elif defined(__aarch64__)

typedef struct {
  uint64_t fpcr, fpsr; /* the caller's control and status registers */
} vgct_fpenv;

/* vgct_<reg>_get / vgct_<reg>_set for the system registers fpcr and fpsr */
#define VGCT_A64_SYSREG(reg)                                                    \
  static inline uint64_t vgct_##reg##_get(void) {                               \
    uint64_t v;                                                                 \
    __asm__ __volatile__("mrs %0, " #reg : "=r"(v) : : "memory");               \
    return v;                                                                   \
  }                                                                             \
  static inline void vgct_##reg##_set(uint64_t v) {                             \
    __asm__ __volatile__("msr " #reg ", %0" : : "r"(v) : "memory");             \
  }
VGCT_A64_SYSREG(fpcr)
VGCT_A64_SYSREG(fpsr)

static inline void vgct_fpenv_enter(vgct_fpenv *env) {
  env->fpcr = vgct_fpcr_get();
  env->fpsr = vgct_fpsr_get();
  if (env->fpcr != 0) vgct_fpcr_set(0);
}

static inline void vgct_fpenv_leave(const vgct_fpenv *env) {
  if (vgct_fpcr_get() != env->fpcr) vgct_fpcr_set(env->fpcr);
  vgct_fpsr_set(env->fpsr);
}

#define VGCT_FPCR_RMODE 0xC00000u /* the rounding-mode field */

static inline void vgct_fpenv_sync(vgct_fpenv *env) {
  const uint64_t now = vgct_fpcr_get();
  if (now != 0) { /* as on x86-64: the bits Python code set, its rounding mode */
    uint64_t c = env->fpcr | (now & ~(uint64_t)VGCT_FPCR_RMODE);
    if (now & VGCT_FPCR_RMODE) c = (c & ~(uint64_t)VGCT_FPCR_RMODE) | (now & VGCT_FPCR_RMODE);
    env->fpcr = c;
    vgct_fpcr_set(0);
  }
}

#else
#include <fenv.h>

typedef struct {
  fenv_t saved;
  int ok; /* fegetenv succeeded */
} vgct_fpenv;

static inline void vgct_fpenv_enter(vgct_fpenv *env) {
  env->ok = fegetenv(&env->saved) == 0;
  if (env->ok) fesetenv(FE_DFL_ENV);
}

static inline void vgct_fpenv_leave(const vgct_fpenv *env) {
  if (env->ok) fesetenv(&env->saved);
}

/* (no portable way to tell a changed environment from the default: the
   caller's stays the one saved at enter) */
static inline void vgct_fpenv_sync(vgct_fpenv *env) {
  if (env->ok) fesetenv(FE_DFL_ENV);
}
#endif

#endif /* VGCT_FPENV_H */
