#!/usr/bin/env python3
"""loader_peers.py — the loaders people use now, on the same records as
bigbatch's loader (perf/loader_peers.sh drives it).

  loader_peers.py pack --raw RECORDS --record-size N --out DIR
      writes the raw records (N bytes each, in order) for every peer:
      DIR/records.npy (a memory-mapped array for PyTorch's DataLoader),
      DIR/wds/shard-*.tar (WebDataset), DIR/mds (MosaicML Streaming's MDS,
      zstd) and DIR/litdata (LitData's optimize), the last two when their
      package imports.
  loader_peers.py read --peer NAME --dir DIR --record-size N --workers W [--cold]
                       [--remote s3://BUCKET/PREFIX --local DIR]
      reads one epoch, shuffled, in batches of 256 through a DataLoader with
      W workers and prints one JSON line: records/s counted from the first
      batch to the last (so worker start-up is apart: first_batch_s), the
      records read, and whether the page cache was dropped first
      (posix_fadvise DONTNEED on every file of the peer's copy, as
      `bigbatch bench loader --cold` does on its shards). With --remote
      (Streaming only) the shards come from object storage (S3_ENDPOINT_URL,
      the AWS variables) through the local cache DIR, and the line adds
      records_per_s_from_start: every batch over the whole time, downloads
      and start-up included (what a cold remote epoch costs).

Each peer is used as its documentation shows; every batch is a uint8 tensor
of (256, N) — the records' bytes, as bigbatch's loader hands them over.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

BATCH = 256
WDS_SHARDS = 8


def drop_cache(path):
    """Every file at `path` (one file, or a directory's tree) out of the page cache."""
    files = [path] if os.path.isfile(path) else [os.path.join(b, f) for b, _, fs in os.walk(path) for f in fs]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def pack(args):
    raw = _RAW
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "records.npy"), raw)
    import webdataset as wds
    os.makedirs(os.path.join(args.out, "wds"), exist_ok=True)
    per = (len(raw) + WDS_SHARDS - 1) // WDS_SHARDS
    for s in range(WDS_SHARDS):
        with wds.TarWriter(os.path.join(args.out, "wds", "shard-%02d.tar" % s)) as w:
            for i in range(s * per, min(len(raw), (s + 1) * per)):
                w.write({"__key__": "%09d" % i, "bin": raw[i].tobytes()})
    try:
        from streaming import MDSWriter
        with MDSWriter(out=os.path.join(args.out, "mds"), columns={"x": "bytes"}, compression="zstd") as w:
            for r in raw:
                w.write({"x": r.tobytes()})
    except ImportError as e:
        print("loader_peers: no MDS copy: %s" % e, file=sys.stderr)
    try:
        import litdata
        litdata.optimize(fn=_litdata_item, inputs=list(range(len(raw))), output_dir=os.path.join(args.out, "litdata"),
                         chunk_bytes="64MB", num_workers=1)
    except (ImportError, AttributeError) as e:
        print("loader_peers: no LitData copy: %s" % e, file=sys.stderr)


_RAW = None


def _litdata_item(i):
    return {"x": _RAW[i].tobytes()}


class Memmap(Dataset):
    def __init__(self, path):
        self.path, self.a = path, None
        self.n = np.load(path, mmap_mode="r").shape[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.a is None:  # opened in each worker
            self.a = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(np.array(self.a[i]))


def as_tensor(x):
    return torch.frombuffer(bytearray(x), dtype=torch.uint8)


def loader(peer, d, workers, remote=None, local=None):
    if peer == "dataloader":
        return DataLoader(Memmap(os.path.join(d, "records.npy")), batch_size=BATCH, shuffle=True, num_workers=workers,
                          drop_last=True)
    if peer == "webdataset":
        import webdataset as wds
        urls = sorted(os.path.join(d, "wds", f) for f in os.listdir(os.path.join(d, "wds")))
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000)
              .map(lambda s: as_tensor(s["bin"])).batched(BATCH, collation_fn=torch.stack, partial=False))
        return wds.WebLoader(ds, batch_size=None, num_workers=workers)
    if peer == "streaming":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()

        class Records(StreamingDataset):
            def __getitem__(self, i):
                return as_tensor(super().__getitem__(i)["x"])
        if remote:
            ds = Records(remote=remote, local=local, shuffle=True, batch_size=BATCH)
        else:
            ds = Records(local=os.path.join(d, "mds"), shuffle=True, batch_size=BATCH)
        return DataLoader(ds, batch_size=BATCH, num_workers=workers, drop_last=True)
    if peer == "litdata":
        import litdata
        ds = litdata.StreamingDataset(os.path.join(d, "litdata"), shuffle=True,
                                      transform=lambda s: as_tensor(s["x"]))
        return litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, drop_last=True)
    raise SystemExit("loader_peers: unknown peer %s" % peer)


def read(args):
    copy = {"dataloader": "records.npy", "webdataset": "wds", "streaming": "mds", "litdata": "litdata"}[args.peer]
    if args.cold and not args.remote:
        drop_cache(os.path.join(args.dir, copy))
    if args.remote and args.peer != "streaming":
        raise SystemExit("loader_peers: --remote is for --peer streaming")
    t0 = time.perf_counter()
    first, records = None, 0
    for b in loader(args.peer, args.dir, args.workers, args.remote, args.local):
        assert b.dtype == torch.uint8 and b.shape == (BATCH, args.record_size), (b.dtype, b.shape)
        if first is None:
            first = time.perf_counter()
        else:
            records += b.shape[0]
    end = time.perf_counter()
    print(json.dumps({"peer": args.peer, "workers": args.workers, "cold": args.cold, "records": records,
                      "records_per_s": records / (end - first), "first_batch_s": first - t0,
                      "records_per_s_from_start": (records + BATCH) / (end - t0)}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("pack")
    a.add_argument("--raw", required=True)
    a.add_argument("--record-size", type=int, required=True)
    a.add_argument("--out", required=True)
    b = sub.add_parser("read")
    b.add_argument("--peer", required=True, choices=["dataloader", "webdataset", "streaming", "litdata"])
    b.add_argument("--dir", required=True)
    b.add_argument("--record-size", type=int, required=True)
    b.add_argument("--workers", type=int, default=1)
    b.add_argument("--cold", action="store_true")
    b.add_argument("--remote")
    b.add_argument("--local")
    args = p.parse_args()
    if args.what == "pack":
        global _RAW
        _RAW = np.fromfile(args.raw, dtype=np.uint8).reshape(-1, args.record_size)
        pack(args)
    else:
        read(args)


if __name__ == "__main__":
    main()
