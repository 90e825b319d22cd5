"""Regression sweep over real models (CPU, tiny random configs): kiln against eager.

Hugging Face transformers families built from tiny configs (hidden 32, 2 layers) and torchvision
classifiers at 64x64 (or the least size they take):

* eval forward under no_grad: ``kiln.compile(model)`` against the model itself, two calls with
  other input values and a call at a second shape; the graphs/breaks of ``kiln.explain`` are
  recorded (and compared with ``torch._dynamo.explain`` for a subset: kiln may have fewer, never
  more), and so are the compiles the three calls made;
* one training step (train mode with every dropout at 0: loss, backward, AdamW step, and the
  loss of a second step), compiled against eager: losses, gradients and the stepped parameters;
* for causal LMs and encoder-decoders, greedy ``generate(max_new_tokens=5)`` with the forward
  compiled (``model.forward = kiln.compile(model.forward)``, as Hugging Face documents it for
  torch.compile) and through ``kiln.compile(model).generate``: the tokens must be eager's.

A case kiln gets wrong is xfail(strict=True) with the reason.
"""
import copy

import pytest
import torch
import torch._dynamo

import kiln

T = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("quiet_fallbacks")

VOCAB = 96
H = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
DEC = dict(vocab_size=VOCAB, num_key_value_heads=2, max_position_embeddings=64, **H)
S2S = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
           decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)


def _no_dropout(cfg):
    """Every dropout, layer drop, drop path and SpecAugment probability of a config at 0, so that
    train mode computes the same thing eagerly and compiled."""
    def clear(c):
        for k, v in list(vars(c).items()):
            if isinstance(v, float) and any(w in k for w in ("drop", "mask_time_prob", "mask_feature_prob")):
                setattr(c, k, 0.0)
            elif isinstance(v, T.PretrainedConfig):
                clear(v)
    clear(cfg)
    return cfg


def _hf(name):
    """(model class, config, kind) for a family."""
    if name == "bert":
        return T.BertForSequenceClassification, T.BertConfig(vocab_size=VOCAB, max_position_embeddings=64, **H), "enc"
    if name == "roberta":
        return T.RobertaForSequenceClassification, T.RobertaConfig(vocab_size=VOCAB, max_position_embeddings=66,
                                                                   **H), "enc"
    if name == "distilbert":
        return T.DistilBertForSequenceClassification, T.DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64), "enc"
    if name == "albert":
        return T.AlbertForSequenceClassification, T.AlbertConfig(vocab_size=VOCAB, embedding_size=16,
                                                                 max_position_embeddings=64, **H), "enc"
    if name == "electra":
        return T.ElectraForSequenceClassification, T.ElectraConfig(vocab_size=VOCAB, embedding_size=16,
                                                                   max_position_embeddings=64, **H), "enc"
    if name == "deberta_v2":
        return T.DebertaV2ForSequenceClassification, T.DebertaV2Config(
            vocab_size=VOCAB, max_position_embeddings=64, relative_attention=True, position_buckets=16,
            pos_att_type=["p2c", "c2p"], **H), "enc"
    if name == "mobilebert":
        return T.MobileBertForSequenceClassification, T.MobileBertConfig(
            vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=32, intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=2,
            max_position_embeddings=64), "enc"
    if name == "gpt2":
        return T.GPT2LMHeadModel, T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                               bos_token_id=0, eos_token_id=0), "lm"
    if name == "gpt_neox":
        return T.GPTNeoXForCausalLM, T.GPTNeoXConfig(**DEC), "lm"
    if name == "llama":
        return T.LlamaForCausalLM, T.LlamaConfig(**DEC), "lm"
    if name == "mistral":
        return T.MistralForCausalLM, T.MistralConfig(**DEC), "lm"
    if name == "qwen2":
        return T.Qwen2ForCausalLM, T.Qwen2Config(**DEC), "lm"
    if name == "phi3":
        return T.Phi3ForCausalLM, T.Phi3Config(pad_token_id=0, **DEC), "lm"
    if name == "gemma":
        return T.GemmaForCausalLM, T.GemmaConfig(head_dim=8, **DEC), "lm"
    if name == "opt":
        return T.OPTForCausalLM, T.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, word_embed_proj_dim=32,
                                             num_hidden_layers=2, num_attention_heads=4,
                                             max_position_embeddings=64), "lm"
    if name == "bloom":
        return T.BloomForCausalLM, T.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4), "lm"
    if name == "t5":
        return T.T5ForConditionalGeneration, T.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                        num_heads=4, decoder_start_token_id=0, pad_token_id=0), "s2s"
    if name == "bart":
        return T.BartForConditionalGeneration, T.BartConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                                            decoder_start_token_id=2, **S2S), "s2s"
    if name == "mbart":
        return T.MBartForConditionalGeneration, T.MBartConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                                              decoder_start_token_id=2, **S2S), "s2s"
    if name == "whisper":
        return T.WhisperForConditionalGeneration, T.WhisperConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
            max_source_positions=16, max_target_positions=32, pad_token_id=1, bos_token_id=0, eos_token_id=2,
            decoder_start_token_id=3, suppress_tokens=[], begin_suppress_tokens=[]), "whisper"
    if name == "vit":
        return T.ViTForImageClassification, T.ViTConfig(image_size=32, patch_size=8, num_channels=3, num_labels=3,
                                                        **H), "img"
    if name == "swin":
        return T.SwinForImageClassification, T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                                          num_heads=[2, 4], window_size=4, num_labels=3), "img"
    if name == "convnext":
        return T.ConvNextForImageClassification, T.ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[16, 32],
                                                                  depths=[1, 1], num_labels=3), "img"
    if name == "clip":
        return T.CLIPModel, T.CLIPConfig(
            text_config=dict(vocab_size=VOCAB, max_position_embeddings=32, **H),
            vision_config=dict(image_size=32, patch_size=8, **H), projection_dim=16), "clip"
    if name == "wav2vec2":
        return T.Wav2Vec2ForCTC, T.Wav2Vec2Config(
            vocab_size=VOCAB, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4, ctc_loss_reduction="mean", pad_token_id=0, **H), "audio"
    raise ValueError(name)


def _inputs(name, kind, batch, seq, train=False):
    """Inputs for one call (labels included, so the model computes its loss)."""
    g = torch.Generator().manual_seed(batch * 100 + seq + (7 if train else 0) + int(torch.randint(0, 1000, ())))
    ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq - 2:] = 0  # padding at the end of the first sequence
    if kind == "enc":
        return dict(input_ids=ids, attention_mask=mask, labels=torch.randint(0, 2, (batch,), generator=g))
    if kind == "lm":
        return dict(input_ids=ids, attention_mask=mask, labels=ids)
    if kind == "s2s":
        return dict(input_ids=ids, attention_mask=mask, labels=torch.randint(3, VOCAB, (batch, seq - 2), generator=g))
    if kind == "whisper":
        return dict(input_features=torch.randn(batch, 8, 32, generator=g),
                    labels=torch.randint(3, VOCAB, (batch, seq - 2), generator=g))
    if kind == "img":
        return dict(pixel_values=torch.randn(batch, 3, 32, 32, generator=g), labels=torch.randint(0, 3, (batch,),
                                                                                                    generator=g))
    if kind == "clip":
        return dict(input_ids=ids, attention_mask=mask, pixel_values=torch.randn(batch, 3, 32, 32, generator=g),
                    return_loss=True)
    if kind == "audio":
        labels = torch.randint(1, VOCAB, (batch, 4), generator=g)
        labels[0, 3] = -100
        return dict(input_values=torch.randn(batch, 40 * seq, generator=g), labels=labels)
    raise ValueError(kind)


def _tensors(x):
    """The tensors of an output, in order: ModelOutputs, tuples, and the caches' keys and values."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):  # ModelOutput too
        return [t for v in x.values() for t in _tensors(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if hasattr(x, "self_attention_cache"):
        return _tensors(x.self_attention_cache) + _tensors(x.cross_attention_cache)
    if hasattr(x, "layers"):
        return [t for layer in x.layers for t in _tensors([getattr(layer, "keys", None), getattr(layer, "values",
                                                                                                   None)])]
    return []


def _close(out, ref, tol):
    a, b = _tensors(out), _tensors(ref)
    assert type(out) is type(ref)
    assert len(a) == len(b), (len(a), len(b))
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=tol, atol=tol)


def _build(name):
    cls, cfg, kind = _hf(name)
    torch.manual_seed(0)
    return cls(_no_dropout(cfg)), kind


# reasons for the cases kiln gets wrong (filled in by the sweep)
XFAIL_EVAL = {
    "wav2vec2": "8 graph breaks against TorchDynamo's 3 (4 graphs each): the CTC loss's `with "
                "torch.backends.cudnn.flags(...)` breaks twice (the with, then contextlib's next()) where Dynamo "
                "captures it, and ModelOutput.__post_init__/__setitem__ run after the break add 4 more "
                "(OrderedDict.__setitem__ with tensor arguments, item assignment into an object the caller can see)",
}
XFAIL_TRAIN = {
    "wav2vec2": "recompiles at every call until the cache limit, then runs eagerly: the resume function after "
                "`with torch.backends.cudnn.flags(...)` guards the _GeneratorContextManager's generator by identity "
                "(ID_MATCH ... .gen is <generator object>), CompileableContextVar.reset guards its ContextVar Token "
                "by identity; and 21 breaks against Dynamo's 6 (config __getattribute__ frames that raise "
                "AttributeError are counted as breaks)",
}
XFAIL_GEN = {}


def _mark(name, table):
    if name in table:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=table[name]))
    return name


HF_ALL = ["bert", "roberta", "distilbert", "albert", "electra", "deberta_v2", "mobilebert", "gpt2", "gpt_neox",
          "llama", "mistral", "qwen2", "phi3", "gemma", "opt", "bloom", "t5", "bart", "mbart", "whisper", "vit",
          "swin", "convnext", "clip", "wav2vec2"]
# the subset whose graphs and breaks are compared with TorchDynamo's
DYNAMO_SUBSET = {"bert", "deberta_v2", "gpt2", "bloom", "t5", "whisper", "swin", "clip", "wav2vec2"}


@pytest.mark.parametrize("name", [_mark(n, XFAIL_EVAL) for n in HF_ALL])
def test_hf_eval_forward(name):
    model, kind = _build(name)
    model.eval()
    kiln.reset()
    with torch.no_grad():
        e = kiln.explain(model)(**_inputs(name, kind, 2, 8))
        compiled = kiln.compile(model)
        s0 = kiln.stats()
        for batch, seq in [(2, 8), (2, 8), (3, 6)]:
            kw = _inputs(name, kind, batch, seq)
            _close(compiled(**kw), model(**kw), 1e-4)
        s1 = kiln.stats()
    # the first shape once, the second shape once (a shape-generic entry)
    assert s1["frames_captured"] - s0["frames_captured"] <= 2 * e.graph_count, s1["recompile_reasons"][-4:]
    if e.graph_count == 1:  # and nothing run eagerly
        assert s1["eager_fallbacks"] == s0["eager_fallbacks"], s1["fallback_reasons"]
    if name in DYNAMO_SUBSET:
        torch._dynamo.reset()
        with torch.no_grad():
            d = torch._dynamo.explain(model)(**_inputs(name, kind, 2, 8))
        torch._dynamo.reset()
        assert e.graph_count <= d.graph_count and e.graph_break_count <= d.graph_break_count, (e, d.break_reasons)
    else:
        assert e.graph_count == 1 and not e.break_reasons, e


def _train_steps(model, kind, name, fn, steps=2):
    # eps well above float32's noise on gradients that are 0 in exact arithmetic (a key bias
    # under softmax), which Adam's first steps would otherwise blow up to the learning rate
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6)
    losses, grads = [], None
    for i in range(steps):
        torch.manual_seed(i)
        kw = _inputs(name, kind, 2, 8, train=True)
        out = fn(**kw)
        loss = out.loss
        loss.backward()
        if grads is None:
            grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses, grads


def _grads_close(grads, exp_grads):
    """float32 tolerance: relative to each gradient, and absolute relative to the model's largest
    gradient (a gradient that is 0 in exact arithmetic is rounding noise in both)."""
    scale = max(g.abs().max().item() for g in exp_grads.values())
    for k in exp_grads:
        torch.testing.assert_close(grads[k], exp_grads[k], rtol=1e-3, atol=1e-5 * scale + 1e-8,
                                   msg=lambda m: f"{k}: {m}")


@pytest.mark.parametrize("name", [_mark(n, XFAIL_TRAIN) for n in HF_ALL])
def test_hf_training_step(name):
    ref, kind = _build(name)
    model = copy.deepcopy(ref)
    ref.train()
    model.train()
    kiln.reset()
    s0 = kiln.stats()
    exp_losses, exp_grads = _train_steps(ref, kind, name, ref)
    losses, grads = _train_steps(model, kind, name, kiln.compile(model))
    s1 = kiln.stats()
    for a, b in zip(losses, exp_losses):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert grads.keys() == exp_grads.keys()
    _grads_close(grads, exp_grads)
    for (k, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4, msg=lambda m: f"{k}: {m}")  # a tenth of lr
    assert s1["eager_fallbacks"] == s0["eager_fallbacks"], s1["fallback_reasons"]
    assert s1["backward_graphs_compiled"] > s0["backward_graphs_compiled"]


GEN = ["gpt2", "gpt_neox", "llama", "mistral", "qwen2", "phi3", "gemma", "opt", "bloom", "t5", "bart", "mbart",
       "whisper"]


def _gen_inputs(kind):
    torch.manual_seed(1)
    if kind == "whisper":
        return dict(input_features=torch.randn(1, 8, 32))
    return dict(input_ids=torch.randint(3, VOCAB, (1, 6)))


@pytest.mark.parametrize("name", [_mark(n, XFAIL_GEN) for n in GEN])
def test_hf_greedy_generate(name):
    model, kind = _build(name)
    model.eval()
    model.generation_config.pad_token_id = model.config.pad_token_id or 0
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, **_gen_inputs(kind))
    kiln.reset()
    with torch.no_grad():
        expected = model.generate(**kw)
        # the compiled module's generate() is the model's own, its forward calls kiln's
        assert torch.equal(kiln.compile(model).generate(**kw), expected)
        eager_forward = model.forward
        model.forward = kiln.compile(eager_forward)
        try:
            s0 = kiln.stats()
            first = model.generate(**kw)
            s1 = kiln.stats()
            second = model.generate(**kw)
            s2 = kiln.stats()
        finally:
            model.forward = eager_forward
    assert torch.equal(first, expected), (first, expected)
    assert torch.equal(second, expected), (second, expected)
    assert s1["eager_fallbacks"] == s0["eager_fallbacks"], s1["fallback_reasons"]
    assert s1["frames_captured"] - s0["frames_captured"] <= 3, s1["recompile_reasons"][-4:]
    assert s2["frames_captured"] == s1["frames_captured"], s2["recompile_reasons"][-3:]


# ---------------------------------------------------------------------------------------------
# torchvision classifiers, batch 2

TV = [("resnet18", 64), ("mobilenet_v3_small", 64), ("efficientnet_b0", 64), ("regnet_y_400mf", 64),
      ("vit_b_16", 32), ("convnext_tiny", 64), ("shufflenet_v2_x0_5", 64), ("squeezenet1_1", 64),
      ("densenet121", 64), ("googlenet", 64)]
XFAIL_TV_EVAL = {}
XFAIL_TV_TRAIN = {
    # In float64 kiln's gradients equal eager's to 2e-12: the logic is right. torch's CPU batch
    # norm accumulates its statistics and backward sums in float64 (acc_type<float> on the CPU is
    # double); kiln's sums are float32, which BN over 8 values per channel amplifies ~50x.
    "regnet_y_400mf": "float32 gradients ~50x further from float64 than eager's (0.8% vs 0.014%): torch's CPU batch "
                      "norm accumulates in float64, kiln's reductions in float32 (float64 runs agree to 2e-12)",
}


def _tv(name, size):
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    kw = {"num_classes": 10}
    if name == "vit_b_16":  # a smaller ViT: 32x32 images of 16x16 patches, 2 layers of width 64
        return tv.models.VisionTransformer(image_size=size, patch_size=16, num_layers=2, num_heads=2,
                                           hidden_dim=64, mlp_dim=128, num_classes=10)
    if name == "googlenet":
        kw.update(aux_logits=False, init_weights=False)
    return getattr(tv.models, name)(**kw)


def _tv_mark(cases, table):
    return [pytest.param(n, s, marks=pytest.mark.xfail(strict=True, reason=table[n])) if n in table else (n, s)
            for n, s in cases]


def _no_tv_dropout(m):
    for mod in m.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
        if hasattr(mod, "stochastic_depth_prob"):
            mod.stochastic_depth_prob = 0.0
        if type(mod).__name__ == "StochasticDepth":
            mod.p = 0.0
    return m


@pytest.mark.parametrize("name,size", _tv_mark(TV, XFAIL_TV_EVAL))
def test_torchvision_eval_forward(name, size):
    m = _tv(name, size).eval()
    kiln.reset()
    with torch.no_grad():
        x = torch.randn(2, 3, size, size)
        e = kiln.explain(m)(x)
        assert e.graph_count == 1 and not e.break_reasons, e
        compiled = kiln.compile(m)
        for _ in range(2):
            x = torch.randn(2, 3, size, size)
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
    assert kiln.stats()["eager_fallbacks"] == 0


def _err(a, ref64):
    return (a.detach().double() - ref64.detach()).abs().max().item()


@pytest.mark.parametrize("name,size", _tv_mark(TV, XFAIL_TV_TRAIN))
def test_torchvision_training_step(name, size):
    # Batch norm over batch 2 at 64x64 is ill-conditioned (deep layers normalize over 8 values),
    # so float32 results are judged against a float64 run: kiln's error may be at most a few times
    # eager's. The second step then compares kiln with an eager copy of kiln's own updated model.
    F = torch.nn.functional
    ref = _no_tv_dropout(_tv(name, size)).train()
    model, ref64 = copy.deepcopy(ref), copy.deepcopy(ref).double()
    compiled = kiln.compile(model)
    kiln.reset()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, size, size, generator=g), torch.randint(0, 10, (2,), generator=g)
    l64 = F.cross_entropy(ref64(x.double()), y)
    l64.backward()
    le = F.cross_entropy(ref(x), y)
    le.backward()
    lk = F.cross_entropy(compiled(x), y)
    lk.backward()
    assert _err(lk, l64) <= 10 * _err(le, l64) + 1e-6 * abs(l64.item()), (lk, le, l64)
    scale = max(p.grad.abs().max().item() for p in ref64.parameters())
    for (k, p), q, p64 in zip(model.named_parameters(), ref.parameters(), ref64.parameters()):
        assert _err(p.grad, p64.grad) <= 10 * _err(q.grad, p64.grad) + 1e-6 * scale, k
    for (k, b), c, b64 in zip(model.named_buffers(), ref.buffers(), ref64.buffers()):  # running statistics
        if b.is_floating_point():
            assert _err(b, b64) <= 10 * _err(c, b64) + 1e-6, k
        else:
            assert torch.equal(b, c), k
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6)
    opt.step()
    opt.zero_grad()
    x, y = torch.randn(2, 3, size, size, generator=g), torch.randint(0, 10, (2,), generator=g)
    probe = copy.deepcopy(model)
    exp = probe(x)
    out = compiled(x)
    torch.testing.assert_close(out, exp, rtol=1e-4, atol=1e-4)
    F.cross_entropy(out, y).backward()
    assert all(p.grad is not None for p in model.parameters())
    for (k, b), c in zip(model.named_buffers(), probe.buffers()):
        torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")
    assert kiln.stats()["eager_fallbacks"] == 0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torchvision_training_step_with_torch_ops_backend(backend):
    ref = _tv("resnet18", 64).train()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 3, 64, 64)
    ref(x).sum().backward()
    kiln.compile(model, backend=backend)(x).sum().backward()
    for (k, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")
