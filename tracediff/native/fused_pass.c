/* The comparison's one pass over a chunked pair, in C: the same pass as tracediff/compare/fused.py (numba),
 * built by tracediff/native/fused_c.py with the machine's C compiler on first use and loaded through ctypes.
 *
 * Built with -ffp-contract=off and without -ffast-math: every decision (the pass rule, the maxima, NaN and
 * infinities) is the float64 expression the numpy path settles it with, rounded alike on any IEEE-754 CPU.
 * Only the functions that add up sums may have their additions reordered (vectorized): their order
 * differs from numpy's, as the numba build's does, and the bounds of tests/compare/test_kernel.py and
 * tests/capturing/test_numpy_stats.py cover any order and grouping.
 *
 * It also holds the statistics of one tensor (td_stats: capturing/stats.py's numpy_stats in one pass),
 * whose extremes of an all-finite block are the one place compiled with finite-math-only.
 *
 * The file includes itself twice: once for float32 pairs (suffix _f32), once for float64 pairs (_f64). */

#ifndef TD_T

#include <math.h>
#include <stdint.h>

/* the columns of one chunk's row in the output: tracediff/native/fused_columns.py */
enum {
    FINITE, MAX_ABS, MAX_REL, SUM_ABS, SUM_SQ, DOT, NORM_A, NORM_B, NAN_MISMATCH, INF_MISMATCH, FAILED_RULE,
    FAILED_EXCESS, NONFINITE_FAILED, CLEAN, MOMENT_N, MEAN_A, MEAN_B, M2_A, M2_B, C_AB, COLUMNS
};

/* float32's largest finite value plus half an ulp: a float32 difference this large rounds to infinity */
static const double FLOAT32_OVERFLOW = 3.4028235677973366e38;

/* the layout this file writes, checked by the loader before the first call */
int td_fused_columns(void) { return COLUMNS; }

/* a tensor's statistics per chunk, as capturing/stats.py's wide_partials lays them out */
enum { S_MIN, S_MAX, S_SUM, S_SQUARES, S_ABS, S_NONZERO, S_FINITE, S_NAN, S_POSINF, STATS_COLUMNS };
int td_stats_columns(void) { return STATS_COLUMNS; }

/* rtol raised so that d <= rtol * ax holds in float64: to d / ax, then one ulp at a time */
static double smallest_rtol(double rtol, double d, double ax)
{
    double q = d / ax;
    if (q > rtol)
        rtol = q;
    while (d > rtol * ax)
        rtol = nextafter(rtol, INFINITY);
    return rtol;
}

#define TD_T float
#define TD_NAME(x) x##_f32
#define TD_NARROW_DIFF_FINITE(x, y) (fabsf((x) - (y)) < INFINITY)
#include __FILE__
#undef TD_T
#undef TD_NAME
#undef TD_NARROW_DIFF_FINITE

#define TD_T double
#define TD_NAME(x) x##_f64
#define TD_NARROW_DIFF_FINITE(x, y) (fabs((x) - (y)) < INFINITY)
#include __FILE__

#else /* the body, once per dtype */

/* The sums may be added in any order (numba's build: fastmath reassoc and nsz on the comparison's sums only):
 * the compiler vectorizes them. Nothing here can turn into a NaN or an infinity that was not there, and no
 * decision is taken in them. */
#if defined(__clang__)
#define TD_FREE_ORDER _Pragma("clang fp reassociate(on)")
#else
#define TD_FREE_ORDER
#pragma GCC push_options
#pragma GCC optimize("O3", "associative-math", "no-signed-zeros", "no-trapping-math", "no-math-errno", "fp-contract=off")
#endif

/* Over the block's pairs finite on both sides: the five sums added to acc[0:5], the sums of a and b into
 * acc[5:7]; *big: the differences above float32's range. Returns the pairs finite on both sides. */
static int64_t TD_NAME(sums)(const TD_T *a, const TD_T *b, int64_t n, double *acc, int64_t *big)
{
    TD_FREE_ORDER
    double s_abs = 0.0, s_sq = 0.0, dot = 0.0, n_a = 0.0, n_b = 0.0, s_x = 0.0, s_y = 0.0;
    int64_t finite = 0, over = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        int both = (fabs(x) < INFINITY) & (fabs(y) < INFINITY);
        x = both ? x : 0.0;
        y = both ? y : 0.0;
        double d = fabs(x - y);
        s_abs += d;
        s_sq += d * d;
        dot += x * y;
        n_a += x * x;
        n_b += y * y;
        s_x += x;
        s_y += y;
        finite += both;
        over += d > FLOAT32_OVERFLOW;
    }
    acc[0] += s_abs;
    acc[1] += s_sq;
    acc[2] += dot;
    acc[3] += n_a;
    acc[4] += n_b;
    acc[5] = s_x;
    acc[6] = s_y;
    *big = over;
    return finite;
}

/* The block's centred moments over its pairs finite on both sides: sums of squares of a, of b, and of their
 * cross products. */
static void TD_NAME(centred)(const TD_T *a, const TD_T *b, int64_t n, double mean_a, double mean_b, double *q)
{
    TD_FREE_ORDER
    double qa = 0.0, qb = 0.0, qab = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        int both = (fabs(x) < INFINITY) & (fabs(y) < INFINITY);
        double dx = both ? x - mean_a : 0.0;
        double dy = both ? y - mean_b : 0.0;
        qa += dx * dx;
        qb += dy * dy;
        qab += dx * dy;
    }
    q[0] = qa;
    q[1] = qb;
    q[2] = qab;
}

/* One block of a tensor, over its finite elements: the sum, the sum of squares and the sum of magnitudes
 * added to acc[0:3], the non-zeros, finite, NaN and +Inf counts to counts[0:4]. Returns the finite count. */
static int64_t TD_NAME(stats_sums)(const TD_T *x, int64_t n, double *acc, int64_t *counts)
{
    TD_FREE_ORDER
    double s = 0.0, sq = 0.0, sa = 0.0;
    int64_t nonzero = 0, finite = 0, nan = 0, posinf = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        int f = fabs(v) < INFINITY;
        double w = f ? v : 0.0;
        s += w;
        sq += w * w;
        sa += fabs(w);
        nonzero += w != 0.0;
        finite += f;
        nan += v != v;
        posinf += v == INFINITY;
    }
    acc[0] += s;
    acc[1] += sq;
    acc[2] += sa;
    counts[0] += nonzero;
    counts[1] += finite;
    counts[2] += nan;
    counts[3] += posinf;
    return finite;
}

/* One block's sum, sum of squares, sum of magnitudes and non-zeros, as if every element were finite: the
 * common case in one loop the compiler vectorizes without counters or selects (td_stats keeps them only
 * when the sum of squares says the block is finite, else measures it again with stats_sums). */
static void TD_NAME(finite_sums)(const TD_T *x, int64_t n, double *sums)
{
    TD_FREE_ORDER
    double s = 0.0, sq = 0.0, sa = 0.0, nonzero = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        s += v;
        sq += v * v;
        sa += fabs(v);
        nonzero += v != 0.0 ? 1.0 : 0.0;
    }
    sums[0] = s;
    sums[1] = sq;
    sums[2] = sa;
    sums[3] = nonzero;
}

#if !defined(__clang__)
#pragma GCC pop_options
#endif
#undef TD_FREE_ORDER

/* The minimum and maximum of a block whose every element is finite (its sum of squares is), written to
 * *lo and *hi: the compiler may take its min and max instructions, whose NaN and signed-zero rules no
 * element here can reach (a zero's sign may come out either way: -0.0 and 0.0 are equal minima). Nothing
 * else is compared here; the caller merges the result with strict arithmetic. */
#if !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("O3", "finite-math-only", "no-signed-zeros", "no-trapping-math", "no-math-errno", "fp-contract=off")
#endif
static void TD_NAME(finite_extremes)(const TD_T *x, int64_t n, TD_T *lo, TD_T *hi)
{
    TD_T low = x[0], high = x[0];
    for (int64_t i = 1; i < n; i++) {
        low = x[i] < low ? x[i] : low;
        high = x[i] > high ? x[i] : high;
    }
    *lo = low;
    *hi = high;
}
#if !defined(__clang__)
#pragma GCC pop_options
#endif

/* The finite minimum and maximum of a block holding a NaN or an infinity: strict arithmetic. */
static void TD_NAME(extremes)(const TD_T *x, int64_t n, double *lo, double *hi)
{
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        if (!(fabs(v) < INFINITY))
            continue;
        if (v < *lo)
            *lo = v;
        if (v > *hi)
            *hi = v;
    }
}

/* Fills out's row k (STATS_COLUMNS doubles) with the statistics of chunk k of x (n elements): block by
 * block, each block's sums added to the chunk's. Returns the number of chunks. */
int64_t TD_NAME(td_stats)(const TD_T *x, int64_t n, int64_t chunk, int64_t block, double *out)
{
    int64_t k = 0;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        int64_t c1 = c0 + chunk < n ? c0 + chunk : n;
        double lo = INFINITY, hi = -INFINITY, acc[3] = {0};
        int64_t counts[4] = {0};
        for (int64_t b0 = c0; b0 < c1; b0 += block) {
            int64_t m = (b0 + block < c1 ? b0 + block : c1) - b0;
            double sums[4];
            TD_NAME(finite_sums)(x + b0, m, sums);
            /* Terms >= 0 in any order: a NaN makes the sum of squares NaN, an infinity +Inf (and a float64
             * block too large to square is measured again, exactly as one holding an infinity). */
            if (sums[1] - sums[1] == 0.0) {
                acc[0] += sums[0];
                acc[1] += sums[1];
                acc[2] += sums[2];
                counts[0] += (int64_t)sums[3];
                counts[1] += m;
                TD_T block_lo, block_hi;
                TD_NAME(finite_extremes)(x + b0, m, &block_lo, &block_hi);
                if ((double)block_lo < lo)
                    lo = (double)block_lo;
                if ((double)block_hi > hi)
                    hi = (double)block_hi;
            } else {
                TD_NAME(stats_sums)(x + b0, m, acc, counts);
                TD_NAME(extremes)(x + b0, m, &lo, &hi);
            }
        }
        double *row = out + k * STATS_COLUMNS;
        row[S_MIN] = lo;
        row[S_MAX] = hi;
        row[S_SUM] = acc[0];
        row[S_SQUARES] = acc[1];
        row[S_ABS] = acc[2];
        row[S_NONZERO] = (double)counts[0];
        row[S_FINITE] = (double)counts[1];
        row[S_NAN] = (double)counts[2];
        row[S_POSINF] = (double)counts[3];
        k++;
    }
    return k;
}

/* Over the block (meant for finite pairs), d = |a - b|: out[0] elements failing d <= atol + rtol |a|,
 * out[1] elements with d - rtol |a| > atol, out[2] elements with d > max_abs, out[3] elements with d > 0 and
 * d >= max_rel |a| (every element whose d / |a| rounds above max_rel is among them). Strict arithmetic. */
static void TD_NAME(decisions)(const TD_T *a, const TD_T *b, int64_t n, double atol, double rtol,
                               double max_abs, double max_rel, int64_t *out)
{
    int64_t rule = 0, excess = 0, above = 0, rel = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        double d = fabs(x - y);
        double ax = fabs(x);
        rule += !(d <= atol + rtol * ax);
        excess += d - rtol * ax > atol;
        above += d > max_abs;
        rel += (d > 0.0) & (d >= max_rel * ax);
    }
    out[0] = rule;
    out[1] = excess;
    out[2] = above;
    out[3] = rel;
}

/* max_abs and max_rel raised by the pairs finite on both sides of a[b0:b1], b[b0:b1] */
static void TD_NAME(maxima)(const TD_T *a, const TD_T *b, int64_t b0, int64_t b1, double *max_abs,
                            double *max_rel)
{
    for (int64_t i = b0; i < b1; i++) {
        double x = a[i], y = b[i];
        if (!(fabs(x) < INFINITY && fabs(y) < INFINITY))
            continue;
        double d = fabs(x - y);
        double ax = fabs(x);
        if (d > *max_abs)
            *max_abs = d;
        if (d > 0.0 && d >= *max_rel * ax)
            *max_rel = smallest_rtol(*max_rel, d, ax);
    }
}

/* For a block with a NaN, an infinity or a large difference: adds to counts the failures of the finite pairs
 * (rule, excess), NaN and Inf mismatches, failing non-finite pairs; returns whether a float32 difference
 * overflowed. */
static int TD_NAME(nonfinite)(const TD_T *a, const TD_T *b, int64_t b0, int64_t b1, double atol, double rtol,
                              int narrow, int64_t *counts)
{
    int overflow = 0;
    for (int64_t i = b0; i < b1; i++) {
        double x = a[i], y = b[i];
        if (fabs(x) < INFINITY && fabs(y) < INFINITY) {
            double d = fabs(x - y);
            double ax = fabs(x);
            counts[0] += !(d <= atol + rtol * ax);
            counts[1] += d - rtol * ax > atol;
            if (narrow && d > FLOAT32_OVERFLOW && !TD_NARROW_DIFF_FINITE(a[i], b[i]))
                overflow = 1;
            continue;
        }
        int nan_a = x != x, nan_b = y != y;
        int neither = !nan_a && !nan_b;
        counts[2] += nan_a != nan_b;
        counts[3] += neither && x != y;
        counts[4] += !((nan_a && nan_b) || (neither && x == y));
    }
    return overflow;
}

/* Marks in hit the positions (inner elements each, length of them; flat: the flat index of a[0]) of the
 * elements of a[b0:b1] out of tolerance, as positions.beyond_elements finds them; a position is scanned up
 * to its first such element. */
static void TD_NAME(mark)(const TD_T *a, const TD_T *b, int64_t b0, int64_t b1, double atol, double rtol,
                          int64_t flat, int64_t inner, int64_t length, uint8_t *hit)
{
    int64_t i = b0;
    while (i < b1) {
        int64_t where = flat + i;
        int64_t pos = (where / inner) % length;
        int64_t end = i + inner - where % inner;
        if (end > b1)
            end = b1;
        if (!hit[pos]) {
            for (int64_t j = i; j < end; j++) {
                double x = a[j], y = b[j];
                if (!(fabs(x - y) <= atol + rtol * fabs(x)) &&
                    !((x != x && y != y) || (fabs(x) == INFINITY && x == y))) {
                    hit[pos] = 1;
                    break;
                }
            }
        }
        i = end;
    }
}

/* Fills out's row k (COLUMNS doubles) with the metrics of chunk k of a and b (n elements each; flat: the
 * flat index of a[0] in the tensor) and marks in hit the positions holding an element out of tolerance
 * (length positions of inner elements each; length 0: none). narrow: the numpy path works in float32 (see
 * fused.py). max_rel: the smallest rtol known to pass so far. Returns the number of chunks. */
int64_t TD_NAME(td_fused_pass)(const TD_T *a, const TD_T *b, int64_t n, int64_t flat, int64_t chunk,
                               int64_t block, int32_t narrow, double atol, double rtol, double max_rel,
                               int64_t inner, int64_t length, uint8_t *hit, double *out)
{
    int64_t k = 0;
    double max_abs = 0.0;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        int64_t c1 = c0 + chunk < n ? c0 + chunk : n;
        double acc[7] = {0};
        int64_t counts[5] = {0};
        int64_t finite = 0, mn = 0;
        int clean = 1;
        double mean_a = 0.0, mean_b = 0.0, m2_a = 0.0, m2_b = 0.0, c_ab = 0.0;
        for (int64_t b0 = c0; b0 < c1; b0 += block) {
            int64_t b1 = b0 + block < c1 ? b0 + block : c1;
            int64_t big = 0;
            int64_t bn = TD_NAME(sums)(a + b0, b + b0, b1 - b0, acc, &big);
            int failing;
            if (bn < b1 - b0 || (narrow && big)) {
                if (TD_NAME(nonfinite)(a, b, b0, b1, atol, rtol, narrow, counts) || bn < b1 - b0)
                    clean = 0;
                TD_NAME(maxima)(a, b, b0, b1, &max_abs, &max_rel);
                failing = 1; /* (rare) the positions are looked for in every element */
            } else {
                int64_t found[4];
                TD_NAME(decisions)(a + b0, b + b0, b1 - b0, atol, rtol, max_abs, max_rel, found);
                counts[0] += found[0];
                counts[1] += found[1];
                if (found[2] || found[3])
                    TD_NAME(maxima)(a, b, b0, b1, &max_abs, &max_rel);
                failing = found[0] > 0;
            }
            if (length > 0 && failing)
                TD_NAME(mark)(a, b, b0, b1, atol, rtol, flat, inner, length, hit);
            if (bn == 0)
                continue;
            double ma = acc[5] / (double)bn, mb = acc[6] / (double)bn;
            double q[3];
            TD_NAME(centred)(a + b0, b + b0, b1 - b0, ma, mb, q);
            if (mn == 0) {
                mn = bn;
                mean_a = ma;
                mean_b = mb;
                m2_a = q[0];
                m2_b = q[1];
                c_ab = q[2];
            } else { /* Chan's update, as Moments.merge */
                int64_t total = mn + bn;
                double da = ma - mean_a, db = mb - mean_b;
                double w = (double)(mn * bn) / (double)total;
                mean_a = mean_a + da * (double)bn / (double)total;
                mean_b = mean_b + db * (double)bn / (double)total;
                m2_a = m2_a + q[0] + da * da * w;
                m2_b = m2_b + q[1] + db * db * w;
                c_ab = c_ab + q[2] + da * db * w;
                mn = total;
            }
            finite += bn;
        }
        double *row = out + k * COLUMNS;
        row[FINITE] = (double)finite;
        row[MAX_ABS] = max_abs; /* the largest so far (carried, as max_rel) */
        row[MAX_REL] = max_rel;
        for (int j = 0; j < 5; j++)
            row[SUM_ABS + j] = acc[j];
        row[NAN_MISMATCH] = (double)counts[2];
        row[INF_MISMATCH] = (double)counts[3];
        row[FAILED_RULE] = (double)counts[0];
        row[FAILED_EXCESS] = (double)counts[1];
        row[NONFINITE_FAILED] = (double)counts[4];
        row[CLEAN] = clean ? 1.0 : 0.0;
        row[MOMENT_N] = (double)mn;
        row[MEAN_A] = mean_a;
        row[MEAN_B] = mean_b;
        row[M2_A] = m2_a;
        row[M2_B] = m2_b;
        row[C_AB] = c_ab;
        k++;
    }
    return k;
}

#endif
