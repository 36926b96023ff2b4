/*
 * The passes over every parameter as a Node-API addon (`src/internal/nativeKernels.ts` loads it; built at install by
 * `native/build.mjs`, optional). The optimiser's: AdamW with float32 or bfloat16 moments, a gradient added into an
 * accumulator, the sum of squares of the global norm. Loading's: BF16 widened to float32, the first non-finite
 * weight. They work on the typed arrays' memory in place, on several threads, where the WebAssembly kernel
 * (`adamKernel.ts`) copies every chunk in and out of its own memory and the loops run on one thread.
 *
 * Bit-identical to `adamStep.ts`'s scalar loops: the same float64 operations in the same order, compiled without
 * contraction into fused multiply-adds (`-ffp-contract=off`) and without x87 excess precision (x86-64 uses SSE2), so
 * any thread split gives the same bits. The sum of squares stays one sequential float64 sum, as `Optimizer.globalNorm`
 * adds, so the norm is the same number too.
 */
#define NAPI_VERSION 8
#include <node_api.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* Below this many elements a tensor is updated on the calling thread: starting threads costs tens of µs. */
#define PARALLEL_MIN 262144
#define MAX_THREADS 16

typedef struct {
  double scale, beta1, b1c, beta2, b2c, step_size, inv_sqrt_c2, eps, keep;
} Coefficients;

typedef struct {
  float *p;
  const float *g;
  void *m, *v; /* float32 values, or bfloat16 bits */
  const Coefficients *c;
  uint32_t hash_at; /* bfloat16: element i's random bits are mix(hash_at + i) */
  size_t start, end;
} Span;

static uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  return x ^ (x >> 16);
}

/* A float32's bits narrowed to bfloat16 with 16 random bits `r` below the kept half (`AdamStep.roundStochastic`). */
static uint16_t round_stochastic(uint32_t u, uint32_t r) {
  return (u & 0x7fffffffU) > 0x7f800000U ? (uint16_t)((u >> 16) | 0x0040U) : (uint16_t)((u + r) >> 16);
}

static float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void *adam32(void *arg) {
  const Span *s = arg;
  const Coefficients c = *s->c;
  float *p = s->p, *m = s->m, *v = s->v;
  const float *g = s->g;
  for (size_t i = s->start; i < s->end; i++) {
    const double gi = (double)g[i] * c.scale;
    const double mi = c.beta1 * (double)m[i] + c.b1c * gi;
    const double vi = c.beta2 * (double)v[i] + c.b2c * gi * gi;
    m[i] = (float)mi;
    v[i] = (float)vi;
    const double pi = (double)p[i] * c.keep;
    p[i] = (float)(pi - (c.step_size * mi) / (sqrt(vi) * c.inv_sqrt_c2 + c.eps));
  }
  return NULL;
}

static void *adam16(void *arg) {
  const Span *s = arg;
  const Coefficients c = *s->c;
  float *p = s->p;
  uint16_t *m = s->m, *v = s->v;
  const float *g = s->g;
  for (size_t i = s->start; i < s->end; i++) {
    const double gi = (double)g[i] * c.scale;
    const double mi = c.beta1 * (double)bits_to_float((uint32_t)m[i] << 16) + c.b1c * gi;
    const double vi = c.beta2 * (double)bits_to_float((uint32_t)v[i] << 16) + c.b2c * gi * gi;
    const uint32_t r = mix(s->hash_at + (uint32_t)i);
    m[i] = round_stochastic(float_to_bits((float)mi), r & 0xffffU);
    v[i] = round_stochastic(float_to_bits((float)vi), r >> 16);
    const double pi = (double)p[i] * c.keep;
    p[i] = (float)(pi - (c.step_size * mi) / (sqrt(vi) * c.inv_sqrt_c2 + c.eps));
  }
  return NULL;
}

/* Loading: `p` is the float32 destination, `m` the BF16 bits. */
static void *widen_bf16(void *arg) {
  const Span *s = arg;
  const uint16_t *src = s->m;
  uint32_t *dst = (uint32_t *)s->p;
  for (size_t i = s->start; i < s->end; i++) dst[i] = (uint32_t)src[i] << 16;
  return NULL;
}

/* Loading: the span's first NaN or ±Infinity in `g`, as an index, stored over `start` (`end` when none). */
static void *first_non_finite(void *arg) {
  Span *s = arg;
  const uint32_t *bits = (const uint32_t *)s->g;
  size_t i = s->start;
  while (i < s->end && (bits[i] & 0x7f800000U) != 0x7f800000U) i++;
  s->start = i;
  return NULL;
}

static void *add_into(void *arg) {
  const Span *s = arg;
  float *acc = s->p;
  const float *g = s->g;
  for (size_t i = s->start; i < s->end; i++) acc[i] += g[i];
  return NULL;
}

/*
 * `work` over [0, n) split in `count` contiguous spans (1 to MAX_THREADS), this thread taking the first; `spans`
 * (MAX_THREADS of them) keeps what each did. Returns the number of spans.
 */
static uint32_t run_spans(void *(*work)(void *), const Span *base, size_t n, double count, Span *spans) {
  uint32_t threads = !(count >= 1) || n < PARALLEL_MIN ? 1 : count >= MAX_THREADS ? MAX_THREADS : (uint32_t)count;
  pthread_t ids[MAX_THREADS];
  int started[MAX_THREADS] = {0};
  for (uint32_t k = 0; k < threads; k++) {
    spans[k] = *base;
    spans[k].start = n * k / threads;
    spans[k].end = n * (k + 1) / threads;
  }
  for (uint32_t k = 1; k < threads; k++) started[k] = pthread_create(&ids[k], NULL, work, &spans[k]) == 0;
  work(&spans[0]);
  /* A thread that could not start: its span runs here. */
  for (uint32_t k = 1; k < threads; k++) {
    if (started[k]) pthread_join(ids[k], NULL);
    else work(&spans[k]);
  }
  return threads;
}

static void run_split(void *(*work)(void *), const Span *base, size_t n, double count) {
  Span spans[MAX_THREADS];
  run_spans(work, base, n, count, spans);
}

/* ----- Node-API glue ----- */

#define CHECK(env, call)                                                                                           \
  do {                                                                                                             \
    if ((call) != napi_ok) {                                                                                       \
      napi_throw_error((env), NULL, "kernels: " #call " failed");                                                    \
      return NULL;                                                                                                 \
    }                                                                                                              \
  } while (0)

/* The data and length of a typed array argument of the expected type (float32 or uint16); NULL after throwing. */
static void *array_of(napi_env env, napi_value value, napi_typedarray_type want, size_t *length) {
  bool is_typed = false;
  if (napi_is_typedarray(env, value, &is_typed) != napi_ok || !is_typed) {
    napi_throw_type_error(env, NULL, "kernels: expected a typed array");
    return NULL;
  }
  napi_typedarray_type type;
  void *data = NULL;
  if (napi_get_typedarray_info(env, value, &type, length, &data, NULL, NULL) != napi_ok || type != want) {
    const bool f32 = want == napi_float32_array;
    napi_throw_type_error(env, NULL, f32 ? "kernels: expected a Float32Array" : "kernels: expected a Uint16Array");
    return NULL;
  }
  /* An empty array may have no memory at all. */
  static float none;
  return data == NULL ? (void *)&none : data;
}

static bool number_of(napi_env env, napi_value value, double *out) {
  if (napi_get_value_double(env, value, out) == napi_ok) return true;
  napi_throw_type_error(env, NULL, "kernels: expected a number");
  return false;
}

/* Up to `max` arguments into `argv`; their count, or 0 after throwing `usage` when fewer than `required` came. */
static size_t arguments_of(napi_env env, napi_callback_info info, napi_value *argv, size_t max, size_t required,
                           const char *usage) {
  size_t argc = max;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) {
    napi_throw_error(env, NULL, "kernels: napi_get_cb_info failed");
    return 0;
  }
  if (argc < required) {
    napi_throw_type_error(env, NULL, usage);
    return 0;
  }
  return argc;
}

/* adam(p, g, m, v, coefficients: Float64Array(9), threads, hashAt?): bfloat16 moments when m and v are Uint16Arrays. */
static napi_value adam(napi_env env, napi_callback_info info) {
  napi_value argv[7];
  const char *usage = "kernels.adam: expected (p, g, m, v, coefficients, threads[, hashAt])";
  const size_t argc = arguments_of(env, info, argv, 7, 6, usage);
  if (argc == 0) return NULL;
  napi_typedarray_type mtype;
  size_t n, gn, mn, vn, cn;
  CHECK(env, napi_get_typedarray_info(env, argv[2], &mtype, &mn, NULL, NULL, NULL));
  const bool half = mtype == napi_uint16_array;
  const napi_typedarray_type moment = half ? napi_uint16_array : napi_float32_array;
  Span s;
  if ((s.p = array_of(env, argv[0], napi_float32_array, &n)) == NULL) return NULL;
  if ((s.g = array_of(env, argv[1], napi_float32_array, &gn)) == NULL) return NULL;
  if ((s.m = array_of(env, argv[2], moment, &mn)) == NULL) return NULL;
  if ((s.v = array_of(env, argv[3], moment, &vn)) == NULL) return NULL;
  const double *coefficients = array_of(env, argv[4], napi_float64_array, &cn);
  if (coefficients == NULL) return NULL;
  if (gn != n || mn != n || vn != n || cn != 9) {
    napi_throw_range_error(env, NULL, "kernels.adam: p, g, m and v must be of one length, with 9 coefficients");
    return NULL;
  }
  double threads, hash_at = 0;
  if (!number_of(env, argv[5], &threads)) return NULL;
  if (half && argc < 7) {
    napi_throw_type_error(env, NULL, "kernels.adam: bfloat16 moments need a number hashAt");
    return NULL;
  }
  if (half && !number_of(env, argv[6], &hash_at)) return NULL;
  Coefficients c;
  memcpy(&c, coefficients, sizeof c);
  s.c = &c;
  /* hashAt is an int32 from JavaScript; anything else is reduced modulo 2^32 as `| 0` would. */
  s.hash_at = isfinite(hash_at) ? (uint32_t)(int64_t)fmod(hash_at, 4294967296.0) : 0;
  run_split(half ? adam16 : adam32, &s, n, threads);
  return NULL;
}

/* addInto(acc, g, threads): acc += g, element by element. */
static napi_value add(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (arguments_of(env, info, argv, 3, 3, "kernels.addInto: expected (acc, g, threads)") == 0) return NULL;
  Span s;
  size_t n, gn;
  double threads;
  if ((s.p = array_of(env, argv[0], napi_float32_array, &n)) == NULL) return NULL;
  if ((s.g = array_of(env, argv[1], napi_float32_array, &gn)) == NULL) return NULL;
  if (!number_of(env, argv[2], &threads)) return NULL;
  if (gn != n) {
    napi_throw_range_error(env, NULL, "kernels.addInto: acc and g must be of one length");
    return NULL;
  }
  run_split(add_into, &s, n, threads);
  return NULL;
}

/* sumSquares(g, sum): sum + Σ g[i]², one float64 sum in index order (as `Optimizer.globalNorm`). */
static napi_value sum_squares(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (arguments_of(env, info, argv, 2, 2, "kernels.sumSquares: expected (g, sum)") == 0) return NULL;
  size_t n;
  double sum;
  const float *g = array_of(env, argv[0], napi_float32_array, &n);
  if (g == NULL || !number_of(env, argv[1], &sum)) return NULL;
  for (size_t i = 0; i < n; i++) sum += (double)g[i] * (double)g[i];
  napi_value out;
  CHECK(env, napi_create_double(env, sum, &out));
  return out;
}

/* widenBf16(src: Uint16Array, dst: Float32Array, dstOffset, threads): dst[dstOffset + i] = src[i]'s float32. */
static napi_value widen(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  const char *usage = "kernels.widenBf16: expected (src, dst, dstOffset, threads)";
  if (arguments_of(env, info, argv, 4, 4, usage) == 0) return NULL;
  Span s;
  size_t n, dn;
  double offset, threads;
  if ((s.m = array_of(env, argv[0], napi_uint16_array, &n)) == NULL) return NULL;
  if ((s.p = array_of(env, argv[1], napi_float32_array, &dn)) == NULL) return NULL;
  if (!number_of(env, argv[2], &offset) || !number_of(env, argv[3], &threads)) return NULL;
  if (!(offset >= 0) || offset + (double)n > (double)dn) {
    napi_throw_range_error(env, NULL, "kernels.widenBf16: src does not fit in dst at dstOffset");
    return NULL;
  }
  s.p += (size_t)offset;
  run_split(widen_bf16, &s, n, threads);
  return NULL;
}

/* firstNonFinite(data: Float32Array, threads): the index of its first NaN or ±Infinity, or -1. */
static napi_value non_finite(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (arguments_of(env, info, argv, 2, 2, "kernels.firstNonFinite: expected (data, threads)") == 0) return NULL;
  Span s, spans[MAX_THREADS];
  size_t n;
  double threads;
  if ((s.g = array_of(env, argv[0], napi_float32_array, &n)) == NULL) return NULL;
  if (!number_of(env, argv[1], &threads)) return NULL;
  const uint32_t count = run_spans(first_non_finite, &s, n, threads, spans);
  double first = -1;
  for (uint32_t k = 0; k < count && first < 0; k++) if (spans[k].start < spans[k].end) first = (double)spans[k].start;
  napi_value out;
  CHECK(env, napi_create_double(env, first, &out));
  return out;
}

static napi_value init(napi_env env, napi_value exports) {
  const napi_property_descriptor properties[] = {
    {"adam", NULL, adam, NULL, NULL, NULL, napi_enumerable, NULL},
    {"addInto", NULL, add, NULL, NULL, NULL, napi_enumerable, NULL},
    {"sumSquares", NULL, sum_squares, NULL, NULL, NULL, napi_enumerable, NULL},
    {"widenBf16", NULL, widen, NULL, NULL, NULL, napi_enumerable, NULL},
    {"firstNonFinite", NULL, non_finite, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  CHECK(env, napi_define_properties(env, exports, 5, properties));
  return exports;
}

NAPI_MODULE_INIT() { return init(env, exports); }
