/* SPDX-License-Identifier: Apache-2.0 */
/* The C interface of libxlogrt_torch: the allocation functions that
 * torch.cuda.memory.CUDAPluggableAllocator(path, "xlogrt_torch_malloc", "xlogrt_torch_free")
 * loads, and what the torch hooks (torch_hooks.cpp) and Python (xlogrt_torch.py) call. */
#ifndef XLOGRT_TORCH_H
#define XLOGRT_TORCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st* xlogrt_torch_stream; /* cudaStream_t */

/* torch's alloc_fn: `size` bytes on device `device`, usable on `stream`. Returns NULL for
 * size 0. On failure: calls the failure handler when one is set (the torch hooks' throws
 * torch.OutOfMemoryError), else returns NULL; xlogrt_torch_last_error says why. */
void* xlogrt_torch_malloc(ssize_t size, int device, xlogrt_torch_stream stream);
/* torch's free_fn: the free of `ptr` is queued on `stream` (the allocation's), after
 * every use recorded with xlogrt_torch_record_stream. A refused free is reported on
 * stderr and keeps the block (nothing is lost). */
void xlogrt_torch_free(void* ptr, ssize_t size, int device, xlogrt_torch_stream stream);
/* Tensor.record_stream: the free of `ptr` waits for the work enqueued on `stream` so far.
 * Returns 0, or -1 (xlogrt_torch_last_error says why). */
int xlogrt_torch_record_stream(void* ptr, xlogrt_torch_stream stream);

/* Called with the message of a failed allocation, instead of returning NULL. It may
 * throw a C++ exception (the torch hooks throw c10::OutOfMemoryError); NULL: none. */
typedef void (*xlogrt_torch_failure_handler)(const char* message, size_t bytes, int device);
void xlogrt_torch_set_failure_handler(xlogrt_torch_failure_handler handler);

/* Figures of one device's stack (all zero before its first allocation). */
typedef struct xlogrt_torch_stats {
  uint64_t current_bytes;     /* allocated and not freed (Statistics) */
  uint64_t peak_bytes;        /* an upper bound of the largest current_bytes */
  uint64_t total_bytes;       /* allocated since start */
  uint64_t allocations;       /* successful allocations */
  uint64_t frees;             /* successful frees */
  uint64_t failed;            /* allocations the stack refused */
  uint64_t bytes_outstanding; /* the stack's: frees not yet reaped still count */
  uint64_t budget_bytes;      /* the device's budget; UINT64_MAX: none */
} xlogrt_torch_stats;
/* Returns 0, or -1 for a device that has no runtime (and cannot have one). */
int xlogrt_torch_get_stats(int device, xlogrt_torch_stats* out);
/* Waits for the queued frees of `device` and retires them. Returns 0 or -1. */
int xlogrt_torch_reap(int device);
/* Flushes the XLOGRT_LOG_FILE log of `device`. Returns 0 or -1. */
int xlogrt_torch_flush_log(int device);
/* The message of the last error on the calling thread ("" when none). */
const char* xlogrt_torch_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* XLOGRT_TORCH_H */
