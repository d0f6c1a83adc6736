#!/usr/bin/env python3
"""Quantiles of Prometheus histograms between two scrapes.

    histogram-quantiles.py BEFORE AFTER FAMILY...

For each histogram FAMILY (its series summed over their labels), prints the
number of observations made between the scrape in file BEFORE and the one in
AFTER, their mean, and p50, p90, p99 and p99.9, interpolated linearly within
the bucket that holds each (so as coarse as the buckets; a quantile in the
+Inf bucket is given as the highest finite bound, prefixed with '>')."""
import re
import sys

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)_(bucket|sum|count)(\{[^}]*\})? (\S+)')


def load(path):
    buckets, sums, counts = {}, {}, {}
    with open(path) as f:
        for line in f:
            m = SAMPLE.match(line)
            if not m:
                continue
            family, kind, labels, value = m.group(1), m.group(2), m.group(3) or '', float(m.group(4))
            if kind == 'bucket':
                le = re.search(r'le="([^"]+)"', labels)
                if not le:
                    continue
                bound = float('inf') if le.group(1) == '+Inf' else float(le.group(1))
                family_buckets = buckets.setdefault(family, {})
                family_buckets[bound] = family_buckets.get(bound, 0.0) + value
            elif kind == 'sum':
                sums[family] = sums.get(family, 0.0) + value
            else:
                counts[family] = counts.get(family, 0.0) + value
    return buckets, sums, counts


def quantile(q, bounds, cumulative, n):
    """The q-quantile of n observations with these cumulative bucket counts."""
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in zip(bounds, cumulative):
        if count >= q * n:
            if bound == float('inf'):
                return f'>{prev_bound * 1e6:.0f}'
            share = (q * n - prev_count) / max(count - prev_count, 1e-12)
            return f'{(prev_bound + (bound - prev_bound) * share) * 1e6:.0f}'
        prev_bound, prev_count = bound, count
    return '?'


def main():
    before, after = load(sys.argv[1]), load(sys.argv[2])
    for family in sys.argv[3:]:
        n = after[2].get(family, 0.0) - before[2].get(family, 0.0)
        if n <= 0:
            print(f'{family}: no observations')
            continue
        mean = (after[1][family] - before[1].get(family, 0.0)) / n
        bounds = sorted(after[0][family])
        cumulative = [after[0][family][b] - before[0].get(family, {}).get(b, 0.0) for b in bounds]
        quantiles = ' '.join(
            f'{name} {quantile(q, bounds, cumulative, n)}'
            for name, q in (('p50', 0.5), ('p90', 0.9), ('p99', 0.99), ('p99.9', 0.999)))
        print(f'{family}: {n:.0f} observations, mean {mean * 1e6:.0f} µs; µs: {quantiles}')


if __name__ == '__main__':
    main()
