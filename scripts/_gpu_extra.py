import torch, kiln, time
# dynamic floats on CUDA and a training step with a custom Function
def f(x, s): return torch.softmax(x * s, -1)
cf = kiln.compile(f)
x = torch.randn(64, 1000, device="cuda")
for s in [0.5, 0.7, 0.9, 1.1]:
    torch.testing.assert_close(cf(x, s), f(x, s))
print("floats graphs", kiln.stats()["graphs_compiled"], kiln.stats()["eager_fallbacks"])
try:
    from transformers import BloomConfig, BloomForCausalLM
    torch.manual_seed(0)
    cfg = BloomConfig(vocab_size=100, hidden_size=64, n_layer=2, n_head=4)
    m = BloomForCausalLM(cfg).cuda().train(); ref = BloomForCausalLM(cfg).cuda().train(); ref.load_state_dict(m.state_dict())
    for mod in list(m.modules()) + list(ref.modules()):
        if isinstance(mod, torch.nn.Dropout): mod.p = 0.0
    kiln.reset(); cm = kiln.compile(m)
    ids = torch.randint(0, 100, (2, 16), device="cuda")
    o = cm(input_ids=ids, labels=ids); o.loss.backward(); r = ref(input_ids=ids, labels=ids); r.loss.backward()
    print("bloom loss", o.loss.item(), r.loss.item(), "max grad diff", max((p.grad - q.grad).abs().max().item() for p, q in zip(m.parameters(), ref.parameters())), kiln.stats()["graphs_compiled"], kiln.stats()["graph_breaks"], kiln.stats()["fallback_reasons"])
except Exception as e:
    print("bloom", type(e).__name__, e)
