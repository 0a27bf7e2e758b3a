/* fuzz_shard_reader.c — libFuzzer target: any bytes given to the shard
 * reader must give a shard whose frames decode or a clean error, never a
 * crash, overflow or leak. `make fuzz-run FUZZ_SECONDS=600`. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bigbatch/shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The reader works on files: an in-memory file keeps the disk out. */
    int fd = memfd_create("shard", MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    bb_shard_t *sh;
    bb_frame_decoder_t *dec;
    if (bb_shard_open(path, &sh) == BB_OK) {
        uint32_t cap = bb_shard_max_frame_bytes(sh);
        uint8_t *buf = cap <= (8u << 20) ? malloc(cap) : NULL;
        if (buf && bb_frame_decoder_create(&dec) == BB_OK) {
            for (uint32_t f = 0; f < bb_shard_frame_count(sh); f++) {
                bb_status rc = bb_shard_read_frame(sh, f, dec, buf, cap);
                const bb_shard_frame *fr = bb_shard_frame_at(sh, f);
                /* A frame that passes must hold whole records. */
                if (rc == BB_OK && fr->raw_size % bb_shard_get_meta(sh)->record_size != 0) abort();
            }
            bb_frame_decoder_destroy(dec);
        }
        free(buf);
        bb_shard_close(sh);
    }
    close(fd);
    return 0;
}
