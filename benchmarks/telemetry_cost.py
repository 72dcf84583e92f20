"""What the telemetry sampler costs: its own CPU, and a training run with it beside one without.

1. The sampler alone, for --seconds at each --interval, following one busy process as a
   run's rank: its CPU time (from /proc/<pid>/stat when it ends) as a percent of one core.
   Target: under 1% of a core at the default 0.5 s.
2. The same 1-rank training (bench.py, bound to one core by mpirun) with telemetry and
   without, alternating run by run for --rounds rounds: images/s of each, and the ratio
   with/without per round (median, and the spread of the rounds).

    .venv/bin/python benchmarks/telemetry_cost.py [--quick]

Prints the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from containerbench.rank import markers

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def sampler_cpu_percent(interval: float, seconds: float, directory: Path) -> float:
    """The sampler's own CPU over `seconds` (user + system, its whole life), in % of one core."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    pids = directory / "node.pids"
    pids.write_text(f"{busy.pid} {os.readlink('/proc/self/ns/pid')}\n")
    sampler = subprocess.Popen([sys.executable, "-m", "containerbench.rank.telemetry", "--out",
                                str(directory / f"node-{interval}.csv"), "--pids", str(pids),
                                "--interval", str(interval)])
    try:
        time.sleep(seconds)
        fields = Path(f"/proc/{sampler.pid}/stat").read_text().rpartition(")")[2].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    finally:
        sampler.send_signal(signal.SIGTERM)
        sampler.wait()
        busy.kill()
        busy.wait()
    return 100 * cpu / seconds


def training_rate(bench_python: str, telemetry_dir: Path | None, args) -> float:
    command = ["mpirun", "--allow-run-as-root", "-np", "1", "--bind-to", "core", bench_python, "-m",
               "containerbench.rank.bench", "--model", args.model, "--image-size", str(args.image_size),
               "--batch-size", str(args.batch_size),
               "--warmup-steps", "2", "--steps", str(args.steps)]
    if telemetry_dir:
        command += ["--telemetry-dir", str(telemetry_dir), "--telemetry-interval", "0.5"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    [result] = markers.payloads_of(done.stdout.splitlines(), markers.RESULT)
    return result["images_per_sec"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--intervals", type=float, nargs="+", default=[0.5, 0.1])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--bench-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    parser.add_argument("--model", choices=("resnet50", "cnn_smoke"), default="resnet50")
    parser.add_argument("--quick", action="store_true",
                        help="CI: 3 s per interval, 1 round of 3 steps of cnn_smoke at 32 px (proves the script runs)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds, args.steps, args.image_size, args.batch_size = 3, 1, 3, 32, 2
        args.model = "cnn_smoke"
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        print(f"sampler alone, {args.seconds:g} s, following one busy process:")
        for interval in args.intervals:
            print(f"  every {interval:g} s: {sampler_cpu_percent(interval, args.seconds, scratch):.3f}% of one core")
        ratios, with_rates, without_rates = [], [], []
        for round_ in range(args.rounds):
            # Alternate which goes first, so a drift of the machine hits both alike.
            order = [True, False] if round_ % 2 == 0 else [False, True]
            rates = {on: training_rate(args.bench_python, scratch / f"t{round_}" if on else None, args)
                     for on in order}
            with_rates.append(rates[True])
            without_rates.append(rates[False])
            ratios.append(rates[True] / rates[False])
    print(f"training {args.model}, 1 rank, {args.image_size} px, batch {args.batch_size}, {args.steps} steps, "
          f"{args.rounds} round(s):")
    print(f"  with telemetry    {statistics.median(with_rates):8.2f} img/s (median)")
    print(f"  without           {statistics.median(without_rates):8.2f} img/s (median)")
    spread = f" (rounds {min(ratios):.3f}..{max(ratios):.3f})" if len(ratios) > 1 else ""
    print(f"  with / without    {statistics.median(ratios):8.3f}{spread}")


if __name__ == "__main__":
    main()
