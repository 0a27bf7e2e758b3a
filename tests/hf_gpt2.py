"""The `transformers` side of the GPT-2 interchange tests.

  hf_gpt2.py make --out DIR --layers L --heads H --d D --positions P --vocab V [--seed S]
      a GPT2LMHeadModel with random weights (LayerNorms and biases too),
      save_pretrained(DIR) as safetensors
  hf_gpt2.py loss --model DIR --tokenizer JSON --text FILE --seq-len T
      the mean cross-entropy of the windows `pack --format text --seq-len T`
      makes of FILE (records of T+1 tokens, stride T): 'loss X'
  hf_gpt2.py generate --model DIR --prompt-ids "1 2 3" --tokens N
      greedy generate() (its key/value cache on): the new ids, separated by
      spaces; on stderr, tokens/s
"""
import argparse
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def make(a):
    torch.manual_seed(a.seed)
    cfg = GPT2Config(n_layer=a.layers, n_head=a.heads, n_embd=a.d, n_positions=a.positions, vocab_size=a.vocab,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    m = GPT2LMHeadModel(cfg)
    with torch.no_grad():  # not the init's zeros and ones: every tensor's layout is tested
        for n, p in m.named_parameters():  # and larger matrices: logits far from uniform, a greedy path that moves
            p.add_((0.1 if p.dim() == 1 else 0.3) * torch.randn_like(p))
    m.save_pretrained(a.out, safe_serialization=True)


def windows(a):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)
    ids = tok.encode(open(a.text, encoding="utf-8", newline="").read(), add_special_tokens=False).ids
    T = a.seq_len
    n = (len(ids) - 1) // T
    return torch.tensor([ids[r * T:r * T + T + 1] for r in range(n)])


def loss(a):
    m = GPT2LMHeadModel.from_pretrained(a.model).eval()
    rec = windows(a)
    with torch.no_grad():
        logits = m(rec[:, :-1]).logits
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).double(), rec[:, 1:].reshape(-1))
    print(f"loss {ce.item():.8f}")


def generate(a):
    m = GPT2LMHeadModel.from_pretrained(a.model).eval()
    ids = torch.tensor([[int(x) for x in a.prompt_ids.split()]])
    t0 = time.perf_counter()
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=False, num_beams=1,
                         pad_token_id=0, eos_token_id=None)
    seconds = time.perf_counter() - t0
    print(" ".join(map(str, out[0, ids.size(1):].tolist())))
    print(f"generated {a.tokens} tokens in {seconds:.4f} s: {a.tokens / seconds:.1f} tokens/s", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["make", "loss", "generate"])
    for k in ("--out", "--model", "--tokenizer", "--text", "--prompt-ids"):
        ap.add_argument(k)
    for k, v in (("--layers", 2), ("--heads", 2), ("--d", 32), ("--positions", 64), ("--vocab", 300),
                 ("--seed", 1), ("--seq-len", 32), ("--tokens", 20)):
        ap.add_argument(k, type=int, default=v)
    a = ap.parse_args()
    {"make": make, "loss": loss, "generate": generate}[a.what](a)


if __name__ == "__main__":
    sys.exit(main())
