"""The true-maximum scan: the largest batch at which a fresh training process completes, found by galloping
out from a known size and bisecting, one fresh process per probe.

Both harnesses judge an answer against this number, with their own policies:

* the side-by-side benchmark (``true_max_scan``): exact to one sample, starting from the tool's own bracket,
  galloping up by doubling steps (or down, when the bracket's low end fails), then re-running the boundary
  (``recheck``) and, when it does not reproduce, finding the band of sizes that completed / failed twice;
* gpu-check's stage 2: from batchfit's answer and a prediction, galloping up by a growing fraction
  (``growing_steps``), bisecting to a tolerance, under a deadline, stopping at repeated errors.

``gallop_bisect`` is the loop they share. A probe answers True (completed), False (failed: out of memory,
or anything else the caller counts as a failure) or None (stop now: no time left). The loop assumes
monotonicity; the rechecks are how the side-by-side scan sees where that does not hold.
"""
import math
import time


def gallop_bisect(fits, lo, hi=None, first=None, next_up=None, narrow=lambda lo, hi: hi - lo <= 1,
                  stop=lambda: False):
    """The bracket [lo, hi) of the largest size that fits: lo completed (0: nothing known to), hi failed
    (None: no failure known yet). While hi is None, probes `first` and, after each fit at b, next_up(b);
    once hi is known, bisects ((lo + hi) // 2) until narrow(lo, hi). Ends early when a probe returns None
    or, after a probe, stop() is true. Returns (lo, hi)."""
    cand = first
    while True:
        if hi is not None:
            if narrow(lo, hi):
                break
            b = (lo + hi) // 2
        else:
            b = cand
        ok = fits(b)
        if ok is None:
            break
        if ok:
            lo = b
            if hi is None:
                cand = next_up(lo)
        else:
            hi = b
        if stop():
            break
    return lo, hi


def doubling_steps(lo, first):
    """next_up for gallop_bisect: the first step is first - lo, each step after a fit twice the last."""
    state = {"step": first - lo}

    def next_up(b):
        state["step"] *= 2
        return b + state["step"]

    return next_up


def growing_steps(grow):
    """next_up for gallop_bisect: after a fit at b, b + max(1, ceil(b × grow)), grow doubling each time."""
    state = {"grow": grow}

    def next_up(b):
        nxt = b + max(1, int(math.ceil(b * state["grow"])))
        state["grow"] *= 2
        return nxt

    return next_up


def gallop_down(fits, hi):
    """When hi failed: probes hi - 1, hi - 2, hi - 4, ... (not below 1) until one fits. Returns (lo, hi):
    lo the size that fitted (None when even 1 failed), hi the smallest size seen failing."""
    step = 1
    while True:
        cand = max(1, hi - step)
        if fits(cand):
            return cand, hi
        hi = cand
        if cand == 1:
            return None, hi
        step *= 2


def true_max_scan(probe, lo_hint, hi_hint, recheck, on_probe):
    """Largest b with probe(b) == 'fits' (a fresh process each), assuming monotonicity; exact to ±0.
    probe(b) returns "fits" or another outcome ("oom", "timeout", "exit N"); on_probe(probes) is called
    after every probe (to save the results).

    Returns a dict with max, first_fail, probes [{batch, outcome, seconds, recheck}], stable (the
    boundary reproduced on a re-run; None without recheck), and band when it did not."""
    probes = []
    cache = {}

    def fits(b, again=False):
        if again or b not in cache:
            t0 = time.monotonic()
            o = probe(b)
            dt = round(time.monotonic() - t0, 1)
            probes.append({"batch": b, "outcome": o, "seconds": dt, "recheck": again})
            on_probe(probes)
            if not again:
                cache[b] = o
            return o == "fits"
        return cache[b] == "fits"

    lo_hint = max(1, int(lo_hint or 1))
    if fits(lo_hint):
        first = hi_hint if hi_hint and hi_hint > lo_hint else lo_hint + 1
        lo, hi = gallop_bisect(fits, lo_hint, first=first, next_up=doubling_steps(lo_hint, first))
    else:
        lo, hi = gallop_down(fits, lo_hint)
        if lo is None:
            return {"max": 0, "first_fail": 1, "probes": probes, "stable": None}
        lo, hi = gallop_bisect(fits, lo, hi)
    out = {"max": lo, "first_fail": hi, "probes": probes, "stable": None}
    if recheck:
        a = fits(lo, again=True)
        b = fits(hi, again=True)
        out["stable"] = a and not b
        if not out["stable"]:
            out["band"] = noise_band(fits, lo, hi, a, b)
    on_probe(probes)
    return out


def noise_band(fits, lo, hi, lo_again, hi_again):
    """When the boundary is not reproducible: the largest size at or below lo that completed in two fresh runs
    out of two, and the smallest at or above hi that failed in two out of two (stepping 1, 2, 4, ... away)."""
    sure_fit = lo if lo_again else None
    step, b = 1, lo
    while sure_fit is None and b > 1:
        b = max(1, lo - step)
        if fits(b) and fits(b, again=True):
            sure_fit = b
        step *= 2
    sure_fail = hi if not hi_again else None
    step, b = 1, hi
    while sure_fail is None:
        b = hi + step
        if not fits(b) and not fits(b, again=True):
            sure_fail = b
        step *= 2
    return {"fits_twice": sure_fit, "fails_twice": sure_fail}
