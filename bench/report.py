"""Where a benchmark's results go: `bench/results/STEM.json` (every run,
the medians, the configuration) and `STEM.txt` (the summary, also
printed)."""

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(stem: str, results: dict, text: str) -> None:
    """Writes STEM.json and STEM.txt under bench/results and prints `text`."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(results, indent=2, default=str))
    (RESULTS / f"{stem}.txt").write_text(text + "\n")
    print(text)
