"""Which externs of a bench/train.py row's compiled step hand back results kiln copies into its
planned layout (KILN_LOGS=copies), counted over one step after warm-up.

    KILN_LOGS=copies python bench/copies_probe.py --row bert_8x128 2>&1 | sort | uniq -c | sort -rn
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import train  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--row", default="bert_8x128")
ap.add_argument("--device", default="cuda")
a = ap.parse_args()
import torch  # noqa: E402

import kiln  # noqa: E402

model, inputs, loss_fn, amp = train.build(a.row, a.device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)


def train_step():
    with torch.autocast(device_type=a.device, dtype=amp or torch.float32, enabled=amp is not None):
        loss = loss_fn(model(*inputs))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


step = kiln.compile(train_step)
for _ in range(2):
    step()
torch.cuda.synchronize()
print("---- one step ----", file=sys.stderr, flush=True)
step()
torch.cuda.synchronize()
