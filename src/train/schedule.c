/* schedule.c — what data each step takes: the order (its version and
 * window, a global shuffle when the data fits --shuffle-memory), the
 * loader that delivers it from where the run starts, and, under
 * --global-batch ramp:... or auto, how many chunks of the loader each step
 * takes (trainer.h). */
#include <math.h>

#include "trainer.h"

#define NAME(field) bb_train_option_name(o, BB_TRAIN_##field)

/* The data order: a resumed run's as it was (its window, and version 1
 * when its checkpoint names none); a new run's balanced windows, or one
 * window of every frame (a global shuffle) when no window was asked for
 * and the decompressed data fits --shuffle-memory. */
void bb_trainer_choose_order(trainer *t)
{
    const bb_train_options *o = t->o;
    t->order = t->resume ? (t->resume->order ? t->resume->order : BB_ORDER_FIXED_WINDOWS)
                         : (o->order ? o->order : BB_ORDER_CURRENT);
    t->shuffle_frames = bb_shuffle_frames_or_default(o->shuffle_frames);
    uint32_t frames = bb_sampler_frame_count_of(t->data);
    uint64_t bytes = bb_dataset_record_count(t->data) * bb_dataset_meta(t->data)->record_size;
    if (!t->resume && !(o->set & BB_TRAIN_SET(BB_TRAIN_SHUFFLE_FRAMES)) && bytes <= o->shuffle_memory && frames)
        t->shuffle_frames = frames;
}

void bb_trainer_follow_noise(trainer *t, double noise)
{
    t->auto_chunks += (uint64_t)t->auto_accumulation;
    double chunk = (double)trainer_world_devices(t) * t->micro_batch, want = ceil(noise / chunk);
    if (!isfinite(want)) return; /* not measured yet */
    if (want > t->accumulation) want = t->accumulation;
    if (want > t->auto_accumulation) t->auto_accumulation = (int)want;
}

uint64_t bb_trainer_chunks_before(const trainer *t, uint64_t step)
{
    if (t->auto_batch) return t->auto_chunks;
    uint64_t chunks = 0, ramping = step < t->ramp_steps ? step : t->ramp_steps;
    for (uint64_t s = 0; s < ramping; s++) chunks += (uint64_t)trainer_accumulation_at(t, s);
    return chunks + (step - ramping) * (uint64_t)t->accumulation;
}

/* --global-batch ramp:B0..B1[:STEPS]: B0 in whole micro-steps, a stage of
 * ZeRO that reduces per step, the steps it spans, the loader's chunks and
 * (with --epochs) the run's length. */
bb_status bb_trainer_setup_ramp(trainer *t, uint64_t records)
{
    const bb_train_options *o = t->o;
    int chunk = trainer_world_devices(t) * t->micro_batch;
    int from = o->ramp_from;
    if (o->auto_batch && !from) from = chunk * (trainer_world_devices(t) > 1 ? 1 : 2);
    if (o->auto_batch && trainer_world_devices(t) == 1 && from < 2 * chunk)
        return bb_fail(BB_ERR_ARG, "%s auto measures the noise scale from two batch sizes, and one device has a "
                       "smaller batch only with micro-steps: start at B0 >= %d (two micro-batches of %d), or train on "
                       "more devices", NAME(GLOBAL_BATCH), 2 * chunk, t->micro_batch);
    if (from >= t->global_batch)
        return bb_fail(BB_ERR_ARG, "%s: B0 %d must be below B1 %d", NAME(GLOBAL_BATCH), from, t->global_batch);
    if (from % chunk)
        return bb_fail(BB_ERR_ARG, "%s %s:%d..%d: B0 %d is not a whole number of micro-batches of %d on %d "
                       "device%s (a multiple of %d)", NAME(GLOBAL_BATCH), o->auto_batch ? "auto" : "ramp", from,
                       t->global_batch, from,
                       t->micro_batch, trainer_world_devices(t), trainer_world_devices(t) > 1 ? "s" : "", chunk);
    if (t->zero >= 2)
        return bb_fail(BB_ERR_ARG, "%s %s: ZeRO-%d reduces every micro-step into shards in rounds of a fixed "
                       "count: vary the batch with %s 0 or 1", NAME(GLOBAL_BATCH), o->auto_batch ? "auto" : "ramp",
                       t->zero, NAME(ZERO));
    t->ramp_accumulation = from / chunk;
    t->chunks_per_epoch = records / (uint64_t)chunk;
    if (o->auto_batch) {
        if (!o->steps)
            return bb_fail(BB_ERR_ARG, "%s auto: the steps' batches follow the run, so %s cannot count them: give "
                           "%s", NAME(GLOBAL_BATCH), NAME(EPOCHS), NAME(STEPS));
        t->auto_batch = true;
        t->ramp_steps = 0;
        t->auto_accumulation = t->resume ? t->resume->auto_accumulation : t->ramp_accumulation;
        t->auto_chunks = t->resume ? t->resume->auto_chunks : 0;
        return BB_OK;
    }
    if (!o->ramp_steps && !o->steps)
        return bb_fail(BB_ERR_ARG, "%s ramp:%d..%d spans the run's %s, and %s sets none: give ramp:%d..%d:STEPS",
                       NAME(GLOBAL_BATCH), o->ramp_from, o->global_batch, NAME(STEPS), NAME(EPOCHS), o->ramp_from,
                       o->global_batch);
    t->ramp_steps = o->ramp_steps ? o->ramp_steps : o->steps;
    if (o->steps) return BB_OK;
    uint64_t chunks = o->epochs * t->chunks_per_epoch, used = 0, steps = 0; /* the whole steps in --epochs */
    for (; steps < t->ramp_steps && used + (uint64_t)trainer_accumulation_at(t, steps) <= chunks; steps++)
        used += (uint64_t)trainer_accumulation_at(t, steps);
    if (steps == t->ramp_steps) steps += (chunks - used) / (uint64_t)t->accumulation;
    t->total_steps = steps;
    if (!steps)
        return bb_fail(BB_ERR_ARG, "%s %llu hold no step of the ramp", NAME(EPOCHS), (unsigned long long)o->epochs);
    return BB_OK;
}

bb_status bb_trainer_start_loader(trainer *t)
{
    bb_loader_options lo;
    bb_loader_training_options(t->spec.count, t->micro_batch, t->o->loader_threads, &lo);
    if (!bb_backend_host_is_device(t->replicas[0].be)) { /* slots in pinned memory: uploads run at full speed */
        lo.host_alloc = bb_backend_slot_alloc;
        lo.host_free = bb_backend_slot_free;
        lo.host_ctx = t->replicas[0].be;
    }
    lo.seed = t->seed;
    lo.world_devices = (uint32_t)trainer_world_devices(t); /* this process reads its own devices' records */
    lo.first_device = (uint32_t)(t->spec.rank * t->spec.count);
    lo.accumulation = (uint32_t)t->accumulation;
    lo.io = t->o->io;
    lo.direct = t->o->direct;
    lo.shuffle_frames = t->shuffle_frames;
    lo.order = t->order;
    lo.start_epoch = t->first_step / t->steps_per_epoch;
    lo.start_step = t->first_step % t->steps_per_epoch;
    lo.steps = t->total_steps - t->first_step;
    if (t->ramp_accumulation) { /* a ramp: the loader's steps are chunks, a step takes as many as its micro-steps */
        uint64_t first = bb_trainer_chunks_before(t, t->first_step);
        lo.accumulation = 1;
        lo.start_epoch = first / t->chunks_per_epoch;
        lo.start_step = first % t->chunks_per_epoch;
        lo.steps = t->auto_batch ? 0 : bb_trainer_chunks_before(t, t->total_steps) - first; /* auto: until the end */
    }
    return bb_loader_create(t->data, &lo, &t->loader);
}
