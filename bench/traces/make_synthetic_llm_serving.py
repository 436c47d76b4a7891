#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes SYNTHETIC-llm-serving.csv.gz: a SYNTHETIC allocation log shaped like LLM serving.

It was not recorded from a real program. It stands in for real traces (XLOGRT_LOG_FILE of
PyTorch runs on the GPU) until those are committed next to it, in the same format: the
CSV that Logging's FileSink writes (Thread,Time,Action,Pointer,Size,Stream,Tag).

The shape, after a GPT-2-medium-like model served with Hugging Face `generate`, scaled
down to keep the file small (12 layers, width 1024, bf16, 16 heads):
- weights (tag 1): allocated first and held to the end, 2-8 MiB per layer tensor and a
  100 MiB embedding;
- requests one after another, batch 1-32 and prompt 16-896 tokens, 16 new tokens each,
  on one of two compute streams (0 and 1, alternating per request);
- a KV cache growing per token (tag 2): each step and layer allocates the key and value
  tensors one token longer and frees the previous ones (torch.cat), all of them freed
  when the request ends;
- activations (tag 3) of varied large sizes per layer and step (hidden states, the
  MLP's 4x width, attention scores of the prefill), freed within the layer or step;
- many small blocks (tag 4, 256 B - 64 KiB: ids, masks, positions, sampling scratch) on
  the compute stream, and input staging blocks on a copy stream (2) from a second
  thread.

usage: make_synthetic_llm_serving.py [out.csv.gz] [--seed N]
"""
import gzip
import random
import sys

LAYERS, WIDTH, HEADS, ELT = 12, 1024, 16, 2
REQUESTS, NEW_TOKENS = 16, 16
MAIN, COPY = 1001, 1002  # thread ids


def main():
    out = "SYNTHETIC-llm-serving.csv.gz"
    seed = 26
    args = sys.argv[1:]
    while args:
        a = args.pop(0)
        if a == "--seed":
            seed = int(args.pop(0))
        else:
            out = a
    rng = random.Random(seed)
    lines = ["Thread,Time,Action,Pointer,Size,Stream,Tag"]
    clock = [0]
    next_ptr = [0x7F0000000000]

    def stamp():
        clock[0] += rng.randint(1, 40)
        us = clock[0]
        s, us = divmod(us, 1_000_000)
        m, s = divmod(s, 60)
        h, m = divmod(m, 60)
        return "%02d:%02d:%02d.%06d" % (10 + h, m, s, us)

    def alloc(size, stream, tag, thread=MAIN):
        p = next_ptr[0]
        next_ptr[0] += (size + 511) // 512 * 512
        lines.append("%d,%s,allocate,0x%x,%d,%d,%d" % (thread, stamp(), p, size, stream, tag))
        return (p, size, stream, tag, thread)

    def free(b, thread=None):
        p, size, stream, tag, t = b
        lines.append("%d,%s,free,0x%x,%d,%d,%d" % (thread or t, stamp(), p, size, stream, tag))

    def small(stream):
        return alloc(rng.choice([256, 512, 1024, 2048, 4096, 8192, 16384, 65536, 24576, 3000, 40000]), stream, 4)

    weights = [alloc(50257 * WIDTH * ELT, 0, 1)]
    for _ in range(LAYERS):
        for size in (3 * WIDTH * WIDTH, WIDTH * WIDTH, 4 * WIDTH * WIDTH, 4 * WIDTH * WIDTH):
            weights.append(alloc(size * ELT, 0, 1))
        weights.append(alloc(4 * WIDTH * ELT, 0, 1))  # norms and biases
    for r in range(REQUESTS):
        stream = r % 2
        batch = rng.randint(1, 32)
        prompt = rng.randint(16, 896)
        staging = [alloc(batch * prompt * 8, 2, 4, COPY), alloc(batch * prompt * 8, 2, 4, COPY)]
        ids = alloc(batch * prompt * 8, stream, 4)
        for b in staging:
            free(b)
        kv = [None] * LAYERS
        for step in range(NEW_TOKENS + 1):
            q = prompt if step == 0 else 1  # tokens this step
            k = prompt + step               # keys so far
            smalls = [small(stream) for _ in range(rng.randint(2, 6))]
            hidden = alloc(batch * q * WIDTH * ELT, stream, 3)
            for layer in range(LAYERS):
                normed = alloc(batch * q * WIDTH * ELT, stream, 3)
                qkv = alloc(batch * q * 3 * WIDTH * ELT, stream, 3)
                free(normed)
                kv_size = batch * HEADS * k * (WIDTH // HEADS) * ELT
                new_kv = (alloc(kv_size, stream, 2), alloc(kv_size, stream, 2))
                if kv[layer] is not None:
                    free(kv[layer][0])
                    free(kv[layer][1])
                kv[layer] = new_kv
                scores = alloc(batch * HEADS * q * k * ELT, stream, 3)
                mask = small(stream)
                probs = alloc(batch * HEADS * q * k * ELT, stream, 3)
                free(scores)
                free(mask)
                attn = alloc(batch * q * WIDTH * ELT, stream, 3)
                free(probs)
                free(qkv)
                up = alloc(batch * q * 4 * WIDTH * ELT, stream, 3)
                act = alloc(batch * q * 4 * WIDTH * ELT, stream, 3)
                free(up)
                down = alloc(batch * q * WIDTH * ELT, stream, 3)
                free(act)
                free(attn)
                free(hidden)
                hidden = down
            logits = alloc(batch * 50257 * 4, stream, 3)
            token = small(stream)
            free(hidden)
            free(logits)
            for b in smalls:
                free(b)
            free(token)
        for pair in kv:
            free(pair[0])
            free(pair[1])
        free(ids)
    for b in weights:
        free(b)
    # mtime 0 and no name in the header: the same bytes every time
    with open(out, "wb") as raw, gzip.GzipFile("", "wb", compresslevel=9, fileobj=raw, mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode())
    print("%s: %d records" % (out, len(lines) - 1))


if __name__ == "__main__":
    main()
