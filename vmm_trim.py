import os, sys, time
os.environ["XLOGRT_BACKEND"] = "vmm"
import xlogrt_torch as xl
xl.install()
import torch
x = torch.empty(1 << 20, device="cuda"); del x; torch.cuda.synchronize()
f0, t = xl.mem_get_info()
ts = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]  # 2 GiB
for y in ts: y.fill_(1)
torch.cuda.synchronize()
f1, _ = xl.mem_get_info()
s1 = xl.stats()
del ts, y; torch.cuda.synchronize()
f2, _ = xl.mem_get_info()
xl.empty_cache()
f3, _ = xl.mem_get_info()
s3 = xl.stats()
print(f"free before {f0>>20} MiB, with 2 GiB live {f1>>20}, after del {f2>>20}, after empty_cache {f3>>20}; "
      f"physical (pool_reserved) live {s1['pool_reserved']>>20} MiB, after trim {s3['pool_reserved']>>20} MiB")
ok = f3 - f2 >= (2 << 30) - (64 << 20) and f1 < f0 - (2 << 30) + (64 << 20)
print("ok" if ok else "FAILED", "trim returned", (f3 - f2) >> 20, "MiB to the device")
sys.exit(0 if ok else 1)
