"""The `transformers` side of the interchange tests (GPT-2 and Llama).

  hf_models.py make --out DIR --layers L --heads H --d D --positions P --vocab V [--seed S]
      a GPT2LMHeadModel with random weights (LayerNorms and biases too),
      save_pretrained(DIR) as safetensors
  hf_models.py make-llama --out DIR --layers L --heads H --kv-heads K --d D --ffn F --positions P --vocab V
                  [--rope-theta X] [--tied] [--shard-bytes N] [--dtype float32|bfloat16|float16]
      a LlamaForCausalLM with random weights (RMSNorm weights too),
      save_pretrained(DIR) in that dtype, in shards of at most N bytes when given
  hf_models.py loss --model DIR --tokenizer JSON --text FILE --seq-len T
      the mean cross-entropy of the windows `pack --format text --seq-len T`
      makes of FILE (records of T+1 tokens, stride T): 'loss X'
  hf_models.py train --model DIR --tokenizer JSON --text FILE --seq-len T --batch B --steps N --lr LR --out DIR2
      N steps of torch.optim.AdamW (betas 0.9, 0.95, eps 1e-8, weight decay
      0.1 on matrices, the gradients' norm clipped at 1) on the first B
      windows (B 0: all), then save_pretrained(DIR2); prints 'windows W',
      then each step's loss
  hf_models.py generate --model DIR --prompt-ids "1 2 3" --tokens N
      greedy generate() (its key/value cache on): the new ids, separated by
      spaces; on stderr, tokens/s
Models load through AutoModelForCausalLM: either kind.
"""
import argparse
import sys
import time

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def make(a):
    torch.manual_seed(a.seed)
    cfg = GPT2Config(n_layer=a.layers, n_head=a.heads, n_embd=a.d, n_positions=a.positions, vocab_size=a.vocab,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    m = GPT2LMHeadModel(cfg)
    with torch.no_grad():  # not the init's zeros and ones: every tensor's layout is tested
        for n, p in m.named_parameters():  # and larger matrices: logits far from uniform, a greedy path that moves
            p.add_((0.1 if p.dim() == 1 else 0.3) * torch.randn_like(p))
    m.save_pretrained(a.out, safe_serialization=True)


def make_llama(a):
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      hidden_size=a.d, intermediate_size=a.ffn, max_position_embeddings=a.positions,
                      vocab_size=a.vocab, rope_theta=a.rope_theta, rms_norm_eps=1e-5,
                      tie_word_embeddings=a.tied, attn_implementation="eager")
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():  # not the init's ones: every tensor's layout is tested
        for n, p in m.named_parameters():
            p.add_((0.1 if p.dim() == 1 else 0.3) * torch.randn_like(p))
    kw = {"max_shard_size": a.shard_bytes} if a.shard_bytes else {}
    m.to(getattr(torch, a.dtype)).save_pretrained(a.out, safe_serialization=True, **kw)


def load(path):
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def windows(a):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)
    ids = tok.encode(open(a.text, encoding="utf-8", newline="").read(), add_special_tokens=False).ids
    T = a.seq_len
    n = (len(ids) - 1) // T
    return torch.tensor([ids[r * T:r * T + T + 1] for r in range(n)])


def loss(a):
    m = load(a.model)
    rec = windows(a)
    with torch.no_grad():
        logits = m(rec[:, :-1]).logits
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).double(), rec[:, 1:].reshape(-1))
    print(f"loss {ce.item():.8f}")


def generate(a):
    m = load(a.model)
    ids = torch.tensor([[int(x) for x in a.prompt_ids.split()]])
    t0 = time.perf_counter()
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=False, num_beams=1,
                         pad_token_id=0, eos_token_id=None)
    seconds = time.perf_counter() - t0
    print(" ".join(map(str, out[0, ids.size(1):].tolist())))
    print(f"generated {a.tokens} tokens in {seconds:.4f} s: {a.tokens / seconds:.1f} tokens/s", file=sys.stderr)


def train(a):
    m = load(a.model).train()
    rec = windows(a)[:a.batch] if a.batch else windows(a)
    print(f"windows {rec.size(0)}")
    decay = [p for n, p in m.named_parameters() if p.dim() == 2]
    rest = [p for n, p in m.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    for step in range(a.steps):
        opt.zero_grad()
        logits = m(rec[:, :-1]).logits
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), rec[:, 1:].reshape(-1))
        ce.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        print(f"step {step + 1} loss {ce.item():.8f}")
    m.save_pretrained(a.out, safe_serialization=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["make", "make-llama", "loss", "train", "generate"])
    for k in ("--out", "--model", "--tokenizer", "--text", "--prompt-ids"):
        ap.add_argument(k)
    for k, v in (("--layers", 2), ("--heads", 2), ("--kv-heads", 1), ("--d", 32), ("--ffn", 64), ("--positions", 64),
                 ("--vocab", 300), ("--seed", 1), ("--seq-len", 32), ("--tokens", 20), ("--batch", 8),
                 ("--steps", 5), ("--shard-bytes", 0)):
        ap.add_argument(k, type=int, default=v)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--tied", action="store_true")
    a = ap.parse_args()
    {"make": make, "make-llama": make_llama, "loss": loss, "train": train, "generate": generate}[a.what](a)


if __name__ == "__main__":
    sys.exit(main())
