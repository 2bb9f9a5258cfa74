"""Versions of the one pass's device code (``sinkscope.stats.flash4_kernel``) side by side: the
module in the tree and any other source of it (an earlier commit's, a variant with a step left
out to see what it costs), each swapped in for the module in turn, at the shapes of
``frame_route.py`` (and ``longlive2_whole_tiles``: frames of 896 keys).

Per shape: the model's call and FlashAttention-4's plain call without the key split; per
version, its kernel without the key split (``unsplit``) and its route as a job runs it
(``route``: the key split, the merges and the combine), ms a call (``frame_route.py``'s
``queued`` and ``alone``) and as a ratio to the model's call, and whether its output is the
model's call's to the bit (a version that leaves out a step gives wrong statistics; only its
time means anything); the tree's kernel also without entropy's sums (``_no_entropy``).

Needs a Hopper GPU and ``flash-attn-4``. Writes ``results.json`` to ``--out``.

    git show 540a776:src/sinkscope/stats/flash4_kernel.py > /tmp/before.py
    PYTHONPATH=src python benchmarks/flash4_kernel_versions.py --version before=/tmp/before.py --out $OUT
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from flash4_partials import route  # noqa: E402
from frame_route import SHAPES, add_ratios, measure_shapes, recorder, shape_inputs  # noqa: E402

from report import error_entry, write_results  # noqa: E402
from sinkscope.attention.flash4 import flash4_attention_with_lse  # noqa: E402
from sinkscope.attention.split import cached_attention  # noqa: E402
from sinkscope.stats import flash4_partials  # noqa: E402

MODULE = "sinkscope.stats.flash4_kernel"
# Besides frame_route's: LongLive 2.0's chunk with frames of 896 keys, whole key tiles (no frame
# starts inside a tile), to tell the cost of the tiles where one does from the rest.
SHAPES = {**SHAPES, "longlive2_whole_tiles": dict(heads=24, fsl=896, num_q=8, num_k=40)}


def use_version(path: str | None) -> None:
    """Make ``path`` (None: the tree's) the device code the next compile reads."""
    sys.modules.pop(MODULE, None)
    flash4_partials._KERNELS.clear()
    if path is not None:
        spec = importlib.util.spec_from_file_location(MODULE, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[MODULE] = module
        spec.loader.exec_module(module)
        kernel = module.FrameStatsForwardSm90
        if "entropy" not in inspect.signature(kernel.__init__).parameters:  # a version from before it

            def without_entropy(*args, entropy=True, **kwargs):
                assert entropy, f"{path} keeps entropy's sums always"
                return kernel(*args, **kwargs)

            module.FrameStatsForwardSm90 = without_entropy


def measure_shape(name: str, shape: dict, results: dict, out: str, *, versions: dict) -> None:
    fsl, num_q = shape["fsl"], shape["num_q"]
    (q4, k4, v4), (q, k, v), lengths, _ = shape_inputs(shape)
    scale = 128**-0.5
    entry, record = recorder(name, shape, results, out)
    record("model_call", lambda: cached_attention(q4, k4, v4))
    record("flash4_unsplit", lambda: flash4_attention_with_lse(*(x.transpose(1, 2) for x in (q4, k4, v4)), scale))
    model_out = cached_attention(q4, k4, v4)[0][0]
    for version, path in versions.items():
        use_version(path)
        try:
            out_route, _ = route(q, k, v, lengths, fsl, num_q, scale)
            entry[f"{version}_same_output_as_model_call"] = bool(torch.equal(out_route, model_out))
        except Exception as error:  # noqa: BLE001 - report, keep going
            entry[f"{version}_failed"] = error_entry(error)
            print(name, version, "failed", entry[f"{version}_failed"]["traceback"], flush=True)
            continue
        unsplit = flash4_partials.flash4_attention_partials
        record(f"{version}_unsplit", lambda: unsplit(q, k, v, lengths, scale, split=False))
        record(f"{version}_route", lambda: route(q, k, v, lengths, fsl, num_q, scale))
        if path is None:  # the tree's kernel without entropy's sums (capture.statistics without entropy)
            record(
                f"{version}_unsplit_no_entropy", lambda: unsplit(q, k, v, lengths, scale, split=False, entropy=False)
            )
            record(f"{version}_route_no_entropy", lambda: route(q, k, v, lengths, fsl, num_q, scale, entropy=False))
    add_ratios(entry)
    write_results(results, out, partial=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--shapes", default="wan1.3b,longlive2")
    parser.add_argument(
        "--version", action="append", default=[], metavar="NAME=PATH", help="another source of the device code"
    )
    args = parser.parse_args()
    versions: dict = {"tree": None}
    for item in args.version:
        version, _, path = item.partition("=")
        if not path or not Path(path).is_file():
            parser.error(f"--version {item!r}: expected NAME=PATH of a source file")
        versions[version] = path
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "versions": versions}
    measure_shapes(partial(measure_shape, versions=versions), args.shapes, SHAPES, results, args.out)
    use_version(None)
    return write_results(results, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
