/*
 * tfevents.h — TensorBoard event files (scalars only), so that rl-train's
 * metrics show in TensorBoard without Python on the training machine.
 *
 * A file is a sequence of TFRecords: u64 length, u32 masked CRC-32C of the
 * length, the bytes of one serialized Event protobuf, u32 masked CRC-32C of
 * the bytes.  The first Event carries file_version "brain.Event:2".  Events
 * are encoded by hand (a dozen bytes of protobuf wire format).
 * Leaves out: histograms, images, graphs.
 */
#ifndef RL_TFEVENTS_H
#define RL_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct rl_tfevents rl_tfevents;

/* CRC-32C (Castagnoli) of n bytes, and TensorFlow's masked form of it. */
uint32_t rl_crc32c(const void *data, size_t n);
uint32_t rl_crc32c_masked(const void *data, size_t n);

/* Creates DIR if needed and opens DIR/events.out.tfevents.<unix time>.<host>.
 * *out owned by the caller; close with rl_tfevents_close (NULL ok). */
int rl_tfevents_open(rl_tfevents **out, const char *dir);
/* Appends one scalar.  wall_time in seconds since the epoch (0: now). */
int rl_tfevents_scalar(rl_tfevents *tf, const char *tag, int64_t step, double value, double wall_time);
int rl_tfevents_flush(rl_tfevents *tf);
int rl_tfevents_close(rl_tfevents *tf);
const char *rl_tfevents_path(const rl_tfevents *tf);

/* Encodes one TFRecord holding a scalar Event into buf (cap bytes); returns the
 * length written or 0 when cap is too small.  Exposed for tests. */
size_t rl_tfevents_encode_scalar(uint8_t *buf, size_t cap, const char *tag, int64_t step,
    double value, double wall_time);

#endif
