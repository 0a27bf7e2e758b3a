/* model.c — what every model shares: the kind table, configuration, the
 * parameter table and buffers, initialisation, and the entry points, which
 * call the kind's family (decoder.c for the gpt, mlp.c; batches are in
 * batch.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"

/* ---- the kind table ------------------------------------------------------ */
static const bb_model_kind *const kinds[] = {&bb_model_kind_gpt, &bb_model_kind_llama, &bb_model_kind_mlp};
enum { KINDS = sizeof kinds / sizeof *kinds };

const bb_model_kind *bb_model_kind_find(const char *name)
{
    for (int i = 0; i < KINDS; i++)
        if (!strcmp(kinds[i]->name, name)) return kinds[i];
    return NULL;
}

const char *bb_model_kind_name(const bb_model_kind *k) { return k ? k->name : "(no kind)"; }

const bb_model_kind *bb_model_kind_of_hf(const char *model_type)
{
    for (int i = 0; i < KINDS; i++)
        if (kinds[i]->hf && !strcmp(kinds[i]->hf->model_type, model_type)) return kinds[i];
    return NULL;
}

const char *bb_model_hf_types(void)
{
    static char text[160];
    if (*text) return text; /* made once */
    for (int i = 0, n = 0; i < KINDS; i++)
        if (kinds[i]->hf)
            n += snprintf(text + n, sizeof text - (size_t)n, "%s%s (%s)", n ? ", " : "", kinds[i]->hf->model_type,
                          kinds[i]->hf->architecture);
    return text;
}

/* The first call fills the text; later ones read it. */
const char *bb_model_kind_choices(void)
{
    static char text[128];
    if (!text[0])
        for (int i = 0; i < KINDS; i++) bb_list_add(text, sizeof text, i, KINDS, kinds[i]->name, NULL);
    return text;
}

const char *bb_model_kind_help(void)
{
    static char text[256];
    if (!text[0])
        for (int i = 0; i < KINDS; i++) bb_list_add(text, sizeof text, i, KINDS, kinds[i]->name, kinds[i]->takes);
    return text;
}

bb_status bb_model_config_from_flags(const char *kind, const bb_model_flags *f, bb_model_config *out)
{
    const bb_model_kind *k = bb_model_kind_find(kind);
    if (!k) return bb_fail(BB_ERR_ARG, "--model: '%s' is not one of %s", kind, bb_model_kind_choices());
    BB_TRY(k->from_flags(f, out));
    out->kind = k;
    return BB_OK;
}

bb_status bb_model_config_from_data(bb_model_config *c, const bb_record_format *f, const char *path)
{
    if (!c->kind) return bb_fail(BB_ERR_ARG, "no model kind given");
    return c->kind->from_data(c, f, path);
}

void bb_model_recompute_name(const bb_model_config *c, char *buf, size_t cap)
{
    int layers = bb_model_layers(c), every = c->recompute_every;
    size_t n = strnlen(c->recompute_plan, sizeof c->recompute_plan);
    bool uniform = n > 0;
    for (size_t i = 1; i < n; i++) uniform = uniform && c->recompute_plan[i] == c->recompute_plan[0];
    if (uniform) { /* one policy for every block: its own name */
        char p = c->recompute_plan[0];
        snprintf(buf, cap, "%s", p == BB_RECOMPUTE_NONE        ? "none"
                                 : p == BB_RECOMPUTE_SELECTIVE ? "selective"
                                 : p == BB_RECOMPUTE_OFFLOAD   ? "offload"
                                                               : "blocks");
        return;
    }
    if (n) {
        size_t used = (size_t)snprintf(buf, cap, "plan:");
        for (size_t i = 0; i < n && used < cap;) {
            size_t run = 1;
            while (i + run < n && c->recompute_plan[i + run] == c->recompute_plan[i]) run++;
            const char *comma = i ? "," : "";
            char p = c->recompute_plan[i];
            used += (size_t)(run > 1 ? snprintf(buf + used, cap - used, "%s%c*%zu", comma, p, run)
                                     : snprintf(buf + used, cap - used, "%s%c", comma, p));
            i += run;
        }
        return;
    }
    if (every == 0 || every >= layers) snprintf(buf, cap, "none");
    else if (every == 1) snprintf(buf, cap, "blocks");
    else snprintf(buf, cap, "every:%d", every);
}

void bb_model_describe(const bb_model_config *c, char *buf, size_t cap)
{
    if (c->kind) c->kind->describe(c, buf, cap);
    else snprintf(buf, cap, "(no model kind)");
}

void bb_model_config_take_shape(bb_model_config *c, const bb_model_config *from)
{
    bb_model_config own = *c;
    *c = *from;
    c->recompute_every = own.recompute_every;
    memcpy(c->recompute_plan, own.recompute_plan, sizeof c->recompute_plan);
    c->precision = own.precision;
    c->loss_chunk = own.loss_chunk;
}

bool bb_model_same_shape(const bb_model_config *a, const bb_model_config *b)
{
    return a->kind == b->kind && a->kind && a->kind->same_shape(a, b);
}

int bb_model_layers(const bb_model_config *c) { return c->kind->family->layers(c); }
int bb_model_targets_per_example(const bb_model_config *c) { return c->kind->family->targets_per_example(c); }
int bb_model_outputs(const bb_model_config *c) { return c->kind->family->outputs(c); }
bool bb_model_targets_are_tokens(const bb_model_config *c) { return c->kind->family->targets_are_tokens; }
bool bb_model_counts_correct(const bb_model_config *c) { return c->kind->family->counts_correct; }
bool bb_model_chunks_loss(const bb_model_config *c) { return c->kind->family->chunks_loss; }
const char *bb_model_tied_head(const bb_model_config *c)
{
    return c->kind->decoder ? c->kind->decoder->tied_head(c) : NULL;
}

bb_status bb_model_config_to_json(json_t *obj, const bb_model_config *c)
{
    if (json_object_set_new(obj, "model", json_string(c->kind->name)) || c->kind->to_json(obj, c))
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    return BB_OK;
}

bb_status bb_model_config_from_json(const json_t *obj, const char *file, bb_model_config *c)
{
    char name[32];
    BB_TRY(bb_json_req_string(obj, file, "model", name, sizeof name));
    if (!(c->kind = bb_model_kind_find(name)))
        return bb_fail(BB_ERR_FORMAT, "%s: \"model\" is %s, not a model kind", file, name);
    return c->kind->from_json(obj, file, c);
}

/* One item of plan:P, "s" or "selective*3": its letter and count. */
static bb_status parse_plan_item(const char *item, size_t len, char *letter, long *count)
{
    static const char *const names[][2] = {{"n", "none"}, {"s", "selective"}, {"f", "full"}, {"o", "offload"}};
    const char *star = memchr(item, '*', len);
    size_t name_len = star ? (size_t)(star - item) : len;
    *letter = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names && !*letter; i++)
        for (int k = 0; k < 2; k++)
            if (strlen(names[i][k]) == name_len && !strncmp(item, names[i][k], name_len)) *letter = names[i][0][0];
    *count = 1;
    if (star) {
        char digits[16] = "", *end;
        size_t n = len - name_len - 1;
        if (n == 0 || n >= sizeof digits) *count = 0;
        else memcpy(digits, star + 1, n), *count = strtol(digits, &end, 10), *count = *end ? 0 : *count;
    }
    if (!*letter || *count < 1 || *count > BB_RECOMPUTE_MAX_BLOCKS)
        return bb_fail(BB_ERR_ARG, "--checkpoint plan: '%.*s' is not a block policy: n|none, s|selective, "
                       "f|full or o|offload, optionally repeated (s*6)", (int)len, item);
    return BB_OK;
}

bb_status bb_model_parse_recompute(const char *s, bb_model_config *c)
{
    c->recompute_every = 0;
    c->recompute_plan[0] = 0;
    if (!strcmp(s, "none")) return BB_OK;
    if (!strcmp(s, "blocks")) {
        c->recompute_every = 1;
    } else if (!strcmp(s, "selective") || !strcmp(s, "offload")) {
        snprintf(c->recompute_plan, sizeof c->recompute_plan, "%c", s[0] == 's' ? BB_RECOMPUTE_SELECTIVE : BB_RECOMPUTE_OFFLOAD);
    } else if (!strncmp(s, "every:", 6)) {
        char *end;
        long k = strtol(s + 6, &end, 10);
        if (*end || k < 1 || k > 1 << 20)
            return bb_fail(BB_ERR_ARG, "--checkpoint every:K needs a whole K >= 1, not '%s'", s + 6);
        c->recompute_every = (int)k;
    } else if (!strncmp(s, "plan:", 5)) {
        size_t n = 0;
        for (const char *p = s + 5;;) {
            size_t len = strcspn(p, ",");
            char letter;
            long count;
            BB_TRY(parse_plan_item(p, len, &letter, &count));
            if (n + (size_t)count > BB_RECOMPUTE_MAX_BLOCKS)
                return bb_fail(BB_ERR_ARG, "--checkpoint %s names more than %d blocks", s, BB_RECOMPUTE_MAX_BLOCKS);
            memset(c->recompute_plan + n, letter, (size_t)count);
            n += (size_t)count;
            if (!p[len]) break;
            p += len + 1;
        }
        c->recompute_plan[n] = 0;
    } else {
        return bb_fail(BB_ERR_ARG, "--checkpoint: '%s' is not one of none, selective, offload, blocks, every:K, "
                       "plan:P (e.g. plan:n,s,f,o)", s);
    }
    return BB_OK;
}

bb_status bb_model_check_recompute(const bb_model_config *c)
{
    if (c->recompute_every < 0) return bb_fail(BB_ERR_ARG, "recompute segment size must be >= 0");
    size_t n = strnlen(c->recompute_plan, sizeof c->recompute_plan);
    if (!n) return BB_OK;
    char name[BB_RECOMPUTE_NAME_MAX];
    bb_model_recompute_name(c, name, sizeof name);
    if (!c->kind->family->recompute_plans)
        return bb_fail(BB_ERR_ARG, "--checkpoint %s: a %s takes none, blocks or every:K", name, c->kind->name);
    for (size_t i = 0; i < n; i++)
        if (!strchr("nsfo", c->recompute_plan[i]))
            return bb_fail(BB_ERR_ARG, "--checkpoint: block %zu has policy '%c', not n, s, f or o", i,
                           c->recompute_plan[i]);
    int layers = bb_model_layers(c);
    if (n > 1 && n != (size_t)layers)
        return bb_fail(BB_ERR_ARG, "--checkpoint %s gives %zu blocks; this %s has %d", name, n, c->kind->name, layers);
    return BB_OK;
}

bb_status bb_model_block_costs(const bb_model_config *c, int micro_batch, bb_block_costs *out)
{
    memset(out, 0, sizeof *out);
    if (!c->kind || !c->kind->family->block_costs)
        return bb_fail(BB_ERR_UNSUPPORTED, "a %s takes no per-block recompute plan",
                       c->kind ? c->kind->name : "model");
    c->kind->family->block_costs(c, micro_batch, out);
    return BB_OK;
}

char bb_model_block_recompute(const bb_model_config *c, int l)
{
    size_t n = strnlen(c->recompute_plan, sizeof c->recompute_plan);
    if (n) return c->recompute_plan[n == 1 ? 0 : l];
    int every = c->recompute_every;
    return every == 0 || every >= bb_model_layers(c) ? BB_RECOMPUTE_NONE : BB_RECOMPUTE_FULL;
}

/* ---- initialisation streams (bb_splitmix64) ---------------------------- */
static double next_unit(init_rng *r) { return ((bb_splitmix64(&r->state) >> 11) + 0.5) / 9007199254740992.0; }

float bb_init_normal(init_rng *r, float std)
{
    double u1 = next_unit(r), u2 = next_unit(r); /* Box-Muller */
    return (float)(std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

float bb_init_uniform(init_rng *r, float bound) { return (float)((2.0 * next_unit(r) - 1.0) * bound); }

/* ---- the parameter table ----------------------------------------------- */
bb_status bb_model_add_tensor(bb_model_t *m, const char *name, int rows, int cols, bool decay)
{
    if (m->tensor_count == m->tensor_capacity) {
        int cap = m->tensor_capacity ? 2 * m->tensor_capacity : 32;
        bb_tensor_info *t = realloc(m->tensors, (size_t)cap * sizeof *t);
        if (!t) return bb_fail(BB_ERR_NOMEM, "out of memory");
        m->tensors = t;
        m->tensor_capacity = cap;
    }
    bb_tensor_info *t = &m->tensors[m->tensor_count++];
    *t = (bb_tensor_info){.offset = m->param_count, .count = (size_t)rows * (cols ? cols : 1),
                          .rank = cols ? 2 : 1, .shape = {rows, cols}, .decay = decay};
    snprintf(t->name, sizeof t->name, "%s", name);
    m->param_count += t->count;
    return BB_OK;
}

bb_status bb_model_alloc_parameters(bb_model_t *m)
{
    size_t bytes = m->param_count * sizeof(float);
    if (m->cfg.param_window_bytes) {
        BB_TRY(bb_param_window_alloc(m));
    } else {
        BB_TRY(bb_backend_alloc(m->be, bytes, "parameters", (void **)&m->params));
        if (m->cfg.precision == BB_PRECISION_BF16)
            BB_TRY(bb_backend_alloc(m->be, m->param_count * sizeof(uint16_t), "parameters (bf16 copy)",
                                    (void **)&m->params16));
    }
    m->weights_stale = true;
    if (m->cfg.grad_window_bytes) {
        BB_TRY(bb_grad_window_alloc(m));
    } else {
        BB_TRY(bb_backend_alloc(m->be, bytes, "gradients", (void **)&m->grads));
        BB_TRY(bb_backend_memset(m->be, m->grads, 0, bytes));
    }
    return bb_model_alloc_batches(m);
}

bb_status bb_model_alloc_activation(bb_model_t *m, size_t bytes, const char *what, void **out)
{
    BB_TRY(bb_backend_alloc(m->be, bytes, what, out));
    m->activation_bytes += bytes;
    return BB_OK;
}

bb_status bb_model_create(bb_backend_t *be, const bb_model_config *cfg, int micro_batch, bb_model_t **out)
{
    *out = NULL;
    if (micro_batch < 1) return bb_fail(BB_ERR_ARG, "--micro-batch must be at least 1");
    bb_model_t *m = calloc(1, sizeof *m);
    if (!m) return bb_fail(BB_ERR_NOMEM, "out of memory");
    m->be = be;
    m->cfg = *cfg;
    m->B = micro_batch;
    bb_status rc;
    if (!m->cfg.kind) {
        free(m);
        return bb_fail(BB_ERR_ARG, "no model kind given");
    }
    BB_TRY_GOTO(bb_model_check_recompute(&m->cfg), rc, fail);
    BB_TRY_GOTO(m->cfg.kind->family->create(m), rc, fail);
    /* The ops' own scratch, sized now so that no op allocates mid-step: rows
     * up to the batch's, column sums as wide as the widest vector
     * parameter (biases and norms). */
    size_t widest = 0;
    for (int i = 0; i < m->tensor_count; i++)
        if (m->tensors[i].rank == 1 && m->tensors[i].count > widest) widest = m->tensors[i].count;
    BB_TRY_GOTO(bb_backend_reserve_scratch(be, (size_t)bb_model_batch_rows(m), widest), rc, fail);
    *out = m;
    return BB_OK;
fail:
    bb_model_destroy(m);
    return rc;
}

void bb_model_destroy(bb_model_t *m)
{
    if (!m) return;
    if (m->cfg.kind && m->cfg.kind->family->destroy) m->cfg.kind->family->destroy(m);
    bb_backend_free(m->be, m->params);
    bb_backend_free(m->be, m->params16);
    bb_backend_free(m->be, m->grads);
    bb_grad_window_free(m);
    bb_param_window_free(m);
    bb_model_free_batches(m);
    free(m->tensors);
    free(m);
}

bb_status bb_model_scaled(const bb_model_config *c, int k, bb_model_config *out)
{
    if (!c->kind || !c->kind->scaled)
        return bb_fail(BB_ERR_UNSUPPORTED, "a %s has no shape family to scale (a gpt or a llama has)",
                       c->kind ? c->kind->name : "model of no kind");
    if (k < 1) return bb_fail(BB_ERR_ARG, "member %d of a shape family: members count from 1", k);
    c->kind->scaled(c, k, out);
    return BB_OK;
}

const bb_model_config *bb_model_get_config(const bb_model_t *m) { return &m->cfg; }
int bb_model_micro_batch(const bb_model_t *m) { return m->B; }
size_t bb_model_param_count(const bb_model_t *m) { return m->param_count; }
int bb_model_tensor_count(const bb_model_t *m) { return m->tensor_count; }
const bb_tensor_info *bb_model_tensor(const bb_model_t *m, int i) { return &m->tensors[i]; }
float *bb_model_params(bb_model_t *m)
{
    m->weights_stale = true; /* the caller may write them */
    return m->params;
}
void bb_model_weights_changed(bb_model_t *m)
{
    m->weights_stale = true;
    bb_param_window_invalidate(m);
}
uint64_t bb_model_parameter_bytes(const bb_model_t *m)
{
    if (m->pwindow) return bb_param_window_bytes(m);
    return (uint64_t)m->param_count * (sizeof(float) + (m->params16 ? sizeof(uint16_t) : 0));
}

void bb_model_lend_host_weights(bb_model_t *m, float *host)
{
    if (m->pwindow) m->host_weights = host;
}

static bb_status no_whole_weights(const bb_model_t *m)
{
    return bb_fail(BB_ERR_UNSUPPORTED, "the %s's weights are sharded (ZeRO-3): it has no whole copy to read or write "
                   "(lend one: bb_model_lend_host_weights)", m->cfg.kind->name);
}

bb_status bb_model_weights_in(bb_model_t *m, size_t offset, const void *host, size_t n)
{
    m->weights_stale = true;
    bb_param_window_invalidate(m);
    if (!m->pwindow) return bb_backend_copy(m->be, m->params + offset, host, n * sizeof(float), BB_COPY_H2D);
    if (!m->host_weights) return no_whole_weights(m);
    memcpy(m->host_weights + offset, host, n * sizeof(float));
    return BB_OK;
}

bb_status bb_model_weights_out(bb_model_t *m, float *host, size_t offset, size_t n)
{
    if (!m->pwindow) return bb_backend_copy(m->be, host, m->params + offset, n * sizeof *host, BB_COPY_D2H);
    if (!m->host_weights) return no_whole_weights(m);
    memcpy(host, m->host_weights + offset, n * sizeof *host);
    return BB_OK;
}
float *bb_model_grads(bb_model_t *m) { return m->grads; }
int bb_model_batch_targets(const bb_model_t *m) { return m->targets_valid; }
uint64_t bb_model_activation_bytes(const bb_model_t *m) { return m->activation_bytes; }
uint64_t bb_model_host_activation_bytes(const bb_model_t *m) { return m->host_activation_bytes; }
void bb_model_recompute_counts(const bb_model_t *m, int *layers, int *selective)
{
    *layers = m->recomputed_layers;
    *selective = m->selective_recomputes;
}

bb_status bb_model_init(bb_model_t *m, uint64_t seed)
{
    float *host = malloc(m->param_count * sizeof *host);
    if (!host) return bb_fail(BB_ERR_NOMEM, "out of memory for %zu parameters", m->param_count);
    bb_status rc = m->cfg.kind->family->init(m, seed, host);
    if (rc == BB_OK) rc = bb_model_weights_in(m, 0, host, m->param_count);
    free(host);
    return rc;
}

/* bf16: the products' weights from the parameters, when these changed. */
static void refresh_weights(bb_model_t *m)
{
    if (!m->params16 || !m->weights_stale) return;
    bb_op_convert(m->be, bb_bf16(m->params16), bb_f32(m->params), m->param_count);
    m->weights_stale = false;
}

bb_status bb_model_forward(bb_model_t *m, float normalizer, double *loss, int *correct)
{
    if (!(normalizer > 0)) return bb_fail(BB_ERR_ARG, "the loss normalizer must be positive");
    if (correct) *correct = -1;
    m->recomputed_layers = m->selective_recomputes = 0;
    refresh_weights(m);
    bb_param_window_start(m, -1);
    bb_status rc = m->cfg.kind->family->forward(m, normalizer, loss, correct);
    return rc != BB_OK ? rc : bb_param_window_check(m);
}

bb_status bb_model_backward(bb_model_t *m, bool accumulate)
{
    if (m->window) bb_grad_window_start(m), accumulate = false; /* each micro-step's own: the reducer adds them */
    bb_param_window_start(m, 1);
    BB_TRY(m->cfg.kind->family->backward(m, accumulate));
    BB_TRY(bb_param_window_check(m));
    return bb_grad_window_check(m);
}

bb_status bb_model_logits(bb_model_t *m, int position, float *host_logits)
{
    int positions = bb_model_targets_per_example(&m->cfg);
    if (position < 0 || position >= positions)
        return bb_fail(BB_ERR_ARG, "logits at position %d: this %s has positions 0 to %d", position,
                       m->cfg.kind->name, positions - 1);
    refresh_weights(m);
    bb_param_window_start(m, -1);
    BB_TRY(m->cfg.kind->family->forward(m, 1.0f, NULL, NULL));
    BB_TRY(bb_param_window_check(m));
    return m->cfg.kind->family->logits(m, position, host_logits);
}

bb_status bb_model_decode(bb_model_t *m, int32_t token, int position, float *host_logits)
{
    if (!m->cfg.kind->family->decode)
        return bb_fail(BB_ERR_UNSUPPORTED, "a %s does not decode token by token", m->cfg.kind->name);
    int positions = bb_model_targets_per_example(&m->cfg), vocab = bb_model_outputs(&m->cfg);
    if (position < 0 || position >= positions)
        return bb_fail(BB_ERR_ARG, "decode at position %d: this %s has positions 0 to %d", position,
                       m->cfg.kind->name, positions - 1);
    if (token < 0 || token >= vocab)
        return bb_fail(BB_ERR_ARG, "decode: token %d is outside the vocabulary of %d", (int)token, vocab);
    bb_param_window_start(m, -1);
    BB_TRY(m->cfg.kind->family->decode(m, token, position, host_logits));
    return bb_param_window_check(m);
}

int bb_model_loss_chunk(const bb_model_config *c, int micro_batch, uint64_t budget)
{
    if (!bb_model_chunks_loss(c)) return 0;
    int64_t rows = (int64_t)micro_batch * bb_model_targets_per_example(c), outputs = bb_model_outputs(c);
    int64_t chunk = c->loss_chunk;
    if (chunk <= 0) {
        uint64_t row_bytes = (uint64_t)bb_model_logits_stride(outputs > 1 ? (int)outputs : 1) *
                             (c->precision == BB_PRECISION_BF16 ? 2 : 4);
        chunk = budget / row_bytes > (uint64_t)rows ? rows : (int64_t)(budget / row_bytes);
    }
    return (int)(chunk < 1 ? 1 : chunk > rows ? rows : chunk);
}

int bb_model_logits_stride(int vocab) { return (vocab + 63) / 64 * 64; }

void bb_model_set_grad_ready(bb_model_t *m, bb_grad_ready_fn fn, void *ctx)
{
    m->grad_ready = fn;
    m->grad_ready_ctx = ctx;
}
