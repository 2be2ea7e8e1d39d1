#!/usr/bin/env python3
"""Holds memory that grows with the batch, for the fake training commands of the tests (standard
library only): MIB MiB, each page touched, kept SECONDS (default 0.15) so that batchfit's samples
see it. A fake whose peak stays flat from size to size is refused (the batch is not shown to reach
it), as a real job that ignores its batch size is.

  python3 hold.py MIB [SECONDS]      (a shell fake: `... ; exec python3 hold.py "$1"`)
  import hold; hold.hold(MIB)
"""
import sys
import time


def hold(mib, seconds=0.15):
    buf = bytearray(int(mib) << 20)
    buf[::4096] = b"\x01" * len(range(0, len(buf), 4096))
    time.sleep(seconds)
    return buf


if __name__ == "__main__":
    hold(float(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.15)
