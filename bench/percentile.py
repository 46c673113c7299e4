"""The p-th percentile of xs (0 <= p <= 100) by linear interpolation between the closest ranks (numpy's
default and Python's statistics.quantiles(method="inclusive")); NaN for no values. Shared by the
standard-library bench clients (bench/serving.py, bench/api_servers.py)."""


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def nearest_rank(xs, q):
    """The q-quantile (0 < q <= 1) of sorted xs by the nearest-rank rule (so p99 of fewer than 100 values
    is the max); the bench drivers that report p50 / p90 / p99 of latencies (bench/pd.py, bench/scale.py)."""
    return xs[min(len(xs) - 1, max(0, -(-int(q * 1000) * len(xs) // 1000) - 1))]
