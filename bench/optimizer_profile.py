"""Where a compiled optimizer step's time goes: host time per call (no sync) and the GPU kernels
torch.profiler sees, for kiln compiling AdamW's step over BERT-base's parameters."""
import time

import torch
import transformers as T

import kiln

params = list(T.BertModel(T.BertConfig()).cuda().parameters())
for p in params:
    p.grad = torch.randn_like(p)
opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
fn = kiln.compile(lambda: opt.step())
for _ in range(3):
    fn()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(20):
    fn()
host = (time.perf_counter() - t0) / 20
torch.cuda.synchronize()
print(f"host per call (no sync): {host * 1e3:.3f} ms; stats: {kiln.stats()['kernels_generated']} kernels")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]) as prof:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
