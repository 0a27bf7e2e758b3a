"""The `tokenizers` package's side of the tokenizer tests and benchmarks.

  hf_tokenizer.py train --in FILE --vocab N --out tokenizer.json [--split gpt4] [--style STYLE]
      BPE from tokenizers' own BpeTrainer, N ids in all (the styles' special
      and byte tokens included). --style:
        bytelevel (default)  GPT-2's pre-tokenizer, or with --split gpt4 a Split
                             on GPT-4's pattern before a ByteLevel without one;
                             the 256 byte symbols, <|endoftext|>
        llama3               Llama 3's structure: --split gpt4 (Llama 3's pattern),
                             ignore_merges, 128000 ids in the vocabulary (those
                             the training does not reach are filler), and 256
                             special tokens from id 128000 (<|begin_of_text|>,
                             <|end_of_text|>, ..., <|eot_id|>, reserved)
        llama2               Llama 2's (and Mistral's, TinyLlama's) SentencePiece-
                             style BPE as transformers converts it: <unk> <s> </s>,
                             <0x00>..<0xFF> at ids 3..258, a normalizer that
                             prepends and writes spaces as U+2581, no pre-tokenizer,
                             byte_fallback and fuse_unk, the decoder Sequence
                             [Replace, ByteFallback, Fuse, Strip]
        metaspace-first      the same vocabulary, a Metaspace pre-tokenizer instead
        metaspace-split      (prepend_scheme first, split false; always, split true)
        unk                  llama2 without byte fallback: characters out of the
                             alphabet are <unk>, fused
      Characters past the 60 commonest (limit_alphabet) are not in the
      SentencePiece styles' vocabulary: byte fallback or <unk> has work to do.
  hf_tokenizer.py encode --tokenizer JSON --in FILE
      the ids of the file's text (UTF-8), one line separated by spaces
  hf_tokenizer.py bench --tokenizer JSON --in FILE --threads N [--runs R]
      encode_batch over the file's lines on N threads (RAYON_NUM_THREADS):
      prints 'seconds S tokens T' for the median of R runs
"""
import argparse
import json
import os
import statistics
import sys
import time

GPT4_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_sentencepiece_style(a):
    """Llama 2's structure: a vocabulary trained on words that start with U+2581, then <unk> <s> </s> and the
    256 byte tokens in front of it (ids 0..258, as Llama 2's), the rest moved up; merges are by string."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=a.style != "unk", fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    special = ["<unk>", "<s>", "</s>"]
    tr = trainers.BpeTrainer(vocab_size=a.vocab - 256, special_tokens=special, limit_alphabet=60,
                             show_progress=False)
    t0 = time.perf_counter()
    tok.train([a.inp], tr)
    seconds = time.perf_counter() - t0
    j = json.loads(tok.to_str())
    vocab = {k: v for k, v in j["model"]["vocab"].items() if k not in special}
    order = special + [f"<0x{b:02X}>" for b in range(256)] + sorted(vocab, key=vocab.get)
    j["model"]["vocab"] = {k: i for i, k in enumerate(order)}
    if a.style == "llama2" or a.style == "unk":
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        j["pre_tokenizer"] = None
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    else:
        first = a.style == "metaspace-first"
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                              "prepend_scheme": "first" if first else "always", "split": not first}
        j["decoder"] = {"type": "Metaspace", "replacement": "\u2581",
                        "prepend_scheme": "first" if first else "always", "split": not first}
    tok = Tokenizer.from_str(json.dumps(j))
    print(f"seconds {seconds:.4f} vocab {tok.get_vocab_size()} tokenizers {tokenizers_version()}")
    tok.save(a.out)


def tokenizers_version():
    import tokenizers
    return tokenizers.__version__


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
    ap.add_argument("--style", default="bytelevel",
                    choices=["bytelevel", "llama3", "llama2", "metaspace-first", "metaspace-split", "unk"])
    a = ap.parse_args()
    if a.what == "bench":
        os.environ["RAYON_NUM_THREADS"] = str(a.threads)  # read when tokenizers starts its pool
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if a.what == "train":
        if a.style not in ("bytelevel", "llama3"):
            train_sentencepiece_style(a)
            return
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        if a.split or a.style == "llama3":
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(tokenizers.Regex(GPT4_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        special = [] if a.style == "llama3" else ["<|endoftext|>"]
        tr = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=special, show_progress=False,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=0)
        t0 = time.perf_counter()
        tok.train([a.inp], tr)
        seconds = time.perf_counter() - t0
        if a.style == "llama3":
            j = json.loads(tok.to_str())
            j["model"]["ignore_merges"] = True
            vocab = j["model"]["vocab"]  # 128000 ids as Llama 3's: the rest are tokens no text here holds
            for i in range(len(vocab), 128000):
                vocab["\u0100" * 3 + str(i)] = i  # bytes 0 0 0 and the number, in the byte-level alphabet
            names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                     "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                     "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
            names += [f"<|reserved_special_token_{i}|>" for i in range(3, 256 - len(names) + 3)]
            j["added_tokens"] = [dict(id=128000 + i, content=c, single_word=False, lstrip=False, rstrip=False,
                                      normalized=False, special=True) for i, c in enumerate(names)]
            tok = Tokenizer.from_str(json.dumps(j))
        print(f"seconds {seconds:.4f} vocab {tok.get_vocab_size()} tokenizers {tokenizers.__version__}")
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
