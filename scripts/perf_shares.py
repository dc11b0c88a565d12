#!/usr/bin/env python3
"""Shares of a `perf script` dump, the way ARCHITECTURE.md quotes them.

    perf record -F 199 --call-graph dwarf,16384 -p PID -o perf.data
    perf script -i perf.data | scripts/perf_shares.py [--comm NAME] [--top N]
        [--under SUBSTRING ...]

Prints, over the samples of threads whose command starts with NAME (all
when not given):
  - self: the innermost frame's symbol, per cent of samples;
  - inclusive: every symbol anywhere on a sample's stack, counted once a
    sample (so a recursive symbol is not counted twice);
  - under: for each SUBSTRING, the share of samples with a frame whose
    symbol contains it (the stages: `decode_video`, `run_writer`, ...).
Symbols are shortened: generic arguments and the hash suffix dropped.
"""
import argparse
import collections
import re
import sys

HASH = re.compile(r"::h[0-9a-f]{16}$")


def short(symbol):
    symbol = HASH.sub("", symbol.split("+0x")[0])
    out, depth = [], 0
    for ch in symbol:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out) or symbol


def samples(lines, comm):
    """Yields each sample's frames, innermost first."""
    frames, keep = None, False
    for line in lines:
        if not line.strip():
            if frames is not None and keep:
                yield frames
            frames = None
            continue
        if not line.startswith((" ", "\t")):
            keep = comm is None or line.startswith(comm)
            frames = []
            continue
        if frames is not None:
            parts = line.strip().split(" ", 1)
            if len(parts) == 2:
                frames.append(short(parts[1].rsplit(" (", 1)[0]))
    if frames is not None and keep:
        yield frames


def main():
    args = argparse.ArgumentParser()
    args.add_argument("--comm")
    args.add_argument("--top", type=int, default=40)
    args.add_argument("--under", action="append", default=[])
    opts = args.parse_args()
    own, inclusive, under = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for frames in samples(sys.stdin, opts.comm):
        total += 1
        own[frames[0] if frames else "?"] += 1
        inclusive.update(set(frames))
        for s in opts.under:
            if any(s in f for f in frames):
                under[s] += 1
    if not total:
        sys.exit("no samples")
    print(f"{total} samples")
    for title, counts in (("self", own), ("inclusive", inclusive)):
        print(f"\n{title}:")
        for symbol, n in counts.most_common(opts.top):
            print(f"{100 * n / total:6.2f}%  {symbol}")
    if opts.under:
        print("\nunder:")
        for s in opts.under:
            print(f"{100 * under[s] / total:6.2f}%  {s}")


if __name__ == "__main__":
    main()
