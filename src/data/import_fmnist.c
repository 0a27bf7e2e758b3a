/* import_fmnist.c — Fashion-MNIST (and MNIST) IDX files, gzipped or not. */
#include "import.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_IMAGES_MAGIC 0x00000803u /* unsigned byte, 3 dimensions */
#define IDX_LABELS_MAGIC 0x00000801u /* unsigned byte, 1 dimension */
#define FMNIST_CLASSES 10

typedef struct idx_file {
    const char *path;
    gzFile gz;
    uint64_t offset; /* uncompressed bytes consumed */
} idx_file;

typedef struct fmnist_state {
    idx_file images, labels;
    uint32_t pixels;  /* rows * cols */
    uint64_t next;    /* next record index */
    uint8_t *scratch; /* a chunk of images */
    size_t scratch_cap;
} fmnist_state;

static bb_status idx_read(idx_file *f, void *dst, size_t size, const char *what)
{
    uint8_t *p = dst;
    size_t left = size;
    while (left > 0) {
        unsigned want = left > (1u << 30) ? 1u << 30 : (unsigned)left;
        int n = gzread(f->gz, p, want);
        if (n < 0) {
            int err;
            const char *msg = gzerror(f->gz, &err);
            return bb_fail(BB_ERR_CORRUPT, "%s: cannot decompress at offset %llu: %s", f->path,
                           (unsigned long long)f->offset, msg);
        }
        if (n == 0)
            return bb_fail(BB_ERR_CORRUPT, "%s: truncated: file ends at offset %llu while reading %s",
                           f->path, (unsigned long long)f->offset, what);
        p += n, left -= (size_t)n, f->offset += (uint64_t)n;
    }
    return BB_OK;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads an IDX header: magic, then `dims` big-endian u32 sizes. */
static bb_status idx_open(idx_file *f, const char *path, uint32_t magic, uint32_t *dims, int ndims)
{
    f->path = path;
    f->gz = gzopen(path, "rb"); /* reads plain files too */
    if (!f->gz) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    gzbuffer(f->gz, 1u << 20);
    uint8_t head[16];
    size_t size = 4 + 4 * (size_t)ndims;
    int n = gzread(f->gz, head, (unsigned)size);
    if (n <= 0) return bb_fail(BB_ERR_FORMAT, "%s: empty input (no IDX header)", path);
    if ((size_t)n < size) return bb_fail(BB_ERR_FORMAT, "%s: truncated IDX header (%d of %zu bytes)", path, n, size);
    f->offset = size;
    if (be32(head) != magic)
        return bb_fail(BB_ERR_FORMAT, "%s: wrong IDX magic 0x%08x at offset 0, expected 0x%08x (%s)", path,
                       be32(head), magic, magic == IDX_IMAGES_MAGIC ? "u8 images" : "u8 labels");
    for (int i = 0; i < ndims; i++) dims[i] = be32(head + 4 + 4 * i);
    return BB_OK;
}

static bb_status fmnist_read(bb_record_source *src, uint64_t count, uint8_t *dst)
{
    fmnist_state *st = src->state;
    size_t px = st->pixels, need = (size_t)count * px;
    if (need > st->scratch_cap) {
        uint8_t *grown = realloc(st->scratch, need);
        if (!grown) return bb_fail(BB_ERR_NOMEM, "cannot allocate %zu bytes for images", need);
        st->scratch = grown, st->scratch_cap = need;
    }
    uint8_t labels[4096];
    for (uint64_t done = 0; done < count;) {
        uint64_t n = count - done < sizeof labels ? count - done : sizeof labels;
        uint64_t label_offset = st->labels.offset;
        BB_TRY(idx_read(&st->labels, labels, n, "labels"));
        BB_TRY(idx_read(&st->images, st->scratch + done * px, n * px, "images"));
        for (uint64_t i = 0; i < n; i++) {
            if (labels[i] >= FMNIST_CLASSES)
                return bb_fail(BB_ERR_CORRUPT, "%s: label %u of record %llu at offset %llu is not below %d classes",
                               st->labels.path, labels[i], (unsigned long long)(st->next + done + i),
                               (unsigned long long)(label_offset + i), FMNIST_CLASSES);
            uint8_t *rec = dst + (done + i) * (1 + px);
            rec[0] = labels[i];
            memcpy(rec + 1, st->scratch + (done + i) * px, px);
        }
        done += n;
    }
    st->next += count;
    if (st->next == src->record_count) { /* all records read: nothing may follow */
        idx_file *files[] = {&st->images, &st->labels};
        for (int i = 0; i < 2; i++) {
            uint8_t extra;
            if (gzread(files[i]->gz, &extra, 1) > 0)
                return bb_fail(BB_ERR_FORMAT, "%s: data continues at offset %llu, after the %llu records its header announces",
                               files[i]->path, (unsigned long long)files[i]->offset, (unsigned long long)src->record_count);
        }
    }
    return BB_OK;
}

static void fmnist_close(bb_record_source *src)
{
    fmnist_state *st = src->state;
    if (!st) return;
    if (st->images.gz) gzclose(st->images.gz);
    if (st->labels.gz) gzclose(st->labels.gz);
    free(st->scratch);
    free(st);
    src->state = NULL;
}

bb_status bb_import_fmnist_open(const char *images, const char *labels, bb_record_source *out)
{
    memset(out, 0, sizeof *out);
    fmnist_state *st = calloc(1, sizeof *st);
    if (!st) return bb_fail(BB_ERR_NOMEM, "out of memory");
    out->state = st;
    out->read = fmnist_read;
    out->close = fmnist_close;
    bb_status rc;
    uint32_t idims[3] = {0}, ldims[1] = {0};
    BB_TRY_GOTO(idx_open(&st->images, images, IDX_IMAGES_MAGIC, idims, 3), rc, fail);
    BB_TRY_GOTO(idx_open(&st->labels, labels, IDX_LABELS_MAGIC, ldims, 1), rc, fail);
    if (idims[0] != ldims[0]) {
        rc = bb_fail(BB_ERR_FORMAT, "%s holds %u images but %s holds %u labels: counts must match",
                     images, idims[0], labels, ldims[0]);
        goto fail;
    }
    if (idims[0] == 0 || idims[1] == 0 || idims[2] == 0 || (uint64_t)idims[1] * idims[2] >= BB_SHARD_MAX_FRAME_BYTES) {
        rc = bb_fail(BB_ERR_FORMAT, "%s: unusable image dimensions %u x %u x %u", images, idims[0], idims[1], idims[2]);
        goto fail;
    }
    st->pixels = idims[1] * idims[2];
    out->record_count = idims[0];
    bb_shard_meta *m = &out->meta;
    m->kind = BB_RECORD_IMAGE_U8;
    m->rank = 2;
    m->shape[0] = idims[1], m->shape[1] = idims[2];
    m->record_size = 1 + st->pixels;
    m->classes_or_vocab = FMNIST_CLASSES;
    bb_import_source_name(m->source, images, 0);
    return BB_OK;
fail:
    fmnist_close(out);
    return rc;
}
