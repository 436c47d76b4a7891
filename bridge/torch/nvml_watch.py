# SPDX-License-Identifier: Apache-2.0
"""Runs a real_models.py process and watches the device's memory from outside it (NVML,
polled about every millisecond on a thread of this process). The figure is the device's
used memory at its peak over the baseline the process had once CUDA was initialised
(the child prints READY, this process reads the baseline, then lets it go on), so the
CUDA context and the libraries' handles are not counted.

    run_measured(cmd, env, device=0) -> (result dict, peak bytes over the baseline)

The device must run nothing else meanwhile: NVML's used memory is the device's.
"""
import json
import subprocess
import threading
import time


class Watch:
    def __init__(self, device=0, interval=0.001):
        import pynvml
        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        self._interval = interval
        self._stop = threading.Event()
        self.peak = 0
        self.samples = 0
        self._thread = None

    def used(self):
        return self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used

    def start(self):
        self.peak = self.used()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            u = self.used()
            if u > self.peak:
                self.peak = u
            self.samples += 1
            time.sleep(self._interval)

    def stop(self):
        self._stop.set()
        self._thread.join()
        u = self.used()
        if u > self.peak:
            self.peak = u
        return self.peak


def run_measured(cmd, env, device=0, timeout=900):
    """Runs cmd (a real_models.py command with --handshake); returns its JSON result and
    the device's peak used memory over the baseline, in bytes."""
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    line = p.stdout.readline()
    if line.strip() != "READY":
        out, err = p.communicate(timeout=timeout)
        raise RuntimeError(f"{' '.join(cmd)}: no READY ({line!r}):\n{(out + err)[-3000:]}")
    w = Watch(device)
    baseline = w.used()
    w.start()
    p.stdin.write("go\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=timeout)
    peak = w.stop()
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{err[-3000:]}")
    result = json.loads(lines[-1])
    result["nvml_samples"] = w.samples
    result["nvml_baseline"] = baseline
    return result, peak - baseline
