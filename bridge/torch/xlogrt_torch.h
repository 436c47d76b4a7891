/* SPDX-License-Identifier: Apache-2.0 */
/* The C interface of libxlogrt_torch: the allocation functions that
 * torch.cuda.memory.CUDAPluggableAllocator(path, "xlogrt_torch_malloc", "xlogrt_torch_free")
 * loads, and what the torch hooks (torch_hooks.cpp) and Python (xlogrt_torch/,
 * xlogrt_cupy/, xlogrt_numba/) call.
 *
 * One library for every framework of the process: PyTorch, CuPy and Numba load this same
 * file, so they share one DeviceRuntime<DefaultStack> per device (one budget, one cache,
 * one XLOGRT_LOG_FILE log), told apart by the tag of their allocations. The name stays
 * libxlogrt_torch (and the prefix xlogrt_torch_) for the functions torch and existing
 * callers already name; nothing in it depends on torch.
 *
 * The library exports these functions and nothing else (xlogrt_torch.map), so that a
 * copy of libstdc++ linked into it statically never stands in for the process's own. */
#ifndef XLOGRT_TORCH_H
#define XLOGRT_TORCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XLOGRT_TORCH_API __attribute__((visibility("default")))

typedef struct CUstream_st* xlogrt_torch_stream; /* cudaStream_t */

/* torch's alloc_fn: `size` bytes on device `device`, usable on `stream`. Returns NULL for
 * size 0. On failure (a negative size, an unknown device, the stack's refusal): calls the
 * failure handler when one is set (the torch hooks' throws torch.OutOfMemoryError), else
 * returns NULL; xlogrt_torch_last_error says why. */
XLOGRT_TORCH_API void* xlogrt_torch_malloc(ssize_t size, int device, xlogrt_torch_stream stream);
/* torch's free_fn: the free of `ptr` is queued on `stream` (the allocation's), after
 * every use recorded with xlogrt_torch_record_stream. A refused free (a pointer this
 * library did not hand out, a negative size or one other than the allocation's, an
 * unknown device) is reported on stderr and keeps the block (nothing is lost). */
XLOGRT_TORCH_API void xlogrt_torch_free(void* ptr, ssize_t size, int device, xlogrt_torch_stream stream);
/* Tensor.record_stream: the free of `ptr` waits for the work enqueued on `stream` so far.
 * Returns 0, or -1 (xlogrt_torch_last_error says why). */
XLOGRT_TORCH_API int xlogrt_torch_record_stream(void* ptr, xlogrt_torch_stream stream);

/* The tags of the frameworks' allocations, in Statistics (xlogrt_torch_get_tag_stats)
 * and in the XLOGRT_LOG_FILE log. xlogrt_torch_malloc tags with XLOGRT_TAG_TORCH. */
#define XLOGRT_TAG_TORCH 1u
#define XLOGRT_TAG_CUPY 2u
#define XLOGRT_TAG_NUMBA 3u
/* The largest tag xlogrt_torch_malloc_tagged accepts: Statistics counts tags below 64
 * one by one. 4..63 are free for other callers. */
#define XLOGRT_TAG_MAX 63u

/* xlogrt_torch_malloc for another framework: the allocation carries `tag`
 * (1..XLOGRT_TAG_MAX). Returns NULL for size 0 (no block, no error) and on failure
 * (a negative size, a tag out of range, an unknown device, the stack's refusal: the
 * message, from xlogrt_torch_last_error, names the budget when the budget refused).
 * Never calls the failure handler: it is meant for callers that cannot take a C++
 * exception (ctypes), so a process with torch's hooks installed still gets NULL here.
 * Free with xlogrt_torch_free (any tag: the pointer is enough), record uses with
 * xlogrt_torch_record_stream. */
XLOGRT_TORCH_API void* xlogrt_torch_malloc_tagged(ssize_t size, int device, xlogrt_torch_stream stream,
                                                  uint32_t tag);

/* CuPy's allocations (xlogrt_cupy), with a C-level owner. CuPy keeps the owner object an
 * allocator hands it (cupy.cuda.UnownedMemory's owner) until the memory's last reference
 * goes; this owner frees the block from C when it goes, and the allocation is one call of a
 * builtin function: no ctypes call and no Python finalizer on the way.
 *
 * The library does not link against Python: xlogrt_torch_cupy_init hands it the C-API
 * functions it calls (ctypes.pythonapi's, CPython's stable ABI), as pointers, and Python
 * objects are void* here. */
typedef struct xlogrt_torch_python_api {
  void* (*capsule_new)(void* pointer, const char* name, void (*destructor)(void* capsule)); /* PyCapsule_New */
  void* (*capsule_get_pointer)(void* capsule, const char* name);                            /* PyCapsule_GetPointer */
  void* (*long_from_void_ptr)(void* pointer);                                               /* PyLong_FromVoidPtr */
  ssize_t (*long_as_ssize_t)(void* integer);                                                /* PyLong_AsSsize_t */
  long (*long_as_long)(void* integer);                                                      /* PyLong_AsLong */
  void* (*long_as_void_ptr)(void* integer);                                                 /* PyLong_AsVoidPtr */
  void* (*err_occurred)(void);                                                              /* PyErr_Occurred */
  void (*err_set_string)(void* type, const char* message);                                  /* PyErr_SetString */
  void* (*tuple_pack)(ssize_t n, ...);                                                      /* PyTuple_Pack */
  void (*incref)(void* object);                                                             /* Py_IncRef */
  void (*decref)(void* object);                                                             /* Py_DecRef */
  void* (*save_thread)(void);                                                               /* PyEval_SaveThread */
  void (*restore_thread)(void* thread_state);                                               /* PyEval_RestoreThread */
  void* none;                                                                               /* Py_None */
  void* type_error;                                                                         /* PyExc_TypeError */
} xlogrt_torch_python_api;
/* Takes the process's Python C API (the first call's table stays: a process has one
 * Python) and returns the PyMethodDef of alloc, for PyCFunction_NewEx; NULL (last_error
 * says why) when an entry of the table is NULL.
 *
 * alloc(size, device, stream, stream_object), METH_FASTCALL: `size` bytes on `device` for
 * the stream whose handle is the int `stream` (its Python object: stream_object), tagged
 * XLOGRT_TAG_CUPY; the GIL is let go during the allocation itself. Returns the tuple
 * (address, stream_object, capsule), to be the memory's owner: when the tuple goes, its
 * items go last to first (CPython's tuple deallocation), so the capsule's destructor queues
 * the free on `stream` (xlogrt_torch_free with the allocation's size and device) while the
 * tuple still holds stream_object, the handle's owner. The tuple, unlike the capsule, is
 * seen by the garbage collector, so a cycle through the stream object stays collectable.
 * On a refusal (xlogrt_torch_malloc_tagged's NULL, or a device beyond int): None, and
 * xlogrt_torch_last_error says why. Raises TypeError for other arguments than four, the
 * C API's error for one that is not an int in range, MemoryError when the owner cannot be
 * built (the block is freed again). */
XLOGRT_TORCH_API const void* xlogrt_torch_cupy_init(const xlogrt_torch_python_api* api);

/* Called with the message of a failed allocation, instead of returning NULL. It may
 * throw a C++ exception (the torch hooks throw c10::OutOfMemoryError); NULL: none. */
typedef void (*xlogrt_torch_failure_handler)(const char* message, size_t bytes, int device);
XLOGRT_TORCH_API void xlogrt_torch_set_failure_handler(xlogrt_torch_failure_handler handler);

/* Figures of one device (all zero before its first allocation). Reading them first
 * retires the queued frees the device has reached, without waiting. */
typedef struct xlogrt_torch_stats {
  uint64_t current_bytes;     /* allocated and not freed, as asked for (Statistics) */
  uint64_t peak_bytes;        /* an upper bound of the largest current_bytes since the last reset */
  uint64_t total_bytes;       /* allocated since start */
  uint64_t freed_bytes;       /* freed since start */
  uint64_t current_count;     /* blocks allocated and not freed */
  uint64_t allocations;       /* successful allocations */
  uint64_t frees;             /* successful frees */
  uint64_t failed;            /* allocations the stack refused */
  uint64_t bytes_outstanding; /* live blocks and frees not yet retired (DeviceRuntime::bytes_outstanding) */
  uint64_t cached_bytes;      /* blocks in the caching layer (0 with XLOGRT_CACHE=0); the stack holds
                                 bytes_outstanding + cached_bytes of the device */
  uint64_t pool_reserved;     /* the reserved memory of the stack's device pools (cuMemPoolGetAttribute):
                                 the device's default pool and the small blocks' own */
  uint64_t pool_reserved_peak;/* the sum of their highest since they were created (a bound of the peak) */
  uint64_t pool_used;         /* the memory their allocations occupy (XLOGRT_BACKEND=vmm: these three are the
                                 physical pages held, their highest, and the blocks' bytes) */
  uint64_t device_allocs;     /* requests the caching layer passed to the pool */
  uint64_t alloc_retries;     /* pool failures retried after the cache gave memory back */
  uint64_t budget_bytes;      /* the device's budget; UINT64_MAX: none */
  uint64_t budget_in_use;     /* bytes charged to it */
  uint64_t graph_pool_bytes;  /* memory the CUDA graph pools hold (part of bytes_outstanding) */
  uint64_t graph_pool_live_bytes; /* of which tensors hold */
  uint64_t stream_ids;        /* stream ids in use (the device's StreamPool: its own streams and adopted ones) */
  uint64_t streams_recycled;  /* ids given to a new stream after their stream was gone (destroyed, handle reused) */
  uint64_t small_pool_reserved;      /* of pool_reserved: the cached sizes' own pool (0: the stack has one pool) */
  uint64_t small_pool_reserved_peak; /* of pool_reserved_peak: that pool's highest */
} xlogrt_torch_stats;
/* Returns 0, or -1 for a device that has no runtime (and cannot have one). */
XLOGRT_TORCH_API int xlogrt_torch_get_stats(int device, xlogrt_torch_stats* out);
/* xlogrt_torch_get_stats with the first eight fields (current_bytes .. failed) those of
 * the allocations tagged `tag` alone (0: the untagged; zero when the tag has none); the
 * others are the device's, as xlogrt_torch_get_stats fills them. Returns 0, or -1 for a
 * tag above XLOGRT_TAG_MAX or a device without a runtime. */
XLOGRT_TORCH_API int xlogrt_torch_get_tag_stats(int device, uint32_t tag, xlogrt_torch_stats* out);
/* cuMemGetInfo of `device`: its free and total bytes, as the driver tells them (Numba's
 * get_memory_info). Builds the device's runtime if it has none yet, and leaves the
 * device's primary context current on the calling thread (the context CuPy, Numba and
 * torch use). Returns 0, or -1 (an unknown device, a driver error; last_error says). */
XLOGRT_TORCH_API int xlogrt_torch_mem_get_info(int device, uint64_t* free_bytes, uint64_t* total_bytes);
/* Statistics' peaks start again from the bytes live now. Returns 0 or -1. */
XLOGRT_TORCH_API int xlogrt_torch_reset_peak(int device);
/* Waits for the queued frees of `device` and retires them. Returns 0 or -1. */
XLOGRT_TORCH_API int xlogrt_torch_reap(int device);
/* torch.cuda.empty_cache: gives the caching layer's blocks back to the pool, waits for the
 * device's queued frees, and returns the pool's unused memory to the device (other
 * processes can use it). Every device with a runtime when `device` is -1. Returns 0 or -1. */
XLOGRT_TORCH_API int xlogrt_torch_empty_cache(int device);
/* torch.cuda.set_per_process_memory_fraction: the device's budget becomes `fraction`
 * (0 < fraction <= 1) of its memory. Returns 0, or -1 for a fraction out of range (the
 * budget is unchanged) or a device without a runtime. */
XLOGRT_TORCH_API int xlogrt_torch_set_memory_fraction(double fraction, int device);
/* Flushes the XLOGRT_LOG_FILE log of `device`. Returns 0 or -1. */
XLOGRT_TORCH_API int xlogrt_torch_flush_log(int device);
/* CUDA graphs: torch's capture hooks (CUDAPluggableAllocator's begin/end allocate to pool
 * and release pool), over the device's GraphPools layer. `pool` is torch's MempoolId_t.
 * begin: until end with the same pool, an allocation on a stream for which
 * filter(filter_ctx, stream) returns nonzero comes from the graph pool `pool` (filter NULL:
 * every capturing stream); the caller keeps filter_ctx alive until end returns.
 * `capture_stream` (torch's current stream when it begins a capture; NULL: none) is adopted
 * now: a stream's id cannot be read once it captures, and a stream first seen during a
 * capture is refused. release:
 * one use of the pool ended (a graph destroyed); the pool's memory goes back once every
 * use has ended; releasing a pool with no use (one torch never allocated to) does nothing.
 * Each returns 0, or -1 (last_error says). */
typedef int (*xlogrt_torch_stream_filter)(void* filter_ctx, xlogrt_torch_stream stream);
XLOGRT_TORCH_API int xlogrt_torch_begin_allocate_to_pool(int device, uint64_t pool_first, uint64_t pool_second,
                                                         xlogrt_torch_stream capture_stream,
                                                         xlogrt_torch_stream_filter filter, void* filter_ctx);
XLOGRT_TORCH_API int xlogrt_torch_end_allocate_to_pool(int device, uint64_t pool_first, uint64_t pool_second);
XLOGRT_TORCH_API int xlogrt_torch_release_pool(int device, uint64_t pool_first, uint64_t pool_second);

/* The message of the last error on the calling thread ("" when none). */
XLOGRT_TORCH_API const char* xlogrt_torch_last_error(void);
/* The version of xlogrt this library was built from (meson.build's project version). */
XLOGRT_TORCH_API const char* xlogrt_torch_version(void);

#ifdef __cplusplus
}
#endif

#endif /* XLOGRT_TORCH_H */
