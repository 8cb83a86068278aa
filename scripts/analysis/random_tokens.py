#!/usr/bin/env python3
"""Prints N comma-separated token ids drawn uniformly from [3, HIGH) with a seed (a prompt as ids).
usage: random_tokens.py N SEED HIGH"""
import random
import sys

if len(sys.argv) != 4:
    sys.exit(__doc__)
n, seed, high = (int(a) for a in sys.argv[1:])
rng = random.Random(seed)
print(",".join(str(rng.randrange(3, high)) for _ in range(n)))
