/* noise_scale.c — the gradient noise scale's running estimate (train.h). */
#include <math.h>

#include "bigbatch/train.h"

bool bb_noise_scale_add(bb_noise_scale *n, double small_sq, double b_small, double big_sq, double b_big)
{
    if (!isfinite(small_sq) || !isfinite(big_sq) || !(b_small > 0) || !(b_big > b_small)) return false;
    double g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small);
    double trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big);
    n->g2 = BB_NOISE_EMA * n->g2 + (1.0 - BB_NOISE_EMA) * g2;
    n->trace = BB_NOISE_EMA * n->trace + (1.0 - BB_NOISE_EMA) * trace;
    n->steps++;
    return true;
}

double bb_noise_scale_value(const bb_noise_scale *n)
{
    return n->steps && n->g2 > 0 && n->trace > 0 ? n->trace / n->g2 : NAN;
}
