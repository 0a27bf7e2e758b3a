"""The `tokenizers` package's side of the tokenizer tests and benchmarks.

  hf_tokenizer.py train --in FILE --vocab N --out tokenizer.json [--split gpt4]
      byte-level BPE from tokenizers' own BpeTrainer (GPT-2's pre-tokenizer,
      or with --split gpt4 a Split on GPT-4's pattern before a ByteLevel
      without one; the 256 byte symbols, <|endoftext|>), N ids in all
  hf_tokenizer.py encode --tokenizer JSON --in FILE
      the ids of the file's text (UTF-8), one line separated by spaces
  hf_tokenizer.py bench --tokenizer JSON --in FILE --threads N [--runs R]
      encode_batch over the file's lines on N threads (RAYON_NUM_THREADS):
      prints 'seconds S tokens T' for the median of R runs
"""
import argparse
import os
import statistics
import sys
import time

GPT4_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["train", "encode", "bench"])
    ap.add_argument("--in", dest="inp", required=True)
    ap.add_argument("--tokenizer")
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--out")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--split", choices=["gpt4"])
    a = ap.parse_args()
    if a.what == "bench":
        os.environ["RAYON_NUM_THREADS"] = str(a.threads)  # read when tokenizers starts its pool
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if a.what == "train":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        if a.split:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(tokenizers.Regex(GPT4_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=0)
        t0 = time.perf_counter()
        tok.train([a.inp], tr)
        print(f"seconds {time.perf_counter() - t0:.4f} vocab {tok.get_vocab_size()} tokenizers {tokenizers.__version__}")
        tok.save(a.out)
        return
    tok = Tokenizer.from_file(a.tokenizer)
    text = open(a.inp, encoding="utf-8", newline="").read()
    if a.what == "encode":
        sys.stdout.write(" ".join(map(str, tok.encode(text, add_special_tokens=False).ids)) + "\n")
        return
    lines = text.splitlines(keepends=True)
    times, n = [], 0
    for _ in range(a.runs):
        t0 = time.perf_counter()
        enc = tok.encode_batch(lines, add_special_tokens=False)
        times.append(time.perf_counter() - t0)
        n = sum(len(e.ids) for e in enc)
    print(f"seconds {statistics.median(times):.4f} tokens {n}")


if __name__ == "__main__":
    main()
