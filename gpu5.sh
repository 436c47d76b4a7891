#!/bin/bash
L=$OUT/logs; mkdir -p $L; t0=$SECONDS
left() { echo $((570 - (SECONDS-t0))); }
python3 -m pip install --no-build-isolation --no-deps --no-index --target $PWD/site ./bridge/torch > $L/pip.txt 2>&1; echo "rc=$? t=$((SECONDS-t0))" >> $L/pip.txt
XLOGRT_BACKEND=vmm timeout 120 build-soak/test/resource/test_conformance_gpu > $L/conf_vmm.txt 2>&1; echo "rc=$? t=$((SECONDS-t0))" >> $L/conf_vmm.txt
PYTHONPATH=site timeout 60 python3 vmm_trim.py > $L/trim.txt 2>&1; echo "rc=$? t=$((SECONDS-t0))" >> $L/trim.txt
PYTHONPATH=site timeout $(($(left)-150)) python3 bridge/torch/bench_footprint.py --workloads gpt2-serve,resnet --allocators torch-async,expandable,xlogrt,xlogrt-vmm --rounds 1 --steps 12 --out $L > $L/fp.txt 2>&1; echo "rc=$? t=$((SECONDS-t0))" >> $L/fp.txt
XLOGRT_BACKEND=vmm timeout $(($(left)-20)) build-soak/test/gpu_repro/gpu_soak --seconds 60 --threads 16 --streams 8 --sample-seconds 10 > $L/soak_vmm.txt 2>&1; echo "rc=$? t=$((SECONDS-t0))" >> $L/soak_vmm.txt
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
