/* optimizer.h — private (src/train, and the planner, which counts the
 * state): one replica's optimizer state, the step that clips the
 * gradients and updates the parameters, and the state file.
 *
 * How to use:
 *   bb_optimizer o;
 *   BB_TRY(bb_optimizer_create(be, &cfg, bb_model_param_count(m), &o));
 *   double lr, norm = bb_optimizer_step(be, m, &o, step, total, &lr);
 *   bb_optimizer_destroy(be, &o);
 */
#ifndef BIGBATCH_TRAIN_OPTIMIZER_H
#define BIGBATCH_TRAIN_OPTIMIZER_H

#include "bigbatch/train.h"

/* One replica's optimizer: AdamW moments (m, v) or the SGD momentum (m). */
typedef struct bb_optimizer {
    bb_optimizer_config cfg;
    float *m, *v;  /* device memory, param_count floats; v NULL for SGD */
    size_t count;
} bb_optimizer;

bb_status bb_optimizer_create(bb_backend_t *be, const bb_optimizer_config *c, size_t count, bb_optimizer *o);
void bb_optimizer_destroy(bb_backend_t *be, bb_optimizer *o);
/* Clips the gradients to cfg.grad_clip (when set) and updates the
 * parameters for step `step` (0-based) of `total`. Returns the gradient
 * norm before clipping; *lr gets the rate used. A norm that is not finite
 * (NaN or infinite gradients) leaves the parameters and the optimizer
 * state untouched. */
double bb_optimizer_step(bb_backend_t *be, bb_model_t *m, bb_optimizer *o, uint64_t step, uint64_t total, double *lr);
/* optimizer.bin: magic, buffer count, float count, XXH64 of the floats, then
 * the floats. Load fails with BB_ERR_FORMAT/BB_ERR_CORRUPT naming the file. */
bb_status bb_optimizer_save(bb_backend_t *be, const bb_optimizer *o, const char *path);
bb_status bb_optimizer_load(bb_backend_t *be, bb_optimizer *o, const char *path);

#endif
