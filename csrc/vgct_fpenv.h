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
 * vgct_fpenv_enter saves the calling thread's control register and sets the
 * default environment; vgct_fpenv_leave restores the saved value (the status
 * flags the engine raised are dropped with it: they are not the caller's).
 * The bridge (module.c) brackets each Python entry point that computes with
 * them; the CPU engine's worker threads (cpu_threads.inc, par_worker) set the
 * default themselves, whatever a new thread inherits on the platform.
 *
 * Registers: x86-64 MXCSR (Intel SDM vol. 1, 10.2.3: default 0x1F80 -- all
 * six exception masks set, RC = 00 nearest, FZ (bit 15) = DAZ (bit 6) = 0);
 * AArch64 FPCR (Arm ARM, "FPCR": 0 -- RMode nearest, FZ/FZ16/DN/AH/FIZ off,
 * no trap enabled).  Elsewhere C99 <fenv.h> fesetenv(FE_DFL_ENV), which sets
 * rounding and exceptions (a platform's flush-to-zero mode, if any, is not
 * covered there).
 */
#ifndef VGCT_FPENV_H
#define VGCT_FPENV_H

#include <stdint.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>

#define VGCT_MXCSR_DEFAULT 0x1F80u /* masks set, round to nearest, FTZ = DAZ = 0 */
#define VGCT_MXCSR_FLAGS 0x3Fu     /* the six status flags                       */

typedef struct {
  unsigned int saved; /* the caller's MXCSR                                  */
  int changed;        /* whether enter wrote MXCSR (leave restores only then) */
} vgct_fpenv;

static inline void vgct_fpenv_enter(vgct_fpenv *env) {
  env->saved = _mm_getcsr();
  env->changed = (env->saved & ~VGCT_MXCSR_FLAGS) != VGCT_MXCSR_DEFAULT;
  if (env->changed) _mm_setcsr(VGCT_MXCSR_DEFAULT);
}

static inline void vgct_fpenv_leave(const vgct_fpenv *env) {
  if (env->changed) _mm_setcsr(env->saved);
}

#elif defined(__aarch64__)

typedef struct {
  uint64_t saved; /* the caller's FPCR */
  int changed;
} vgct_fpenv;

static inline uint64_t vgct_fpcr_get(void) {
  uint64_t v;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(v));
  return v;
}

static inline void vgct_fpcr_set(uint64_t v) { __asm__ __volatile__("msr fpcr, %0" : : "r"(v)); }

static inline void vgct_fpenv_enter(vgct_fpenv *env) {
  env->saved = vgct_fpcr_get();
  env->changed = env->saved != 0;
  if (env->changed) vgct_fpcr_set(0);
}

static inline void vgct_fpenv_leave(const vgct_fpenv *env) {
  if (env->changed) vgct_fpcr_set(env->saved);
}

#else
#include <fenv.h>

typedef struct {
  fenv_t saved;
  int changed;
} vgct_fpenv;

static inline void vgct_fpenv_enter(vgct_fpenv *env) {
  env->changed = fegetenv(&env->saved) == 0 && fesetenv(FE_DFL_ENV) == 0;
}

static inline void vgct_fpenv_leave(const vgct_fpenv *env) {
  if (env->changed) fesetenv(&env->saved);
}
#endif

#endif /* VGCT_FPENV_H */
