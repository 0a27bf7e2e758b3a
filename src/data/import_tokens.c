/* import_tokens.c — token windows from text (bytes, or the tokens of a
 * byte-level BPE tokenizer) or llm.c .bin files.
 *
 * The inputs form one token stream, in order. Record r holds tokens
 * [r*T, r*T + T] (T+1 tokens: inputs and shifted targets), so consecutive
 * records share one token and the stream yields (N-1)/T records. */
#include "bigbatch/tokenizer.h"
#include "import.h"
#include "shard_format.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMC_MAGIC 20240520
#define LLMC_HEADER_BYTES (256 * 4)

typedef struct token_file {
    const char *path;
    const uint8_t *map;    /* whole file */
    size_t map_size;
    const uint8_t *tokens; /* first token: bytes (text) or u16 LE (llm.c) */
    uint64_t data_offset;  /* file offset of the first token */
    uint64_t count;        /* tokens in this file */
} token_file;

typedef struct token_state {
    token_file *files;
    int file_count;
    bool u16_input;    /* llm.c tokens; else one byte per token, or the encoded stream: */
    bb_tokens encoded; /* text with a tokenizer: every file's tokens, in order */
    uint32_t width;    /* bytes per token in a record: 2, or 4 past 65536 ids */
    uint32_t vocab;    /* every token is below this */
    uint32_t seq_len;
    uint64_t next_pos; /* stream position of the next record's first token */
    int file;          /* file holding next_pos */
    uint64_t file_start; /* stream position of files[file]'s first token */
} token_state;

static bb_status map_file(token_file *f, const char *path)
{
    f->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block the open */
    if (fd < 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return bb_fail_errno(BB_ERR_IO, "%s: cannot stat", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return bb_fail(BB_ERR_IO, "%s: not a regular file", path);
    }
    f->map_size = (size_t)st.st_size;
    if (f->map_size == 0) {
        close(fd);
        return bb_fail(BB_ERR_FORMAT, "%s: empty input (0 bytes)", path);
    }
    void *m = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return bb_fail_errno(BB_ERR_IO, "%s: cannot map %zu bytes", path, f->map_size);
    madvise(m, f->map_size, MADV_SEQUENTIAL);
    f->map = m;
    return BB_OK;
}

static bb_status check_llmc_header(token_file *f)
{
    if (f->map_size < LLMC_HEADER_BYTES)
        return bb_fail(BB_ERR_FORMAT, "%s: %zu bytes is too small for an llm.c header (%d bytes)", f->path,
                       f->map_size, LLMC_HEADER_BYTES);
    int32_t magic = (int32_t)bb_le32(f->map), version = (int32_t)bb_le32(f->map + 4),
            ntok = (int32_t)bb_le32(f->map + 8);
    if (magic != LLMC_MAGIC)
        return bb_fail(BB_ERR_FORMAT, "%s: not an llm.c token file: magic %d at offset 0, expected %d",
                       f->path, magic, LLMC_MAGIC);
    if (version != 1)
        return bb_fail(BB_ERR_FORMAT, "%s: llm.c version %d at offset 4 is not supported (expected 1: uint16 tokens)",
                       f->path, version);
    uint64_t expect = LLMC_HEADER_BYTES + 2 * (uint64_t)(uint32_t)ntok;
    if (ntok <= 0 || expect != f->map_size)
        return bb_fail(BB_ERR_CORRUPT, "%s: header says %d tokens (%llu bytes in all), the file holds %zu bytes%s",
                       f->path, ntok, (unsigned long long)expect, f->map_size,
                       expect > f->map_size ? " (truncated)" : "");
    f->data_offset = LLMC_HEADER_BYTES;
    f->tokens = f->map + LLMC_HEADER_BYTES;
    f->count = (uint64_t)ntok;
    return BB_OK;
}

/* Every token of the file must be below the vocabulary: checked before any
 * output exists, tail tokens included. */
static bb_status check_llmc_tokens(const token_file *f, uint32_t vocab)
{
    const uint8_t *p = f->tokens;
    for (uint64_t start = 0; start < f->count; start += 4096) {
        uint64_t n = f->count - start < 4096 ? f->count - start : 4096;
        uint16_t max = 0;
        for (uint64_t i = 0; i < n; i++) { /* branch-free, vectorizes */
            uint16_t t = bb_le16(p + 2 * (start + i));
            max = t > max ? t : max;
        }
        if (max < vocab) continue;
        for (uint64_t i = start;; i++) {
            uint16_t t = bb_le16(p + 2 * i);
            if (t >= vocab)
                return bb_fail(BB_ERR_CORRUPT, "%s: token %u at offset %llu is not below the vocabulary size %u (see --vocab)",
                               f->path, t, (unsigned long long)(f->data_offset + 2 * i), vocab);
        }
    }
    return BB_OK;
}

/* Copies stream tokens [pos, pos+n) to dst as u16 (or u32: st->width). */
static void copy_tokens(token_state *st, uint64_t pos, uint64_t n, void *out)
{
    if (st->encoded.v) {
        for (uint64_t i = 0; i < n; i++)
            if (st->width == 4) ((uint32_t *)out)[i] = st->encoded.v[pos + i];
            else ((uint16_t *)out)[i] = (uint16_t)st->encoded.v[pos + i];
        return;
    }
    uint16_t *dst = out;
    while (pos >= st->file_start + st->files[st->file].count) /* records only move forward */
        st->file_start += st->files[st->file++].count;
    int fi = st->file;
    uint64_t start = st->file_start;
    while (n > 0) {
        token_file *f = &st->files[fi];
        uint64_t off = pos - start, take = f->count - off;
        if (take > n) take = n;
        if (st->u16_input) {
            memcpy(dst, f->tokens + 2 * off, 2 * take); /* little-endian host: static-asserted at open */
        } else {
            for (uint64_t i = 0; i < take; i++) dst[i] = f->tokens[off + i];
        }
        dst += take, n -= take, pos += take;
        start += f->count;
        fi++;
    }
}

static bb_status tokens_read(bb_record_source *src, uint64_t count, uint8_t *dst)
{
    token_state *st = src->state;
    uint32_t len = st->seq_len + 1;
    for (uint64_t r = 0; r < count; r++) {
        copy_tokens(st, st->next_pos, len, dst + r * st->width * (uint64_t)len);
        st->next_pos += st->seq_len;
    }
    return BB_OK;
}

static void tokens_close(bb_record_source *src)
{
    token_state *st = src->state;
    if (!st) return;
    for (int i = 0; i < st->file_count; i++)
        if (st->files[i].map) munmap((void *)st->files[i].map, st->files[i].map_size);
    free(st->files);
    bb_tokens_free(&st->encoded);
    free(st);
    src->state = NULL;
}

bb_status bb_import_tokens_open(const bb_pack_options *o, bb_record_source *out)
{
    _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "records are stored little-endian");
    memset(out, 0, sizeof *out);
    bool llmc = o->format == BB_PACK_LLMC;
    if (o->input_count < 1) return bb_fail(BB_ERR_ARG, "--in: no input files");
    if (o->seq_len < 1) return bb_fail(BB_ERR_ARG, "--seq-len must be at least 1");
    if (llmc && (o->vocab < 2 || o->vocab > 65536))
        return bb_fail(BB_ERR_ARG, "--vocab %u: llm.c version 1 files hold uint16 tokens, so 2 to 65536", o->vocab);
    token_state *st = calloc(1, sizeof *st);
    if (!st || !(st->files = calloc((size_t)o->input_count, sizeof *st->files))) {
        free(st);
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    out->state = st;
    out->read = tokens_read;
    out->close = tokens_close;
    st->file_count = o->input_count;
    st->u16_input = llmc;
    st->vocab = llmc ? o->vocab : 256;
    st->seq_len = o->seq_len;
    st->width = 2;
    bb_status rc = BB_OK;
    uint64_t total = 0;
    bb_tokenizer_t *tok = NULL;
    if (o->tokenizer) {
        BB_TRY_GOTO(bb_tokenizer_load(o->tokenizer, &tok), rc, fail);
        st->vocab = bb_tokenizer_vocab(tok);
        st->width = st->vocab > 65536 ? 4 : 2;
    }
    for (int i = 0; i < o->input_count; i++) {
        token_file *f = &st->files[i];
        BB_TRY_GOTO(map_file(f, o->inputs[i]), rc, fail);
        if (llmc) {
            BB_TRY_GOTO(check_llmc_header(f), rc, fail);
            BB_TRY_GOTO(check_llmc_tokens(f, st->vocab), rc, fail);
        } else if (tok) { /* encoded now, so that the whole stream is known before any output */
            size_t before = st->encoded.n;
            BB_TRY_GOTO(bb_tokenizer_encode_parallel(tok, f->map, f->map_size, o->writer.threads, &st->encoded), rc,
                        fail);
            f->count = st->encoded.n - before;
            munmap((void *)f->map, f->map_size), f->map = NULL;
        } else {
            f->tokens = f->map;
            f->count = f->map_size;
        }
        total += f->count;
    }
    bb_tokenizer_destroy(tok), tok = NULL;
    uint64_t record_tokens = (uint64_t)o->seq_len + 1;
    if (total < record_tokens) {
        rc = bb_fail(BB_ERR_FORMAT, "%s%s: %llu tokens in all, shorter than one record (--seq-len %u needs %llu tokens)",
                     o->inputs[0], o->input_count > 1 ? " and the other inputs" : "",
                     (unsigned long long)total, o->seq_len, (unsigned long long)record_tokens);
        goto fail;
    }
    out->record_count = (total - 1) / o->seq_len;
    out->unused_tokens = total - 1 - out->record_count * o->seq_len;
    bb_shard_meta *m = &out->meta;
    m->kind = st->width == 4 ? BB_RECORD_TOKENS_U32 : BB_RECORD_TOKENS_U16;
    m->rank = 1;
    m->shape[0] = (uint32_t)record_tokens;
    m->record_size = (uint32_t)(st->width * record_tokens);
    m->classes_or_vocab = st->vocab;
    bb_import_source_name(m->source, o->inputs[0], o->input_count - 1);
    return BB_OK;
fail:
    bb_tokenizer_destroy(tok);
    tokens_close(out);
    return rc;
}

void bb_import_source_name(char out[BB_SHARD_SOURCE_MAX + 1], const char *first, int more)
{
    const char *base = strrchr(first, '/');
    base = base ? base + 1 : first;
    char suffix[24] = "";
    if (more > 0) snprintf(suffix, sizeof suffix, " +%d more", more);
    int room = BB_SHARD_SOURCE_MAX - (int)strlen(suffix);
    snprintf(out, BB_SHARD_SOURCE_MAX + 1, "%.*s%s", room, base, suffix);
}
