/* TensorBoard event files (logging.tensorboard_dir, Megatron's --tensorboard-dir).
 *
 * DIR/events.out.tfevents.<seconds>.<host>.<pid> holds TFRecords: uint64 length, its masked
 * CRC32C, the serialized tensorflow.Event, the data's masked CRC32C (mask: rotate right 15,
 * add 0xa282ead8). The first event carries file_version "brain.Event:2"; each logged
 * iteration is one event whose summary holds the scalars (simple_value) under Megatron's
 * tags. Events are encoded with protobuf-c and the CRCs computed by ISA-L (crc32_iscsi is
 * CRC32C). Each run opens a new file: TensorBoard joins a folder's files by step. */
#ifndef TPD_ENGINE_TENSORBOARD_H
#define TPD_ENGINE_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/train/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_tb_writer tpd_tb_writer;

/* Creates dir (mkdir -p) and a new event file in it. */
tpd_status tpd_tb_open(const char *dir, tpd_tb_writer **w_p);
/* The file's path. */
const char *tpd_tb_path(const tpd_tb_writer *w);
/* One event at `step` holding n scalars (tags[i], values[i]); flushed. */
tpd_status tpd_tb_scalars(tpd_tb_writer *w, int64_t step, int n, const char *const *tags,
                          const double *values);
/* The scalars of one logged iteration (those of the JSONL record, plus the timers when
 * t is not NULL). */
tpd_status tpd_tb_record(tpd_tb_writer *w, const tpd_iter_record *r, const tpd_step_timers *t);
void tpd_tb_close(tpd_tb_writer *w);

/* TFRecord's masked CRC32C of data[0..n). Exposed for the tests. */
uint32_t tpd_tb_masked_crc(const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
