/* mlp.c — the multi-layer perceptron: linear layers with ReLU between
 * them, the last one giving class logits; layers grouped into recompute
 * segments as the decoder stack groups blocks (decoder.c). A kind and a
 * family of its own. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

typedef struct layer_acts {
    float *pre;  /* (B, out) linear output (the logits for the last layer) */
    float *post; /* (B, out) ReLU output; NULL for the last layer */
} layer_acts;

typedef struct mlp_state {
    int n, K, S;        /* layers, layers per segment, segments */
    int *width;         /* (n + 1) widths: inputs, hidden..., classes */
    float **seg_in;     /* (S) segment inputs; seg_in[0] is the current batch's features */
    layer_acts *slots;  /* (K) */
    float *d_a, *d_b;   /* backward scratch, (B, widest) each */
    int computed_segment;
} mlp_state;

static int widest(const mlp_state *s)
{
    int w = 0;
    for (int i = 0; i <= s->n; i++) w = s->width[i] > w ? s->width[i] : w;
    return w;
}

static bb_status mlp_create(bb_model_t *m)
{
    const bb_model_config *c = &m->cfg;
    if (c->mlp.inputs < 1 || c->mlp.classes < 2 || c->mlp.hidden_count < 0 || c->mlp.hidden_count > BB_MLP_MAX_HIDDEN)
        return bb_fail(BB_ERR_ARG, "mlp needs inputs, at least 2 classes and at most %d hidden layers",
                       BB_MLP_MAX_HIDDEN);
    if (c->precision != BB_PRECISION_FP32)
        return bb_fail(BB_ERR_ARG, "--precision %s stores gpt activations in bf16; the mlp's are a few hundred "
                       "KiB and stay fp32: use --precision fp32", bb_precision_name(c->precision));
    mlp_state *s = m->impl = calloc(1, sizeof *s);
    if (!s) return bb_fail(BB_ERR_NOMEM, "out of memory");
    s->n = c->mlp.hidden_count + 1;
    s->width = malloc((size_t)(s->n + 1) * sizeof *s->width);
    if (!s->width) return bb_fail(BB_ERR_NOMEM, "out of memory");
    s->width[0] = c->mlp.inputs;
    for (int i = 0; i < c->mlp.hidden_count; i++) {
        if (c->mlp.hidden[i] < 1) return bb_fail(BB_ERR_ARG, "--hidden sizes must be positive");
        s->width[i + 1] = c->mlp.hidden[i];
    }
    s->width[s->n] = c->mlp.classes;
    for (int i = 0; i < s->n; i++) {
        char name[64];
        snprintf(name, sizeof name, "fc.%d.weight", i);
        BB_TRY(bb_model_add_tensor(m, name, s->width[i + 1], s->width[i], true));
        m->tensors[m->tensor_count - 1].hidden = i > 0 && i < s->n - 1;
        snprintf(name, sizeof name, "fc.%d.bias", i);
        BB_TRY(bb_model_add_tensor(m, name, s->width[i + 1], 0, false));
    }
    BB_TRY(bb_model_alloc_parameters(m));
    s->K = c->recompute_every > 0 && c->recompute_every < s->n ? c->recompute_every : s->n;
    s->S = (s->n + s->K - 1) / s->K;
    s->seg_in = calloc((size_t)s->S, sizeof *s->seg_in);
    s->slots = calloc((size_t)s->K, sizeof *s->slots);
    if (!s->seg_in || !s->slots) return bb_fail(BB_ERR_NOMEM, "out of memory");
    size_t row = (size_t)widest(s) * m->B * sizeof(float);
    s->seg_in[0] = (float *)m->inputs;
    for (int i = 1; i < s->S; i++)
        BB_TRY(bb_model_alloc_activation(m, (size_t)m->B * s->width[i * s->K] * sizeof(float),
                                         "saved layer inputs", (void **)&s->seg_in[i]));
    for (int k = 0; k < s->K; k++) {
        BB_TRY(bb_model_alloc_activation(m, row, "activations", (void **)&s->slots[k].pre));
        BB_TRY(bb_model_alloc_activation(m, row, "activations", (void **)&s->slots[k].post));
    }
    BB_TRY(bb_model_alloc_activation(m, row, "backward scratch", (void **)&s->d_a));
    BB_TRY(bb_model_alloc_activation(m, row, "backward scratch", (void **)&s->d_b));
    s->computed_segment = -1;
    return BB_OK;
}

static void mlp_destroy(bb_model_t *m)
{
    mlp_state *s = m->impl;
    if (!s) return;
    for (int i = 1; s->seg_in && i < s->S; i++) bb_backend_free(m->be, s->seg_in[i]);
    for (int k = 0; s->slots && k < s->K; k++) {
        bb_backend_free(m->be, s->slots[k].pre);
        bb_backend_free(m->be, s->slots[k].post);
    }
    bb_backend_free(m->be, s->d_a);
    bb_backend_free(m->be, s->d_b);
    free(s->width);
    free(s->seg_in);
    free(s->slots);
    free(s);
}

/* nn.Linear's default: weights and biases uniform in ±1/sqrt(fan_in). */
static bb_status mlp_init(bb_model_t *m, uint64_t seed, float *host)
{
    init_rng r = {seed};
    for (int i = 0; i < m->tensor_count; i++) {
        const bb_tensor_info *t = &m->tensors[i];
        int fan_in = t->rank == 2 ? t->shape[1] : m->tensors[i - 1].shape[1];
        for (size_t j = 0; j < t->count; j++) host[t->offset + j] = bb_init_uniform(&r, 1.0f / sqrtf((float)fan_in));
    }
    return BB_OK;
}

static const float *layer_input(const mlp_state *s, int i)
{
    return i % s->K == 0 ? s->seg_in[i / s->K] : s->slots[i % s->K - 1].post;
}

static bb_status segment_forward(bb_model_t *m, int seg)
{
    mlp_state *s = m->impl;
    int end = (seg + 1) * s->K < s->n ? (seg + 1) * s->K : s->n;
    for (int i = seg * s->K; i < end; i++) {
        layer_acts *a = &s->slots[i % s->K];
        bb_op_linear_forward(m->be, bb_f32(a->pre), bb_f32(layer_input(s, i)), bb_f32(model_param(m, 2 * i)),
                             bb_f32(model_param(m, 2 * i + 1)), m->B, s->width[i], s->width[i + 1], s->width[i + 1]);
        if (i + 1 < s->n) bb_op_activation_forward(m->be, BB_ACTIVATION_RELU, bb_f32(a->post), bb_f32(a->pre),
                                                   (size_t)m->B * s->width[i + 1]);
    }
    s->computed_segment = seg;
    if (seg + 1 < s->S)
        BB_TRY(bb_backend_copy(m->be, s->seg_in[seg + 1], s->slots[(end - 1) % s->K].post,
                               (size_t)m->B * s->width[end] * sizeof(float), BB_COPY_D2D));
    return BB_OK;
}

static bb_status mlp_forward(bb_model_t *m, float normalizer, double *loss, int *correct)
{
    mlp_state *s = m->impl;
    int classes = m->cfg.mlp.classes;
    s->seg_in[0] = (float *)m->inputs; /* the batch buffers alternate (batch.c) */
    for (int seg = 0; seg < s->S; seg++) BB_TRY(segment_forward(m, seg));
    float *logits = s->slots[(s->n - 1) % s->K].pre;
    if (correct) { /* counted on the device: no logits cross to the host */
        *correct = bb_op_count_correct(m->be, bb_f32(logits), m->targets, m->B, classes);
        BB_TRY(bb_backend_synchronize(m->be)); /* a count after a fault is not one */
    }
    if (!loss) {
        s->computed_segment = -1; /* the logits stay logits: no backward */
        return BB_OK;
    }
    bb_op_softmax_crossentropy(m->be, loss, bb_f32(logits), bb_f32(logits), m->targets, m->B, classes, normalizer, NULL);
    return BB_OK;
}

static bb_status mlp_backward(bb_model_t *m, bool acc)
{
    mlp_state *s = m->impl;
    if (s->computed_segment != s->S - 1) return bb_fail(BB_ERR_INTERNAL, "mlp backward without a forward");
    /* dcur: d(loss)/d(this layer's output); the logits slot holds it first. */
    const float *dcur = s->slots[(s->n - 1) % s->K].pre;
    float *scratch[2] = {s->d_a, s->d_b};
    int flip = 0;
    for (int seg = s->S - 1; seg >= 0; seg--) {
        int end = (seg + 1) * s->K < s->n ? (seg + 1) * s->K : s->n;
        if (s->computed_segment != seg) {
            BB_TRY(segment_forward(m, seg));
            m->recomputed_layers += end - seg * s->K;
        }
        for (int i = end - 1; i >= seg * s->K; i--) {
            const layer_acts *a = &s->slots[i % s->K];
            float *dpre = (float *)dcur;
            if (i + 1 < s->n) { /* through the ReLU, in place */
                dpre = scratch[flip];
                bb_op_activation_backward(m->be, BB_ACTIVATION_RELU, bb_f32(dpre), bb_f32(dcur), bb_f32(a->pre),
                                          (size_t)m->B * s->width[i + 1]);
            }
            float *din = i > 0 ? scratch[flip ^ 1] : NULL;
            bb_op_linear_backward(m->be, bb_f32(din), bb_f32(model_grad(m, 2 * i)), bb_f32(model_grad(m, 2 * i + 1)),
                                  bb_f32(dpre), bb_f32(layer_input(s, i)), bb_f32(model_param(m, 2 * i)), m->B,
                                  s->width[i], s->width[i + 1], s->width[i + 1], acc);
            model_grads_ready(m, 2 * i);
            dcur = din;
            flip ^= 1;
        }
    }
    s->computed_segment = -1;
    return BB_OK;
}

static bb_status mlp_logits(bb_model_t *m, int position, float *host)
{
    (void)position; /* one: the example */
    mlp_state *s = m->impl;
    return bb_backend_copy(m->be, host, s->slots[(s->n - 1) % s->K].pre,
                           (size_t)m->B * m->cfg.mlp.classes * sizeof(float), BB_COPY_D2H);
}

/* ---- the kind: configuration, JSON, batches ------------------------------ */
bb_model_config bb_model_mlp_config(int inputs, const int *hidden, int hidden_count, int classes)
{
    bb_model_config c = {.kind = &bb_model_kind_mlp,
                         .mlp = {.inputs = inputs, .classes = classes, .hidden_count = hidden_count}};
    for (int i = 0; i < hidden_count && i < BB_MLP_MAX_HIDDEN; i++) c.mlp.hidden[i] = hidden[i];
    return c;
}

static bb_status mlp_from_flags(const bb_model_flags *f, bb_model_config *out)
{
    const char *flag;
    if (f->layers_given || f->heads_given || f->d_model_given || bb_model_flags_llama_given(f, &flag))
        return bb_fail(BB_ERR_ARG, "--layers, --heads, --d-model and the llama flags shape a decoder; an mlp takes "
                       "--hidden");
    int sizes[BB_MLP_MAX_HIDDEN] = {1024, 1024}, n = f->hidden_count ? 0 : 2;
    for (int i = 0; i < f->hidden_count; i++) {
        /* "1024,512" and "1024 512" both work */
        for (const char *p = f->hidden[i]; *p;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 1 || v > 1 << 20 || n == BB_MLP_MAX_HIDDEN)
                return bb_fail(BB_ERR_ARG, "--hidden: '%s' is not a list of at most %d sizes >= 1", f->hidden[i],
                               BB_MLP_MAX_HIDDEN);
            sizes[n++] = (int)v;
            p = *end == ',' ? end + 1 : end;
            if (*end && *end != ',') return bb_fail(BB_ERR_ARG, "--hidden: bad size list '%s'", f->hidden[i]);
        }
    }
    *out = bb_model_mlp_config(0, sizes, n, 0);
    return BB_OK;
}

static bb_status mlp_from_data(bb_model_config *c, const bb_record_format *f, const char *path)
{
    if (f->kind != BB_RECORD_IMAGE_U8)
        return bb_fail(BB_ERR_ARG, "%s holds %s records; --model mlp needs image records", path,
                       bb_record_kind_name(f->kind));
    c->mlp.inputs = (int)f->record_size - 1;
    c->mlp.classes = (int)f->classes_or_vocab;
    return BB_OK;
}

static void mlp_describe(const bb_model_config *c, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "mlp (%d", c->mlp.inputs);
    for (int i = 0; i < c->mlp.hidden_count && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "-%d", c->mlp.hidden[i]);
    if (n < cap) snprintf(buf + n, cap - n, "-%d)", c->mlp.classes);
}

static bool mlp_same_shape(const bb_model_config *a, const bb_model_config *b)
{
    const bb_mlp_config *x = &a->mlp, *y = &b->mlp;
    if (x->inputs != y->inputs || x->classes != y->classes || x->hidden_count != y->hidden_count) return false;
    for (int i = 0; i < x->hidden_count; i++)
        if (x->hidden[i] != y->hidden[i]) return false;
    return true;
}

static int mlp_layers(const bb_model_config *c) { return c->mlp.hidden_count + 1; }
static int mlp_layer_tensor(const bb_model_t *m, int l) { return (void)m, 2 * l; } /* weight, bias */
static int mlp_one(const bb_model_config *c) { return (void)c, 1; }
static int mlp_outputs(const bb_model_config *c) { return c->mlp.classes; }
static int mlp_inputs(const bb_model_config *c) { return c->mlp.inputs; }

static int mlp_to_json(json_t *obj, const bb_model_config *c)
{
    char hidden[256] = "";
    for (int i = 0; i < c->mlp.hidden_count; i++)
        snprintf(hidden + strlen(hidden), sizeof hidden - strlen(hidden), "%s%d", i ? "," : "", c->mlp.hidden[i]);
    return json_object_update_new(obj, json_pack("{s:i, s:i, s:s}", "inputs", c->mlp.inputs, "classes", c->mlp.classes,
                                                 "hidden", hidden));
}

static bb_status mlp_from_json(const json_t *obj, const char *file, bb_model_config *c)
{
    char hidden[256];
    BB_TRY(bb_json_req_int(obj, file, "inputs", &c->mlp.inputs));
    BB_TRY(bb_json_req_int(obj, file, "classes", &c->mlp.classes));
    BB_TRY(bb_json_req_string(obj, file, "hidden", hidden, sizeof hidden));
    c->mlp.hidden_count = 0;
    for (char *p = hidden; *p && c->mlp.hidden_count < BB_MLP_MAX_HIDDEN; c->mlp.hidden_count++) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 20) || (*end && *end != ','))
            return bb_fail(BB_ERR_FORMAT, "%s: \"hidden\" is \"%s\", not sizes like 1024,1024", file, hidden);
        c->mlp.hidden[c->mlp.hidden_count] = (int)v;
        p = *end ? end + 1 : end;
    }
    return BB_OK;
}

/* a label, then the pixels */
static size_t mlp_record_bytes(const bb_model_config *c) { return (size_t)c->mlp.inputs + 1; }

static bb_status mlp_check_records(const bb_model_config *c, const bb_record_format *f, const uint8_t *records,
                                   int count, int *width)
{
    size_t pixels = f->record_size - 1;
    *width = 1;
    if (f->kind != BB_RECORD_IMAGE_U8 || pixels != (size_t)c->mlp.inputs)
        return bb_fail(BB_ERR_ARG, "mlp with %d inputs cannot take %s records of %zu pixels", c->mlp.inputs,
                       bb_record_kind_name(f->kind), pixels);
    for (int b = 0; b < count; b++) {
        uint8_t label = records[(size_t)b * f->record_size];
        if (label >= c->mlp.classes) return bb_fail(BB_ERR_ARG, "label %u is not below %d classes", label, c->mlp.classes);
    }
    return BB_OK;
}

static void mlp_convert(bb_model_t *m, void *inputs, int32_t *targets, const uint8_t *records, int count, int width)
{
    (void)width;
    bb_op_records_to_images(m->be, bb_f32(inputs), targets, records, count, m->B, m->cfg.mlp.inputs);
}

static const bb_model_family mlp_family = {
    .layers = mlp_layers,
    .layer_tensor = mlp_layer_tensor,
    .targets_per_example = mlp_one,
    .outputs = mlp_outputs,
    .counts_correct = true,
    .inputs_per_example = mlp_inputs,
    .input_size = sizeof(float),
    .input_name = "features",
    .record_bytes = mlp_record_bytes,
    .check_records = mlp_check_records,
    .convert = mlp_convert,
    .create = mlp_create,
    .init = mlp_init,
    .forward = mlp_forward,
    .logits = mlp_logits,
    .backward = mlp_backward,
    .destroy = mlp_destroy,
};

const bb_model_kind bb_model_kind_mlp = {
    .name = "mlp",
    .takes = "images",
    .from_flags = mlp_from_flags,
    .from_data = mlp_from_data,
    .describe = mlp_describe,
    .same_shape = mlp_same_shape,
    .to_json = mlp_to_json,
    .from_json = mlp_from_json,
    .family = &mlp_family,
};
