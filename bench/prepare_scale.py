"""`medray data prepare` (MedQARo) wall time and peak memory at 1x, 4x and the paper scale.

    .venv/bin/python bench/prepare_scale.py [--work DIR] [--keep] [--scales 1x,4x,paper]

1x = the `small` synthetic release (42 patients), 4x = the same plan with 4x the patients
per split, paper = `medray data synth --scale paper` (1,242 patients, 105,880 QA pairs,
~5.9 GB of CSV). Each prepare runs in a fresh process pinned to 2 CPUs; peak RSS is that
process's maximum resident set (getrusage via wait4), wall time is measured around it. The
synthetic data goes to a temp dir (checked against free disk first) and is removed unless
--keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMALL = {"train": 24, "val": 6, "test": 6, "test_cross": 6}  # patients per split, 1x
PAPER_CSV_BYTES = 6.5e9  # 5.9 GB of CSV + the prepared output, with margin


def synth(scale: str, out: Path) -> None:
    from medray.data.synth import write_medqaro

    if scale == "paper":
        write_medqaro(out, seed=0, scale="paper")
    else:
        factor = int(scale.removesuffix("x"))
        write_medqaro(out, seed=0, scale="small",
                      n_patients={k: v * factor for k, v in SMALL.items()})


def prepare_in_child(raw: Path, out: Path) -> tuple[float, float, str]:
    """(wall seconds, peak RSS GiB, prepare's printed summary) of one `medray data prepare`."""
    code = ("import os, sys; os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2]); "
            "from medray.cli import app; sys.argv=['medray']+sys.argv[1:]; app()")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, "data", "prepare", "-d", "medqaro",
                             "-i", str(raw), "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"prepare failed on {raw}:\n{output}")
    return wall, usage.ru_maxrss / 1024**2, output  # ru_maxrss is KiB on Linux


def csv_bytes(raw: Path) -> int:
    return sum(p.stat().st_size for p in raw.glob("*.csv"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--scales", default="1x,4x,paper")
    args = ap.parse_args()
    scales = args.scales.split(",")
    work = args.work or Path(tempfile.mkdtemp(prefix="medray-prepare-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free
    print(f"work dir {work}: {free / 1e9:.1f} GB free")
    if "paper" in scales and free < PAPER_CSV_BYTES:
        raise SystemExit(f"need ~{PAPER_CSV_BYTES / 1e9:.1f} GB free for the paper scale")
    rows = []
    try:
        for scale in scales:
            raw, out = work / f"raw-{scale}", work / f"data-{scale}"
            t0 = time.perf_counter()
            if not raw.is_dir():
                synth(scale, raw)
            synth_s = time.perf_counter() - t0
            wall, peak, _ = prepare_in_child(raw, out)
            manifest = json.loads((out / "manifest.json").read_text())
            rows.append({"scale": scale, "csv_gb": csv_bytes(raw) / 1e9,
                         "qa": sum(manifest["splits"].values()), "synth_s": synth_s,
                         "prepare_s": wall, "peak_rss_gib": peak})
            print(json.dumps(rows[-1]), flush=True)
            shutil.rmtree(out, ignore_errors=True)
            if not args.keep:
                shutil.rmtree(raw, ignore_errors=True)
    finally:
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'scale':>6} {'CSV GB':>7} {'QA pairs':>9} {'prepare s':>10} {'peak RSS GiB':>13}")
    for r in rows:
        print(f"{r['scale']:>6} {r['csv_gb']:7.2f} {r['qa']:9,d} {r['prepare_s']:10.1f} "
              f"{r['peak_rss_gib']:13.2f}")
    base = rows[0]
    for r in rows[1:]:
        print(f"{r['scale']} vs {base['scale']}: {r['csv_gb'] / base['csv_gb']:.0f}x the CSV, "
              f"{r['prepare_s'] / base['prepare_s']:.1f}x the time, "
              f"{r['peak_rss_gib'] / base['peak_rss_gib']:.2f}x the peak memory")
    from _results import write_results

    top = rows[-1]
    write_results("prepare_scale", {
        "headline": f"`medray data prepare` reads {top['qa']:,} QA pairs ({top['csv_gb']:.2f} GB "
                    f"of CSV, scale {top['scale']}) in {top['prepare_s']:.1f} s at "
                    f"{top['peak_rss_gib']:.2f} GiB peak memory on 2 CPUs",
        "tables": [{"title": "one `medray data prepare` per scale, pinned to 2 CPUs",
                    "columns": ["scale", "CSV GB", "QA pairs", "prepare s", "peak RSS GiB"],
                    "rows": [[r["scale"], r["csv_gb"], r["qa"], r["prepare_s"],
                              r["peak_rss_gib"]] for r in rows]}],
        "rows": rows,
    }, command=shlex.join(["bench/prepare_scale.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
