# SPDX-License-Identifier: Apache-2.0
"""On a GPU: over the virtual memory base (the default, XLOGRT_BACKEND unset: the tensors
must come from no memory pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE null; or XLOGRT_BACKEND=vmm
as the caller sets it), xlogrt_torch.empty_cache() gives freed pages back to the device.
2 GiB of tensors are allocated through the installed xlogrt_torch package and freed;
cuMemGetInfo's free memory must rise by them (less 64 MiB) at empty_cache, and
memory_stats' reserve (the virtual base's physical pages) must fall with it.

    PYTHONPATH=SITE python3 bridge/torch/test_vmm_trim.py      # exit 0: ok, 1: failed
"""
import ctypes
import os
import sys

# The installed package, not the source beside this script (which has no C library).
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]

MIB = 1 << 20


def main():
    backend = os.environ.get("XLOGRT_BACKEND", "")
    if backend.lower() not in ("", "auto", "vmm"):
        print(f"test_vmm_trim: XLOGRT_BACKEND={backend} is not the virtual memory base")
        return 1
    import xlogrt_torch as xl
    xl.install()
    import torch
    probe = torch.empty(MIB, device="cuda")
    torch.cuda.synchronize()
    # CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE (17): the pool an allocation came from, null for
    # memory mapped by cuMemMap.
    pool = ctypes.c_void_p(0)
    rc = ctypes.CDLL("libcuda.so.1").cuPointerGetAttribute(ctypes.byref(pool), 17, ctypes.c_uint64(probe.data_ptr()))
    print(f"the tensors' memory pool: {pool.value or 'none'} (cuPointerGetAttribute: {rc})")
    if rc != 0 or pool.value:
        print("FAILED: the stack is not on the virtual memory base")
        return 1
    before, _ = xl.mem_get_info()
    tensors = [torch.empty(256 * MIB, dtype=torch.uint8, device="cuda") for _ in range(8)]
    for t in tensors:
        t.fill_(1)
    torch.cuda.synchronize()
    live, _ = xl.mem_get_info()
    reserved_live = xl.stats()["pool_reserved"]
    del tensors, t
    torch.cuda.synchronize()
    freed, _ = xl.mem_get_info()
    xl.empty_cache()  # down to VirtualCuda::trim: unmaps and releases the idle pages
    trimmed, _ = xl.mem_get_info()
    reserved_trimmed = xl.stats()["pool_reserved"]
    print(f"free memory: before {before // MIB} MiB, with 2 GiB live {live // MIB}, after the frees "
          f"{freed // MIB}, after empty_cache {trimmed // MIB}; physical pages {reserved_live // MIB} -> "
          f"{reserved_trimmed // MIB} MiB")
    ok = trimmed - freed >= 2048 * MIB - 64 * MIB and before - live >= 2048 * MIB - 64 * MIB
    ok = ok and reserved_trimmed < reserved_live
    print("ok" if ok else "FAILED", f"empty_cache returned {(trimmed - freed) // MIB} MiB to the device")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
