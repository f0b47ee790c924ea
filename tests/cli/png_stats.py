#!/usr/bin/env python3
"""png_stats.py — decide whether a PNG screenshot shows a rendered page (standard library only).

Owns: decoding 8-bit greyscale/RGB/RGBA non-interlaced PNGs (zlib + the five row filters) and the
checks a rendered-page test needs: size, number of distinct colours, fraction of non-white pixels.
Does not own: taking the screenshot (tests/cli/plan_html_render.sh).

usage: png_stats.py FILE.png [--min-width W] [--min-height H] [--min-colors N] [--min-ink F]
Prints one line of statistics; exits 1 naming the first check that fails.
"""
import argparse
import struct
import sys
import zlib


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file (bad signature)")
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(color)
    if depth != 8 or channels is None or interlace != 0:
        raise ValueError(f"{path}: expected an 8-bit non-interlaced grey/RGB/RGBA PNG, got depth {depth} "
                         f"colour type {color} interlace {interlace}")
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, channels, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("png")
    ap.add_argument("--min-width", type=int, default=1)
    ap.add_argument("--min-height", type=int, default=1)
    ap.add_argument("--min-colors", type=int, default=2)
    ap.add_argument("--min-ink", type=float, default=0.0, help="minimum fraction of non-white pixels")
    args = ap.parse_args()
    width, height, channels, rows = decode(args.png)
    colors, ink = set(), 0
    for row in rows:
        for x in range(0, width * channels, channels):
            px = row[x:x + min(channels, 3)]
            colors.add(px)
            if min(px) < 245:
                ink += 1
    ink_fraction = ink / float(width * height)
    print(f"{args.png}: {width}x{height}, {len(colors)} distinct colours, {100 * ink_fraction:.1f}% non-white")
    checks = [(width >= args.min_width, f"width {width} < {args.min_width}"),
              (height >= args.min_height, f"height {height} < {args.min_height}"),
              (len(colors) >= args.min_colors, f"{len(colors)} distinct colours < {args.min_colors}"),
              (ink_fraction >= args.min_ink, f"non-white fraction {ink_fraction:.4f} < {args.min_ink}")]
    for ok, why in checks:
        if not ok:
            print(f"png_stats: {args.png}: {why}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
