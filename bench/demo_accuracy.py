"""Offline demo accuracy: MiniLM-L6 on Rotten Tomatoes, test accuracy and wall time per run.

Runs `python -m trainer` as a pod would. `demo`: 1 epoch over 2,000 training samples, tested on
500 held-out snippets (goal >= 74%). `full`: 1 epoch over the whole training split, tested on the
whole test split (goal >= 82%).

    .venv/bin/python bench/demo_accuracy.py [--runs demo full]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = {
    "demo": (["--max-train-samples", "2000", "--max-eval-samples", "500"], 0.74),
    "full": ([], 0.82),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", choices=sorted(RUNS), default=["demo", "full"])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.runs:
            extra, goal = RUNS[name]
            work = Path(scratch) / name
            command = [sys.executable, "-m", "trainer", "--model", "minilm",
                       "--dataset", "rotten_tomatoes", "--epochs", "1", *extra,
                       "--checkpoint-dir", str(work / "checkpoints"),
                       "--model-dir", str(work / "model"), "--cache-dir", str(work / "cache")]
            start = time.perf_counter()
            subprocess.run(command, check=True, stderr=subprocess.DEVNULL)
            elapsed = time.perf_counter() - start
            saved = json.loads((work / "model" / "metrics.json").read_text())
            test = saved["metrics"]["test"]
            rows.append((name, saved["samples"]["train"], test["samples"], test["accuracy"],
                         test["f1"], elapsed, goal))
            print(f"{name}: {100 * test['accuracy']:.2f}% in {elapsed:.0f} s", flush=True)
    print()
    print("| run | train samples | test samples | test accuracy | F1 | wall time | goal |")
    print("|---|---|---|---|---|---|---|")
    for name, train, tested, accuracy, f1, elapsed, goal in rows:
        verdict = "met" if accuracy >= goal else "missed"
        print(f"| {name} | {train} | {tested} | {100 * accuracy:.2f}% | {100 * f1:.2f}% | "
              f"{elapsed:.0f} s | >= {100 * goal:.0f}% ({verdict}) |")


if __name__ == "__main__":
    main()
