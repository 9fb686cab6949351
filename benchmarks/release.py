"""Benchmark: a certified release against a noise-free request ([HF] at Table 2's MNIST LR scale and at d = 2M).

One run. For d = 7,850 (hf-table2's MNIST LR) and d = 2,000,000, two HF strategies on synthetic recorders
(random rows, ``hf_request.synthetic``: a request's cost does not depend on how the rows were recorded)
execute the same R one-sample requests, one without noise and one with the calibrated noise at
(epsilon, delta) = (1, 1e-3) as in hf-table2, both with a ledger file (fsync'd). Printed: the mean time per
request over all R and over the last 10 (the PLD accountant's time grew with the number of releases), and
the ratio certified / noise-free. Then each part of the release at R releases, timed alone next to what it
replaced (medians). All times are CPU times of one thread (``time.process_time``; the machine is shared, and
a second intra-op thread descheduled by other jobs made small tensor operations wait tens of milliseconds).

* accounting: ``totals`` and the budget check, i.e. two epsilons of the composition of R releases (exact,
  one Gaussian with ``mu = sqrt(sum 1/z^2)``) vs ``dp-accounting``'s PLD accountant as composed before;
* calibration: the cached unit calibration vs the analytic Gaussian mechanism's bisection per release;
* noise: d secure normals from the ChaCha20 keystream vs Box-Muller on ``os.urandom`` as before.

    python benchmarks/release.py [--requests 200]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import warnings
from pathlib import Path
from time import process_time

import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from hf_request import synthetic

from lightning_unlearn import ForgetRequest, Ledger, ReleaseConfig
from lightning_unlearn.privacy import analytic_sigma, secure_gaussian
from lightning_unlearn.privacy.release import calibrated_sigma
from lightning_unlearn.unlearners import HFUnlearner

warnings.filterwarnings("ignore", message=".*deletion capacity.*")
EPSILON, DELTA = 1.0, 1e-3


def median_ms(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = process_time()
        fn()
        times.append(process_time() - start)
    return 1e3 * statistics.median(times)


def cpu_seconds(fn) -> float:
    start = process_time()
    fn()
    return process_time() - start


def pld_before(strategy: HFUnlearner) -> float:
    """The total epsilon as the accountant computed it before: dp-accounting's PLD, one event per multiplier."""
    assert strategy.accountant is not None
    counts = strategy.accountant._counts
    z_min = min(counts)
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=min(1e-2, 1e-4 * max(1.0, z_min**-2)))
    for z, count in sorted(counts.items()):
        acc.compose(dp_event.GaussianDpEvent(noise_multiplier=z), count=count)
    return float(acc.get_epsilon(DELTA))


def urandom_gaussian(n: int) -> torch.Tensor:
    """Standard normals as drawn before: Box-Muller on 53-bit uniforms from ``os.urandom``."""
    raw = torch.frombuffer(bytearray(os.urandom(16 * ((n + 1) // 2))), dtype=torch.int64)
    u = ((torch.bitwise_right_shift(raw, 11) & ((1 << 53) - 1)).double() + 1.0) / float(1 << 53)
    u = u.view(2, -1)
    radius, angle = torch.sqrt(-2.0 * torch.log(u[0])), 2 * math.pi * u[1]
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n].float()


def run(d: int, requests: int, folder: Path) -> dict[str, float]:
    times: dict[str, list[float]] = {}
    strategies = {}
    for name, noise in (("noise-free", False), ("certified", True)):
        module, recorder = synthetic(d, requests)
        strategy = HFUnlearner(
            module,
            recorder,
            Ledger(folder / f"{name}-{d}.jsonl"),
            smoothness=1.0,
            grad_bound=1.0,
            max_deletions=10**9,
            release=ReleaseConfig(epsilon=EPSILON, delta=DELTA, noise=noise),
        )
        forget = strategy.forget
        times[name] = [cpu_seconds(lambda i=i, f=forget: f(ForgetRequest.samples([i]))) for i in range(requests)]
        strategies[name] = strategy
        recorder.close()
    certified = strategies["certified"]
    assert certified.accountant is not None
    sensitivity = float(certified.history[-1].certificate.bounds["sensitivity"])
    eps_now = certified.accountant.get_epsilon(DELTA)
    return {
        "free": 1e3 * statistics.mean(times["noise-free"]),
        "free_last": 1e3 * statistics.mean(times["noise-free"][-10:]),
        "cert": 1e3 * statistics.mean(times["certified"]),
        "cert_last": 1e3 * statistics.mean(times["certified"][-10:]),
        "acct": median_ms(
            lambda: (certified.accountant.totals(DELTA), certified.accountant.check_budget((1e9, DELTA)))
        ),
        "acct_before": median_ms(lambda: (pld_before(certified), pld_before(certified)), 1),
        "eps_gap": abs(eps_now - pld_before(certified)) / pld_before(certified),
        "calib": median_ms(lambda: calibrated_sigma(sensitivity, EPSILON, DELTA)),
        "calib_before": median_ms(lambda: analytic_sigma(sensitivity, EPSILON, DELTA)),
        "noise": median_ms(lambda: secure_gaussian((d,), torch.float32)),
        "noise_before": median_ms(lambda: urandom_gaussian(d)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the machine is shared: one thread, CPU time (process_time), both sides alike
    with tempfile.TemporaryDirectory() as tmp:
        rows = {
            d: run(d, args.requests if d < 10**6 else min(args.requests, 50), Path(tmp)) for d in (7_850, 2_000_000)
        }
    print(f"HF requests, (epsilon, delta) = ({EPSILON:g}, {DELTA:g}), CPU ms per request (process_time, one thread)")
    print(
        f"{'d':>10} {'R':>4} {'noise-free':>11} {'certified':>10} {'ratio':>6} "
        f"{'last 10: free':>14} {'certified':>10} {'ratio':>6}"
    )
    for d, r in rows.items():
        n = args.requests if d < 10**6 else min(args.requests, 50)
        print(
            f"{d:>10,} {n:>4} {r['free']:>11.2f} {r['cert']:>10.2f} {r['cert'] / r['free']:>6.2f} "
            f"{r['free_last']:>14.2f} {r['cert_last']:>10.2f} {r['cert_last'] / r['free_last']:>6.2f}"
        )
    print("\nthe release's parts after R releases, CPU ms (now | before)")
    print(f"{'d':>10} {'accounting':>22} {'calibration':>16} {'noise':>20} {'|eps now - PLD| / PLD':>22}")
    for d, r in rows.items():
        print(
            f"{d:>10,} {r['acct']:>9.3f} | {r['acct_before']:>9.1f} {r['calib']:>6.3f} | {r['calib_before']:>6.2f} "
            f"{r['noise']:>8.2f} | {r['noise_before']:>8.2f} {r['eps_gap']:>22.1e}"
        )


if __name__ == "__main__":
    main()
