"""`nodegate package build`, `verify` and `catalog`: a package's image, its signatures, and the catalog page.

`build` builds the image of one package directory the way `nodegate dev images` builds those of
packages/ (buildah, the local bases, the inputs digest; gate.devcluster.images), after the package
lints clean: an image of a package the agent would refuse is of no use. `--push` pushes it to the
dev cluster's registry and prints `NAME=REFERENCE` by digest, as `dev images` does.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gate.cli.errors import CliError

CATALOG = "docs/catalog.md"
PACKAGES = "packages"


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_package_build(args: argparse.Namespace) -> int:
    from gate.agent.lint import has_errors, lint_package
    from gate.devcluster.images import build_package

    directory = Path(args.directory)
    findings = lint_package(directory)
    for finding in findings:
        _err(f"{directory}: {finding}")
    if has_errors(findings):
        raise CliError(f"{directory} does not lint clean; not building its image")
    cluster = None
    host = None
    if args.push:
        from gate.devcluster.cluster import DevCluster
        from gate.devcluster.network import gateway_ip

        cluster = DevCluster(Path(args.state_dir) if args.state_dir else None)
        if not cluster.running():
            raise CliError("--push needs the dev cluster's control plane (its registry); start it with "
                           "`nodegate dev up`")
        host = gateway_ip(cluster.dir)
    image = build_package(directory, _err, cluster=cluster, host=host)
    print(f"{image.target.name}={image.reference}" if image.reference else image.local)
    return 0


def cmd_package_verify(args: argparse.Namespace) -> int:
    """What the operator would decide about IMAGE's signatures, and why; exit 0 only when it would run."""
    import asyncio

    from gate.api.cosign import referrers_tag
    from gate.api.signatures import FORMAT_NAMES, Verdict, load_policy, policy_for_keys
    from gate.controller.registry import RegistryError, resolve_digest
    from gate.controller.signatures import Lookup, SignatureVerifier, repository_of

    if bool(args.key) == bool(args.policy):
        raise CliError("give the keys to trust (--key FILE, repeatable) or the cluster's policy (--policy FILE)")
    target = repository_of(args.image)
    if isinstance(target, str):
        raise CliError(target)
    repository = f"{target.registry}/{target.repository}"
    try:
        if args.policy:
            policy = load_policy(Path(args.policy).read_text(), source=args.policy)
        else:
            keys: dict[str, str] = {}
            for key in args.key:
                try:
                    keys[key] = Path(key).read_text()
                except OSError as exc:
                    raise CliError(f"--key {key}: {exc.strerror or exc}") from None
            policy = policy_for_keys(keys, repository)
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from None

    async def decide() -> tuple[str, Verdict, Lookup]:
        digest = args.image.partition("@")[2] or await resolve_digest(args.image, timeout=args.timeout)
        verdict, found = await SignatureVerifier(policy, timeout=args.timeout).explain(args.image, digest)
        return digest, verdict, found

    try:
        digest, verdict, found = asyncio.run(decide())
    except RegistryError as exc:
        raise CliError(str(exc)) from None
    rule = policy.rule_for(repository)
    kinds: dict[str, int] = {}
    for evidence in found.evidence:
        kinds[evidence.format] = kinds.get(evidence.format, 0) + 1
    seen = "; ".join(f"{n} {FORMAT_NAMES[f]}" for f, n in kinds.items()) or "no signature"
    where = ("the registry answers the OCI referrers API" if found.referrers_api else
             f"the registry has no OCI referrers API: its fallback tag {referrers_tag(digest)} was read")
    if verdict.ok:
        decision = "runs"
    elif policy.mode == "warn":
        decision = "runs, with a warning (mode: warn)"
    else:
        decision = "is held before any node is cordoned (mode: enforce)"
    print(f"image:    {args.image}")
    print(f"digest:   {digest}")
    print(f"rule:     {rule.name + ' (keys: ' + ', '.join(k.name for k in rule.keys) + ')' if rule else 'none'}")
    print(f"found:    {seen} ({where})")
    print(f"verdict:  {verdict.reason}" + (f" by key {verdict.key}" if verdict.key else ""))
    print(f"why:      {verdict.message}")
    print(f"operator: the image {decision}")
    return 0 if verdict.ok else 1


def cmd_package_catalog(args: argparse.Namespace) -> int:
    from gate.agent.catalog import render_catalog, render_inputs_module
    from gate.agent.errors import PackageError

    output = Path(args.output)
    relative = os.path.relpath(Path(args.packages).resolve(), output.resolve().parent)
    try:
        files = {output: render_catalog(Path(args.packages), relative)}
        if args.inputs:
            files[Path(args.inputs)] = render_inputs_module(Path(args.packages))
    except PackageError as exc:
        raise CliError(str(exc)) from None
    if args.check:
        stale = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
        for path in stale:
            print(f"{path} is stale; run `nodegate package catalog --output {output}"
                  + (f" --inputs {args.inputs}`" if args.inputs else "`"), file=sys.stderr)
        return 1 if stale else 0
    if args.stdout:
        sys.stdout.write(files[output])
        return 0
    for path, text in files.items():
        path.write_text(text)
        print(path)
    return 0


def register(package_sub: Any) -> None:
    """Add `build`, `verify` and `catalog` to the `nodegate package` group (created by gate.cli.agent)."""
    build = package_sub.add_parser("build", help="build a package's image (as `dev images` does); --push it")
    build.add_argument("directory", metavar="DIR")
    build.add_argument("--push", action="store_true",
                       help="push it to the dev cluster's registry and print NAME=REFERENCE by digest")
    build.add_argument("--state-dir", help="the dev cluster's state directory (for --push; default: `nodegate dev`'s)")
    build.set_defaults(func=cmd_package_build)

    verify = package_sub.add_parser(
        "verify", help="what the operator would decide about an image's cosign signatures, and why (exit 0: it runs)")
    verify.add_argument("image", metavar="IMAGE", help="repository:tag (resolved to its digest) or repository@digest")
    verify.add_argument("--key", action="append", default=[], metavar="FILE",
                        help="a public key to trust (cosign.pub: ECDSA P-256 or Ed25519 PEM); repeatable")
    verify.add_argument("--policy", metavar="FILE", help="the cluster's signature policy (operator.imageSignatures)")
    verify.add_argument("--timeout", type=float, default=10.0, help="seconds per registry request (default 10)")
    verify.set_defaults(func=cmd_package_verify)

    catalog = package_sub.add_parser("catalog", help="write docs/catalog.md from the packages' own files")
    catalog.add_argument("--packages", default=PACKAGES, metavar="DIR",
                         help=f"the directory of package directories (default {PACKAGES})")
    catalog.add_argument("--output", "-o", default=CATALOG, help=f"the page to write (default {CATALOG})")
    catalog.add_argument("--check", action="store_true", help="exit 1 when the page is stale, write nothing")
    catalog.add_argument("--stdout", action="store_true", help="print the page instead of writing it")
    catalog.add_argument("--inputs", metavar="FILE",
                         help="also write (or --check) the packages' declared inputs as admission judges them "
                         "(the repository's is gate/admission/rules/catalog_inputs.py)")
    catalog.set_defaults(func=cmd_package_catalog)
