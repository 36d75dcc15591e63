"""NodeGate's image: compressed size per layer, and what it was at a baseline revision, in one run.

    python -m bench.image.size [--baseline REV]

Builds NodeGate's image twice with the dev cluster's builder (buildah, the local bases of
docs/images.md): from the Dockerfile of the working tree, and from the Dockerfile of `--baseline`
(default: the revision before the image was slimmed), both over this tree's sources. Pushes both
to a registry of its own (a throwaway state directory) and prints each layer's compressed size,
the totals and their ratio: what a node pulls on its first stage pod.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from gate.devcluster import images, registry
from gate.devcluster.processes import ProcessTable

SOURCE = Path(__file__).resolve().parents[2]
BASELINE = "08c3af0"  # main before the image left the kubernetes package out


def layer_sizes(port: int, repository: str, tag: str) -> list[int]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/{repository}/manifests/{tag}",
                                     headers={"Accept": ", ".join(registry.MANIFEST_TYPES)})
    with urllib.request.urlopen(request, timeout=30) as resp:
        manifest = json.load(resp)
    return [int(layer["size"]) for layer in manifest["layers"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=BASELINE, help="git revision whose Dockerfile is the baseline")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ng-image-size-") as tmp:
        old = Path(tmp) / "Dockerfile.baseline"
        old.write_text(subprocess.run(["git", "show", f"{args.baseline}:Dockerfile"], cwd=SOURCE, check=True,
                                      capture_output=True, text=True).stdout)
        variants = {
            "baseline": images.ImageTarget("nodegate-baseline", SOURCE, old, "size"),
            "now": images.ImageTarget("nodegate", SOURCE, SOURCE / "Dockerfile", "size"),
        }
        procs = ProcessTable(Path(tmp))
        port = registry.start_registry(procs, progress=print)
        try:
            sizes = {}
            for label, target in variants.items():
                images.push(images.build(target, print), port, print)
                sizes[label] = layer_sizes(port, target.repository, target.tag)
        finally:
            procs.stop_all()
    print()
    print(f"{'image':<10} {'layers (MB, compressed)':<34} {'total MB':>9}")
    for label, layers in sizes.items():
        print(f"{label:<10} {', '.join(f'{s / 1e6:.1f}' for s in layers):<34} {sum(layers) / 1e6:>9.1f}")
    base, now = sum(sizes["baseline"]), sum(sizes["now"])
    print(f"now / baseline: {now / base:.2f}x ({(base - now) / 1e6:.1f} MB less per cold node)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
