"""T5's relative-position bucket written out one position at a time (a test reference)."""

import math

import numpy as np


def t5_bucket_reference(rel: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Raffel et al. (2020) / the T5 code, one relative position at a time, logs in float32."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if rel > 0:
            bucket += num_buckets
        n = abs(rel)
    else:
        n = max(-rel, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    ratio = np.float32(np.log(np.float32(n) / np.float32(max_exact))) / np.float32(math.log(max_distance / max_exact))
    val = max_exact + int(np.float32(ratio * np.float32(num_buckets - max_exact)))
    return bucket + min(val, num_buckets - 1)
