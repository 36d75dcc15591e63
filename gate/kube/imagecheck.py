"""`python -m gate.kube.imagecheck`: every module NodeGate's image runs imports, with nothing but what
the image carries. The image build runs it after it removes the `kubernetes` package (Dockerfile),
and a unit test runs it with that package hidden, so a module-level `import kubernetes` (or of a
package only it brought) fails the build and the tests, not a pod on a node.

Left out: the dev cluster and the test helpers (`gate.devcluster`, `gate.testing`), which run on a
developer's machine and never in the image.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import gate

NOT_IN_THE_IMAGE = ("gate.devcluster", "gate.testing")


def image_modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(gate.__path__, "gate.")]
    return sorted(n for n in names if not n.startswith(NOT_IN_THE_IMAGE))


def main() -> int:
    failed = []
    for name in image_modules():
        try:
            importlib.import_module(name)
        except ImportError as exc:
            failed.append(f"{name}: {exc}")
    for line in failed:
        print(f"imagecheck: {line}", file=sys.stderr)
    if not failed:
        print(f"imagecheck: {len(image_modules())} modules import")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
