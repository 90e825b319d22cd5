"""Hugging Face transformers models, small random configs: one graph, no break, eager's outputs.

The models run as transformers ships them: the forward decorators (config defaults, output
capture with its context variable and try/finally), the attention-implementation registry,
mask helpers and the ModelOutput dataclasses are captured, not patched. The causal LMs run with
use_cache at its default: the DynamicCache their forward builds is an object made during capture
(its __init__ inlined, its layers updated in the graph) and handed out built for real. A decoding
step given a cache made outside (as generate() makes it) is captured: the cache's layers are
updated by attribute stores that kiln replays after the graph.
"""
import copy

import pytest
import torch

import kiln

T = pytest.importorskip("transformers")

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]

VOCAB = 96


def _config(name):
    if name == "bert":
        return T.BertModel, T.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=128)
    if name == "distilbert":
        return T.DistilBertModel, T.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                                     max_position_embeddings=128)
    if name == "roberta":
        return T.RobertaModel, T.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=64, max_position_embeddings=66)
    if name == "gpt2":
        return T.GPT2LMHeadModel, T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                               bos_token_id=0, eos_token_id=0)
    if name == "t5":
        return T.T5Model, T.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                     use_cache=False)
    if name == "llama":
        return T.LlamaForCausalLM, T.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 max_position_embeddings=128)
    raise ValueError(name)


def _inputs(name, batch, seq, device, mask):
    kw = {"input_ids": torch.randint(0, VOCAB, (batch, seq), device=device)}
    if mask:
        m = torch.ones(batch, seq, dtype=torch.long, device=device)
        m[0, seq // 2:] = 0  # padding in the first sequence
        kw["attention_mask"] = m
    if name == "t5":
        kw["decoder_input_ids"] = torch.randint(0, VOCAB, (batch, max(seq - 3, 1)), device=device)
    return kw


def _tensors(out):
    return [v for v in out.to_tuple() if isinstance(v, torch.Tensor)]


MODELS = ["bert", "distilbert", "roberta", "gpt2", "t5", "llama"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_model_one_graph_equal_to_eager(name, device):
    cls, cfg = _config(name)
    torch.manual_seed(0)
    model = cls(cfg).to(device).eval()
    with torch.no_grad():
        kw = _inputs(name, 2, 8, device, mask=False)
        e = kiln.explain(model)(**kw)
        assert e.graph_count == 1 and not e.break_reasons, e
        compiled = kiln.compile(model, fullgraph=True)
        # float32 throughout; GPU matmuls without TF32 for the comparison
        tol = 1e-4
        for batch, seq, mask in [(2, 8, False), (2, 8, True), (3, 5, False)]:
            kw = _inputs(name, batch, seq, device, mask)
            ref = model(**kw)
            out = compiled(**kw)
            assert type(out) is type(ref)
            assert list(out.keys()) == list(ref.keys())
            for a, b in zip(_tensors(out), _tensors(ref)):
                torch.testing.assert_close(a, b, rtol=tol, atol=tol)
            if name in ("gpt2", "llama"):  # the cache made inside forward, handed out for real
                cache, ref_cache = out.past_key_values, ref.past_key_values
                assert type(cache) is type(ref_cache) and len(cache.layers) == len(ref_cache.layers)
                for a, b in zip(cache.layers, ref_cache.layers):
                    assert type(a) is type(b) and vars(a).keys() == vars(b).keys()
                    torch.testing.assert_close(a.keys, b.keys, rtol=tol, atol=tol)
                    torch.testing.assert_close(a.values, b.values, rtol=tol, atol=tol)
                assert cache.get_seq_length() == ref_cache.get_seq_length()


def test_bert_return_dict_false_and_tuple_indexing():
    cls, cfg = _config("bert")
    model = cls(cfg).eval()

    def f(ids, mask):
        out = model(input_ids=ids, attention_mask=mask)
        return out[0].sum(-1) + out["pooler_output"].mean(-1, keepdim=True), model(input_ids=ids, return_dict=False)

    ids = torch.randint(0, VOCAB, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    with torch.no_grad():
        e = kiln.explain(f)(ids, mask)
        assert e.graph_count == 1 and not e.break_reasons, e
        ref, out = f(ids, mask), kiln.compile(f)(ids, mask)
        torch.testing.assert_close(out[0], ref[0], rtol=1e-4, atol=1e-4)
        assert isinstance(out[1], tuple) and len(out[1]) == len(ref[1])
        for a, b in zip(out[1], ref[1]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_embedding_index_out_of_range_raises_like_eager():
    cls, cfg = _config("bert")
    model = cls(cfg).eval()
    compiled = kiln.compile(model)
    with torch.no_grad():
        compiled(input_ids=torch.randint(0, VOCAB, (1, 4)))
        bad = torch.full((1, 4), VOCAB + 5)
        with pytest.raises(IndexError) as eager:
            model(input_ids=bad)
        with pytest.raises(IndexError) as ours:
            compiled(input_ids=bad)
        assert str(ours.value) == str(eager.value)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoding_step_with_a_kv_cache_is_one_graph(name, device):
    cls, cfg = _config(name)
    torch.manual_seed(0)
    model = cls(cfg).to(device).eval()
    compiled = kiln.compile(model, fullgraph=True)
    with torch.no_grad():
        prompt = torch.randint(0, VOCAB, (2, 6), device=device)
        cache_eager = model(prompt, use_cache=True).past_key_values  # the prompt pass, eagerly
        cache_kiln = copy.deepcopy(cache_eager)
        step = torch.randint(0, VOCAB, (2, 1), device=device)
        e = kiln.explain(model)(step, past_key_values=copy.deepcopy(cache_eager), use_cache=True)
        assert e.graph_count == 1 and not e.break_reasons, e
        for _ in range(3):  # each step grows the cache by one position (a recompile per length)
            ref = model(step, past_key_values=cache_eager, use_cache=True)
            out = compiled(step, past_key_values=cache_kiln, use_cache=True)
            torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-4)
            assert out.past_key_values is cache_kiln
            for a, b in zip(cache_kiln.layers, cache_eager.layers):
                torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(a.values, b.values, rtol=1e-4, atol=1e-4)
            step = ref.logits[:, -1:].argmax(-1)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_again_with_a_new_cache_object_reuses_the_compiled_steps(name):
    # generate() makes a new DynamicCache each time: kiln guards it by type and by what the
    # forward reads from it, not by identity, so an identical second generate() compiles nothing.
    cls, cfg = _config(name)
    torch.manual_seed(0)
    model = cls(cfg).eval()
    model.generation_config.pad_token_id = 0
    eager_forward = model.forward
    prompt = torch.randint(1, VOCAB, (1, 5))
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=4, do_sample=False, use_cache=True)
        model.forward = kiln.compile(eager_forward)
        try:
            first = model.generate(prompt, max_new_tokens=4, do_sample=False, use_cache=True)
            before = kiln.stats()
            second = model.generate(prompt, max_new_tokens=4, do_sample=False, use_cache=True)
            after = kiln.stats()
        finally:
            model.forward = eager_forward
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert after["frames_captured"] == before["frames_captured"], after["recompile_reasons"][-3:]
    assert after["eager_fallbacks"] == before["eager_fallbacks"]
    assert after["cache_hits_memory"] > before["cache_hits_memory"]


def _generate_compiled(model, prompt, **kw):
    """generate() with the forward compiled, as Hugging Face documents it for torch.compile:
    the tokens of two calls and what each call compiled."""
    eager_forward = model.forward
    model.forward = kiln.compile(eager_forward)
    try:
        s0 = kiln.stats()
        first = model.generate(prompt, **kw)
        s1 = kiln.stats()
        second = model.generate(prompt, **kw)
        s2 = kiln.stats()
    finally:
        model.forward = eager_forward
    return first, second, s0, s1, s2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_64_tokens_compiles_at_most_three_entries(name, device, cache):
    # Dynamic cache: prefill (prompt length) and decode (cache length growing each step) are
    # shape-generic, the lengths becoming symbols after the first size change. Static cache:
    # updated in place (index_copy_ into its tensors, a position counter add_); kiln updates out
    # of place in the graph and copies into the caller's tensors after it.
    cls, cfg = _config(name)
    torch.manual_seed(0)
    model = cls(cfg).to(device).eval()
    model.generation_config.pad_token_id = 0
    prompt = torch.randint(1, VOCAB, (1, 16), device=device)
    kw = dict(max_new_tokens=64, min_new_tokens=64, do_sample=False)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        expected = model.generate(prompt, **kw)
        first, second, s0, s1, s2 = _generate_compiled(model, prompt, **kw)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert s1["frames_captured"] - s0["frames_captured"] <= 3, s1["recompile_reasons"][-3:]
    assert s2["frames_captured"] == s1["frames_captured"], s2["recompile_reasons"][-3:]
    assert s2["eager_fallbacks"] == s0["eager_fallbacks"] and s2["graph_breaks"] == s0["graph_breaks"]


def _encoder_decoder(name):
    if name == "t5":
        return T.T5ForConditionalGeneration, T.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                        num_heads=4, decoder_start_token_id=0, pad_token_id=0)
    return T.BartForConditionalGeneration, T.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["t5", "bart"])
def test_encoder_decoder_with_its_cache_is_one_graph(name, device):
    # use_cache at its default: the decoder builds an EncoderDecoderCache of two DynamicCaches,
    # whose config is a copy of the legacy flat config edited for the decoder (copy.deepcopy)
    cls, cfg = _encoder_decoder(name)
    torch.manual_seed(0)
    model = cls(cfg).to(device).eval()
    with torch.no_grad():
        ids = torch.randint(3, VOCAB, (2, 8), device=device)
        dec = torch.randint(3, VOCAB, (2, 5), device=device)
        e = kiln.explain(model)(input_ids=ids, decoder_input_ids=dec)
        assert e.graph_count == 1 and not e.break_reasons, e
        compiled = kiln.compile(model, fullgraph=True)
        for b, s, t in [(2, 8, 5), (2, 8, 5), (3, 6, 4)]:
            ids = torch.randint(3, VOCAB, (b, s), device=device)
            dec = torch.randint(3, VOCAB, (b, t), device=device)
            ref, out = model(input_ids=ids, decoder_input_ids=dec), compiled(input_ids=ids, decoder_input_ids=dec)
            assert list(out.keys()) == list(ref.keys())
            torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out.encoder_last_hidden_state, ref.encoder_last_hidden_state, rtol=1e-4, atol=1e-4)
            cache, ref_cache = out.past_key_values, ref.past_key_values
            assert type(cache) is type(ref_cache)
            for part in ("self_attention_cache", "cross_attention_cache"):
                for a, r in zip(getattr(cache, part).layers, getattr(ref_cache, part).layers):
                    torch.testing.assert_close(a.keys, r.keys, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("mask", [False, True])
def test_causal_lm_over_ten_shapes_compiles_at_most_twice(name, device, mask):
    cls, cfg = _config(name)
    torch.manual_seed(0)
    model = cls(cfg).to(device).eval()
    kiln.reset()
    compiled = kiln.compile(model)
    with torch.no_grad():
        for b, s in [(2, 8), (3, 5), (4, 9), (2, 17), (5, 3), (3, 33), (2, 2), (6, 12), (3, 20), (7, 7)]:
            kw = _inputs(name, b, s, device, mask)
            ref, out = model(**kw), compiled(**kw)
            torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-4)
    st = kiln.stats()
    assert st["graphs_compiled"] <= 2 and st["eager_fallbacks"] == 0, st["recompile_reasons"][-3:]


def _family(name):
    kw = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)
    if name == "qwen2":
        return T.Qwen2ForCausalLM, T.Qwen2Config(**kw)
    if name == "phi3":
        return T.Phi3ForCausalLM, T.Phi3Config(pad_token_id=0, **kw)
    if name == "gpt_neox":
        return T.GPTNeoXForCausalLM, T.GPTNeoXConfig(**kw)
    if name == "opt":
        return T.OPTForCausalLM, T.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, word_embed_proj_dim=32,
                                             num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128)
    if name == "gemma":
        return T.GemmaForCausalLM, T.GemmaConfig(head_dim=8, **kw)
    if name == "mistral":  # a sliding window: its cache layers count positions in a Python int
        return T.MistralForCausalLM, T.MistralConfig(**kw)
    if name == "gemma2":
        return T.Gemma2ForCausalLM, T.Gemma2Config(head_dim=8, **kw)
    raise ValueError(name)


@pytest.mark.parametrize("name", ["qwen2", "phi3", "gpt_neox", "opt", "gemma", "mistral", "gemma2"])
def test_other_decoder_families_are_one_graph_and_generate_in_three_entries(name):
    cls, cfg = _family(name)
    torch.manual_seed(0)
    model = cls(cfg).eval()
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        ids = torch.randint(1, VOCAB, (2, 8))
        e = kiln.explain(model)(ids)
        assert e.graph_count == 1 and not e.break_reasons, e
        torch.testing.assert_close(kiln.compile(model)(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
        prompt = torch.randint(1, VOCAB, (1, 16))
        kw = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False)
        expected = model.generate(prompt, **kw)
        first, second, s0, s1, s2 = _generate_compiled(model, prompt, **kw)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert s1["frames_captured"] - s0["frames_captured"] <= 3 and s2["frames_captured"] == s1["frames_captured"]
    assert s2["eager_fallbacks"] == s0["eager_fallbacks"]
