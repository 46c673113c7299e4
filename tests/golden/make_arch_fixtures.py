#!/usr/bin/env python3
"""Makes the per-architecture golden fixtures: tiny random HF transformers models saved as GGUF, and
their logits.

For each architecture below this script
  1. builds the HF model (LlamaForCausalLM with llama3 rope scaling, MistralForCausalLM,
     Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM) from a small config, vocabulary 512, in
     fp32 on the CPU, with weights drawn from torch.manual_seed(seed) (see randomize() and
     randomize_gemma3(): scaled so that logits spread over several units and greedy picks are not
     near-ties);
  2. writes it as GGUF with the `gguf` package, F32 tensors, the way llama.cpp's converter lays the
     model out (conversion/llama.py, qwen.py, gemma.py): llama-family Q/K rows permuted from HF's
     rotate-half order to the interleaved pairs llama.cpp's normal RoPE expects; qwen2/qwen3/gemma3
     unpermuted (NeoX RoPE); Llama 3's rope scaling as the rope_freqs.weight tensor of per-frequency
     divisors; Gemma 3's RMSNorm weights (all of them, q/k norms included) shifted by +1, since HF
     computes x * (1 + w) (write_gguf_gemma3());
     plus a byte-level gpt2 vocabulary (the one `osprey make-random-model` generates) so the file is
     a complete model for the CLI too;
  3. runs transformers on fixed token-id sequences: a 32-token greedy continuation with its KV cache,
     then one teacher-forced pass over prompt + continuation, and records for every position the
     log-sum-exp and the top 20 (id, logit) pairs (the format of smollm2_logits.txt, read by
     tests/golden/test_archs.c).

Needs torch, transformers (4.x or 5.x), numpy and gguf; torch is on the lent GPU machine, not here:
  python3 tests/golden/make_arch_fixtures.py [--only NAME[,NAME...]] OUT_DIR
writes OUT_DIR/arch-<name>.gguf and OUT_DIR/arch-<name>_logits.txt (every architecture below, or only
those named); copy them to tests/golden/fixtures/.
`python3 tests/golden/make_arch_fixtures.py --gguf-only OUT_DIR` (numpy + gguf only) writes the GGUF
files from numpy random weights of the same shapes, to check the layout against osprey's loader.
"""
import os
import sys

import numpy as np

VOCAB = 512
N_GEN = 32
TOP = 20
# prompt lengths; ids drawn from numpy's seeded generator over the vocabulary
PROMPT_LENS = [1, 7, 19, 40]

# name -> (HF class, GGUF arch, config kwargs, seed)
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=128, max_position_embeddings=2048,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
ARCHS = {
    # Llama 3.x: llama3 rope scaling; original context 256 puts the 8 frequencies of head_dim 16 in
    # all three bands (kept, interpolated, divided by the factor).
    "llama3": ("LlamaForCausalLM", "llama",
               dict(COMMON, tie_word_embeddings=False,
                    rope=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                              high_freq_factor=4.0, original_max_position_embeddings=256)), 1001),
    # Mistral: arch llama in GGUF; head_dim 32 != hidden / heads (as Mistral-Nemo), key_length set.
    "mistral": ("MistralForCausalLM", "llama",
                dict(COMMON, tie_word_embeddings=False, head_dim=32, sliding_window=None,
                     rope=dict(rope_type="default", rope_theta=1000000.0)), 1002),
    # Qwen2: q/k/v biases, tied output (as Qwen2.5-0.5B), NeoX RoPE.
    "qwen2": ("Qwen2ForCausalLM", "qwen2",
              dict(COMMON, tie_word_embeddings=True, use_sliding_window=False,
                   rope=dict(rope_type="default", rope_theta=1000000.0)), 1003),
    # Qwen3: per-head q/k RMSNorm, head_dim 32 != hidden / heads, untied, NeoX RoPE.
    "qwen3": ("Qwen3ForCausalLM", "qwen3",
              dict(COMMON, tie_word_embeddings=False, head_dim=32, use_sliding_window=False,
                   attention_bias=False, rope=dict(rope_type="default", rope_theta=1000000.0)), 1004),
    # Gemma 3 (text, as gemma-3-270m): 7 layers, every 6th global (layer 5; 0-4 and 6 sliding), a
    # window of 8 tokens so the 40-token prompt and the continuations slide; 1 kv head; head_dim 32
    # != hidden / heads (q-proj 64 -> 128), query_pre_attn_scalar = head_dim (the attention scale
    # llama.cpp uses for every size but 27B); RoPE theta 1e6 on global layers, 10000 on sliding ones
    # (rope.freq_base / rope.freq_base_swa), no scaling; tied output; GELU tanh; no softcapping.
    "gemma3": ("Gemma3ForCausalLM", "gemma3",
               dict(COMMON, num_hidden_layers=7, num_key_value_heads=1, head_dim=32, pad_token_id=0,
                    tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=32,
                    sliding_window=8, sliding_window_pattern=6, attention_bias=False,
                    attn_logit_softcapping=None, final_logit_softcapping=None,
                    rope=dict(rope_type="default", rope_theta=1000000.0), rope_local_base_freq=10000.0), 1005),
}


def head_dim(kw):
    return kw.get("head_dim") or kw["hidden_size"] // kw["num_attention_heads"]


def llama3_factors(rope, dim):
    """rope_freqs.weight as llama.cpp's converter derives it: the divisor of each inverse frequency."""
    import math
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / float(f)
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def permute_rotate_half_to_pairs(w, n_head):
    """HF stores each head's Q/K rows as [first halves..., second halves...] (rotate_half); llama.cpp's
    normal RoPE rotates adjacent pairs. Row j of the half h of a head goes to row 2 j + h."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def byte_vocab(n):
    """osprey make-random-model's generated vocabulary (tools/osprey/cmd_make_random_model.c)."""
    def b2u(b):
        ok = lambda x: 0x21 <= x <= 0x7e or 0xa1 <= x <= 0xac or 0xae <= x <= 0xff
        return chr(b) if ok(b) else chr(0x100 + sum(1 for x in range(b) if not ok(x)))
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [b2u(b) for b in range(256)]
    types = [3, 3, 3] + [1] * 256
    merges = []
    level = [b2u(ord(" "))] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    while len(toks) < n:
        nxt = []
        for s in level:
            for c in "abcdefghijklmnopqrstuvwxyz":
                if len(toks) == n:
                    break
                toks.append(s + c)
                types.append(1)
                merges.append(s + " " + c)
                nxt.append(s + c)
        level = nxt
    return toks, types, merges


def gemma3_layer_types(kw):
    """HF's default schedule (Gemma3TextConfig): layer i is global iff (i + 1) % pattern == 0; the same
    as llama.cpp's set_swa_pattern(6): sliding iff i % 6 < 5."""
    n = kw["sliding_window_pattern"]
    return ["full_attention" if (i + 1) % n == 0 else "sliding_attention" for i in range(kw["num_hidden_layers"])]


def write_gguf_gemma3(path, name, kw, sd):
    """As llama.cpp's converter (conversion/gemma.py Gemma3Model on conversion/base.py TextModel) writes
    a Gemma3ForCausalLM: keys in its order, no vocab_size / rope dimension / sliding_window_pattern key
    (llama.cpp hardcodes the period 6), no rope scaling keys for rope_type default, tensors unpermuted,
    every *norm.weight + 1, no output.weight when tied. sd: HF state dict as numpy float32 arrays."""
    import gguf
    nl = kw["num_hidden_layers"]
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_name(f"tiny random {name} (tests/golden/make_arch_fixtures.py)")
    w.add_block_count(nl)
    w.add_context_length(kw["max_position_embeddings"])
    w.add_embedding_length(kw["hidden_size"])
    w.add_feed_forward_length(kw["intermediate_size"])
    w.add_head_count(kw["num_attention_heads"])
    w.add_head_count_kv(kw["num_key_value_heads"])
    w.add_rope_freq_base(kw["rope"]["rope_theta"])
    w.add_rope_freq_base_swa(kw["rope_local_base_freq"])
    w.add_layer_norm_rms_eps(kw["rms_norm_eps"])
    w.add_key_length(head_dim(kw))
    w.add_value_length(head_dim(kw))
    w.add_file_type(0)  # ALL_F32
    assert kw["attn_logit_softcapping"] is None and kw["final_logit_softcapping"] is None
    w.add_sliding_window(kw["sliding_window"])
    toks, types, merges = byte_vocab(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)

    def t(gname, hname):
        a = np.ascontiguousarray(sd[hname].astype(np.float32))
        if hname.endswith("norm.weight"):
            a = a + np.float32(1.0)  # Gemma3RMSNorm: x * (1 + w)
        w.add_tensor(gname, a)

    t("token_embd.weight", "model.embed_tokens.weight")
    for l in range(nl):
        p = f"model.layers.{l}."
        t(f"blk.{l}.attn_norm.weight", p + "input_layernorm.weight")
        t(f"blk.{l}.attn_q.weight", p + "self_attn.q_proj.weight")
        t(f"blk.{l}.attn_k.weight", p + "self_attn.k_proj.weight")
        t(f"blk.{l}.attn_v.weight", p + "self_attn.v_proj.weight")
        t(f"blk.{l}.attn_q_norm.weight", p + "self_attn.q_norm.weight")
        t(f"blk.{l}.attn_k_norm.weight", p + "self_attn.k_norm.weight")
        t(f"blk.{l}.attn_output.weight", p + "self_attn.o_proj.weight")
        t(f"blk.{l}.post_attention_norm.weight", p + "post_attention_layernorm.weight")
        t(f"blk.{l}.ffn_norm.weight", p + "pre_feedforward_layernorm.weight")
        t(f"blk.{l}.ffn_gate.weight", p + "mlp.gate_proj.weight")
        t(f"blk.{l}.ffn_up.weight", p + "mlp.up_proj.weight")
        t(f"blk.{l}.ffn_down.weight", p + "mlp.down_proj.weight")
        t(f"blk.{l}.post_ffw_norm.weight", p + "post_feedforward_layernorm.weight")
    t("output_norm.weight", "model.norm.weight")
    if not kw["tie_word_embeddings"]:
        t("output.weight", "lm_head.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def fake_state_dict_gemma3(kw, rng):
    """numpy weights in Gemma3ForCausalLM's names and shapes (for --gguf-only); norms as HF stores them
    (offsets from 1)."""
    E, F, hd = kw["hidden_size"], kw["intermediate_size"], head_dim(kw)
    nh, nkv = kw["num_attention_heads"], kw["num_key_value_heads"]
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.1
    sd = {"model.embed_tokens.weight": r(VOCAB, E), "model.norm.weight": r(E)}
    for l in range(kw["num_hidden_layers"]):
        p = f"model.layers.{l}."
        sd.update({p + "input_layernorm.weight": r(E), p + "post_attention_layernorm.weight": r(E),
                   p + "pre_feedforward_layernorm.weight": r(E), p + "post_feedforward_layernorm.weight": r(E),
                   p + "self_attn.q_norm.weight": r(hd), p + "self_attn.k_norm.weight": r(hd),
                   p + "self_attn.q_proj.weight": r(nh * hd, E), p + "self_attn.k_proj.weight": r(nkv * hd, E),
                   p + "self_attn.v_proj.weight": r(nkv * hd, E), p + "self_attn.o_proj.weight": r(E, nh * hd),
                   p + "mlp.gate_proj.weight": r(F, E), p + "mlp.up_proj.weight": r(F, E),
                   p + "mlp.down_proj.weight": r(E, F)})
    return sd


def build_hf_gemma3(kw, seed):
    import torch
    import transformers
    args = {k: v for k, v in kw.items() if k not in ("rope", "rope_local_base_freq")}
    if int(transformers.__version__.split(".")[0]) >= 5:
        args["rope_parameters"] = {"full_attention": dict(kw["rope"]),
                                   "sliding_attention": dict(rope_type="default", rope_theta=kw["rope_local_base_freq"])}
    else:
        args["rope_theta"] = kw["rope"]["rope_theta"]
        args["rope_local_base_freq"] = kw["rope_local_base_freq"]
        args["rope_scaling"] = None
    cfg = transformers.Gemma3TextConfig(**args)
    cfg._attn_implementation = "eager"  # the sliding-window mask honored, fp32 softmax
    assert list(cfg.layer_types) == gemma3_layer_types(kw), cfg.layer_types
    torch.manual_seed(seed)
    m = transformers.Gemma3ForCausalLM(cfg).float().eval()
    randomize_gemma3(m, seed, kw["hidden_size"])
    return m


def check_gemma3(m, kw):
    """What the GGUF's keys claim must be what transformers runs."""
    import torch
    hd, types = head_dim(kw), gemma3_layer_types(kw)
    for l, layer in enumerate(m.model.layers):
        a = layer.self_attn
        assert a.head_dim == hd and abs(a.scaling - kw["query_pre_attn_scalar"] ** -0.5) < 1e-12, (a.head_dim, a.scaling)
        assert a.sliding_window == (kw["sliding_window"] if types[l] == "sliding_attention" else None), (l, a.sliding_window)
        assert a.attn_logit_softcapping is None
    assert m.config.final_logit_softcapping is None
    re = m.model.rotary_emb
    for lt, theta in (("full_attention", kw["rope"]["rope_theta"]), ("sliding_attention", kw["rope_local_base_freq"])):
        want = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
        if hasattr(re, f"{lt}_inv_freq"):  # transformers 5: one module, a buffer per layer type
            got = getattr(re, f"{lt}_inv_freq")
        else:  # 4.x: rotary_emb (global) and rotary_emb_local
            got = (re if lt == "full_attention" else m.model.rotary_emb_local).inv_freq
        assert np.allclose(got.double().numpy(), want, rtol=1e-6), (lt, got, want)
    emb = m.model.embed_tokens
    scale = emb.embed_scale
    print(f"gemma3: embed_scale {float(scale)!r} ({scale.dtype if torch.is_tensor(scale) else type(scale).__name__}, "
          f"cast to the weight dtype {emb.weight.dtype} before the multiply); sqrt(hidden) = {kw['hidden_size'] ** 0.5!r}")
    ids = torch.tensor([[5, 6, 7]])
    assert torch.equal(emb(ids), emb.weight[ids] * np.float32(kw["hidden_size"] ** 0.5))


def write_gguf(path, name, arch, kw, sd):
    """sd: HF state dict as numpy float32 arrays."""
    import gguf
    if arch == "gemma3":
        return write_gguf_gemma3(path, name, kw, sd)
    hd = head_dim(kw)
    nh, nkv, nl = kw["num_attention_heads"], kw["num_key_value_heads"], kw["num_hidden_layers"]
    rope = kw["rope"]
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"tiny random {name} (tests/golden/make_arch_fixtures.py)")
    w.add_file_type(0)  # ALL_F32
    w.add_block_count(nl)
    w.add_context_length(kw["max_position_embeddings"])
    w.add_embedding_length(kw["hidden_size"])
    w.add_feed_forward_length(kw["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(kw["rms_norm_eps"])
    w.add_vocab_size(VOCAB)
    if hd != kw["hidden_size"] // nh:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if arch == "llama":
        w.add_rope_dimension_count(hd)
    toks, types, merges = byte_vocab(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch.startswith("qwen") else "llama-bpe")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)

    def t(gname, hname, fn=None):
        a = np.ascontiguousarray(sd[hname].astype(np.float32))
        w.add_tensor(gname, fn(a) if fn else a)

    t("token_embd.weight", "model.embed_tokens.weight")
    if arch == "llama" and rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_factors(rope, hd))
    for l in range(nl):
        p = f"model.layers.{l}."
        perm_q = (lambda a: permute_rotate_half_to_pairs(a, nh)) if arch == "llama" else None
        perm_k = (lambda a: permute_rotate_half_to_pairs(a, nkv)) if arch == "llama" else None
        t(f"blk.{l}.attn_norm.weight", p + "input_layernorm.weight")
        t(f"blk.{l}.attn_q.weight", p + "self_attn.q_proj.weight", perm_q)
        t(f"blk.{l}.attn_k.weight", p + "self_attn.k_proj.weight", perm_k)
        t(f"blk.{l}.attn_v.weight", p + "self_attn.v_proj.weight")
        if p + "self_attn.q_proj.bias" in sd:
            t(f"blk.{l}.attn_q.bias", p + "self_attn.q_proj.bias", perm_q)
            t(f"blk.{l}.attn_k.bias", p + "self_attn.k_proj.bias", perm_k)
            t(f"blk.{l}.attn_v.bias", p + "self_attn.v_proj.bias")
        if p + "self_attn.q_norm.weight" in sd:
            t(f"blk.{l}.attn_q_norm.weight", p + "self_attn.q_norm.weight")
            t(f"blk.{l}.attn_k_norm.weight", p + "self_attn.k_norm.weight")
        t(f"blk.{l}.attn_output.weight", p + "self_attn.o_proj.weight")
        t(f"blk.{l}.ffn_norm.weight", p + "post_attention_layernorm.weight")
        t(f"blk.{l}.ffn_gate.weight", p + "mlp.gate_proj.weight")
        t(f"blk.{l}.ffn_up.weight", p + "mlp.up_proj.weight")
        t(f"blk.{l}.ffn_down.weight", p + "mlp.down_proj.weight")
    t("output_norm.weight", "model.norm.weight")
    if not kw["tie_word_embeddings"]:
        t("output.weight", "lm_head.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def fake_state_dict(kw, rng):
    """numpy weights in the HF names and shapes (for --gguf-only)."""
    E, F, hd = kw["hidden_size"], kw["intermediate_size"], head_dim(kw)
    nh, nkv = kw["num_attention_heads"], kw["num_key_value_heads"]
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.1
    sd = {"model.embed_tokens.weight": r(VOCAB, E), "model.norm.weight": 1 + r(E), "lm_head.weight": r(VOCAB, E)}
    for l in range(kw["num_hidden_layers"]):
        p = f"model.layers.{l}."
        sd.update({p + "input_layernorm.weight": 1 + r(E), p + "post_attention_layernorm.weight": 1 + r(E),
                   p + "self_attn.q_proj.weight": r(nh * hd, E), p + "self_attn.k_proj.weight": r(nkv * hd, E),
                   p + "self_attn.v_proj.weight": r(nkv * hd, E), p + "self_attn.o_proj.weight": r(E, nh * hd),
                   p + "mlp.gate_proj.weight": r(F, E), p + "mlp.up_proj.weight": r(F, E),
                   p + "mlp.down_proj.weight": r(E, F)})
    return sd


def build_hf(cls_name, kw, seed):
    import torch
    import transformers
    if cls_name == "Gemma3ForCausalLM":
        return build_hf_gemma3(kw, seed)
    cls = getattr(transformers, cls_name)
    cfg_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
    args = {k: v for k, v in kw.items() if k != "rope"}
    rope = dict(kw["rope"])
    if int(transformers.__version__.split(".")[0]) >= 5:
        args["rope_parameters"] = rope
    else:
        args["rope_theta"] = rope.pop("rope_theta")
        if rope["rope_type"] != "default":
            args["rope_scaling"] = rope
    cfg = cfg_cls(**args)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    m = cls(cfg).float().eval()
    randomize(m, seed)
    return m


def randomize(m, seed):
    """Weights that give logits a spread of several units: linear maps ~ N(0, 1 / fan_in) (activations
    keep their scale), embeddings N(0, 0.5^2), norm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1 + 0.1 * z)
            elif name.endswith(".bias"):
                p.copy_(0.1 * z)
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(0.5 * z)
            else:
                p.copy_(z / p.shape[1] ** 0.5)


def randomize_gemma3(m, seed, hidden):
    """randomize() for Gemma 3, whose RMSNorm multiplies by (1 + w) and whose embedding is scaled by
    sqrt(hidden) on the way in and tied on the way out. With randomize()'s weights the scaled token
    embedding (RMS 4) dominates the residual stream and the tied logits pick the current token again
    and again (a one-token greedy continuation). Instead: embeddings N(0, (0.5 / sqrt(hidden))^2)
    (RMS 0.5 once scaled, as the other architectures' embeddings); effective norm weights 1 + w =
    1 + N(0, 0.1^2), except the two post-branch norms (post_attention / post_feedforward: 2 + N(0, 0.1^2),
    each branch adds more than the embedding) and the final norm (6 + N(0, 0.1^2): the gain that spreads
    the tied logits over several units); linear maps ~ N(0, 1 / fan_in)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            z = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name == "model.norm.weight":
                p.copy_(5 + 0.1 * z)
            elif "norm" in name and ".post_" in name:
                p.copy_(1 + 0.1 * z)
            elif "norm" in name:
                p.copy_(0.1 * z)
            elif "embed_tokens" in name:
                p.copy_(0.5 / hidden ** 0.5 * z)
            else:
                p.copy_(z / p.shape[1] ** 0.5)


def prompts(seed):
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(3, VOCAB, n)] for n in PROMPT_LENS]


def reference_logits(m, name, out_path):
    import torch
    lines = []
    with torch.no_grad():
        for k, ids in enumerate(prompts(7)):
            ids = list(ids)
            n_prompt = len(ids)
            out = m(torch.tensor([ids]), use_cache=True)
            past = out.past_key_values
            cached = []  # the last-position logits of each cached step, against the full pass below
            for _ in range(N_GEN):
                cached.append(out.logits[0, -1].double())
                nxt = int(out.logits[0, -1].argmax())
                ids.append(nxt)
                out = m(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
            logits = m(torch.tensor([ids])).logits[0].double()
            drift = float((torch.stack(cached) - logits[n_prompt - 1:n_prompt - 1 + N_GEN]).abs().max())
            lines.append(f"prompt {k} {n_prompt} {len(ids)}")
            lines.append("ids " + " ".join(str(i) for i in ids))
            lse = torch.logsumexp(logits, dim=-1)
            vals, idx = logits.topk(TOP, dim=-1)
            for pos in range(len(ids)):
                pairs = " ".join(f"{int(i)}:{float(v):.6f}" for i, v in zip(idx[pos], vals[pos]))
                lines.append(f"pos {pos} {float(lse[pos]):.6f} {pairs}")
            margin = float((vals[:, 0] - vals[:, 1]).min())
            print(f"{name} prompt {k}: continuation {ids[n_prompt:n_prompt + 10]}..., min top-2 margin {margin:.3g}, "
                  f"max |KV-cached - full-pass logit| {drift:.2g}")
    with open(out_path, "w") as f:
        f.write(f"# arch-{name}.gguf, HF transformers fp32 CPU; tests/golden/make_arch_fixtures.py\n")
        f.write("\n".join(lines) + "\n")


def main():
    args = sys.argv[1:]
    gguf_only = "--gguf-only" in args
    args = [a for a in args if a != "--gguf-only"]
    only = None
    if "--only" in args:
        i = args.index("--only")
        if i + 1 >= len(args):
            sys.exit(__doc__)
        only = args[i + 1].split(",")
        del args[i:i + 2]
        unknown = [n for n in only if n not in ARCHS]
        if unknown:
            sys.exit(f"unknown architecture(s) {unknown}; known: {list(ARCHS)}")
    if len(args) != 1:
        sys.exit(__doc__)
    out = args[0]
    os.makedirs(out, exist_ok=True)
    if not gguf_only:
        import torch
        import transformers
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for name, (cls_name, arch, kw, seed) in ARCHS.items():
        if only is not None and name not in only:
            continue
        path = os.path.join(out, f"arch-{name}.gguf")
        if gguf_only and arch == "gemma3":
            write_gguf(path, name, arch, kw, fake_state_dict_gemma3(kw, np.random.default_rng(seed)))
            print(f"wrote {path}")
            continue
        if gguf_only:
            sd = fake_state_dict(kw, np.random.default_rng(seed))
            if kw["tie_word_embeddings"]:
                del sd["lm_head.weight"]
            if arch == "qwen2":
                rng = np.random.default_rng(seed + 1)
                hd = head_dim(kw)
                for l in range(kw["num_hidden_layers"]):
                    p = f"model.layers.{l}.self_attn."
                    sd[p + "q_proj.bias"] = rng.standard_normal(kw["num_attention_heads"] * hd).astype(np.float32)
                    sd[p + "k_proj.bias"] = rng.standard_normal(kw["num_key_value_heads"] * hd).astype(np.float32)
                    sd[p + "v_proj.bias"] = rng.standard_normal(kw["num_key_value_heads"] * hd).astype(np.float32)
            if arch == "qwen3":
                for l in range(kw["num_hidden_layers"]):
                    p = f"model.layers.{l}.self_attn."
                    sd[p + "q_norm.weight"] = np.ones(head_dim(kw), np.float32)
                    sd[p + "k_norm.weight"] = np.ones(head_dim(kw), np.float32)
            write_gguf(path, name, arch, kw, sd)
            print(f"wrote {path}")
            continue
        m = build_hf(cls_name, kw, seed)
        if kw["rope"]["rope_type"] == "llama3":  # the scaling must really be on in transformers
            hd = head_dim(kw)
            base = 1.0 / (kw["rope"]["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
            want = base / llama3_factors(kw["rope"], hd)
            got = m.model.rotary_emb.inv_freq.double().numpy()
            assert np.allclose(got, want, rtol=1e-5), (got, want)
        if arch == "gemma3":
            check_gemma3(m, kw)
        sd = {k: v.detach().float().numpy() for k, v in m.state_dict().items()}
        if kw["tie_word_embeddings"]:
            assert np.array_equal(sd["model.embed_tokens.weight"], sd.get("lm_head.weight", sd["model.embed_tokens.weight"]))
        write_gguf(path, name, arch, kw, sd)
        reference_logits(m, name, os.path.join(out, f"arch-{name}_logits.txt"))
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
