#!/bin/bash
L=$OUT/logs; mkdir -p $L; t0=$SECONDS
python3 -m pip install --no-build-isolation --no-deps --no-index --target $PWD/site ./bridge/torch > $L/pip.txt 2>&1; echo "rc=$? t=$((SECONDS-t0))" >> $L/pip.txt
PYTHONPATH=site timeout 60 python3 vmm_trim.py > $L/trim.txt 2>&1; echo "rc=$? t=$((SECONDS-t0))" >> $L/trim.txt
PYTHONPATH=site timeout 100 python3 bridge/torch/bench_footprint.py --workloads gpt2-serve --allocators xlogrt-vmm-nocache --rounds 1 --steps 12 --out $L > $L/fp.txt 2>&1; echo "rc=$? t=$((SECONDS-t0))" >> $L/fp.txt
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
