"""The `nodegate` command (also installed as `kubectl-nodegate`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gate.cli.errors import CliError

Handler = Callable[[argparse.Namespace], int]
HELP_ORDER = ("status", "plan", "pause", "resume", "rerun", "rollout", "node", "delete", "demo", "dev", "package",
              "crds", "api-docs", "version")

# Further command groups: each module has `register(subparsers)` adding its commands, whose handlers
# import what they need lazily (so `nodegate version` stays fast). Add a module here to add commands.
COMMAND_MODULES: tuple[str, ...] = ("gate.cli.agent", "gate.cli.operator", "gate.cli.webhook", "gate.cli.fleet",
                                  "gate.cli.manifests", "gate.cli.nodes", "gate.cli.reset",
                                  "gate.cli.version", "gate.cli.logs", "gate.cli.disable",
                                  "gate.cli.rollout")


def _labels(values: Sequence[str], flag: str = "--label") -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{flag} wants key=value, got {item!r}")
        out[key] = value
    return out


def cmd_crds(args: argparse.Namespace) -> int:
    from gate.api.crd import stale_crds, write_crds

    out = Path(args.output)
    if args.check:
        stale = stale_crds(out)
        if stale:
            print(f"stale CRDs in {out}: {', '.join(stale)}; run `nodegate crds --output {out}`", file=sys.stderr)
            return 1
        return 0
    for path in write_crds(out):
        print(path)
    return 0


def cmd_api_docs(args: argparse.Namespace) -> int:
    from gate.cli.apidoc import render_api_doc

    text = render_api_doc()
    out = Path(args.output)
    if args.check:
        if not out.is_file() or out.read_text() != text:
            print(f"{out} is stale; run `nodegate api-docs --output {out}`", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(out)
    return 0


def cmd_dev_build(args: argparse.Namespace) -> int:
    from gate.devcluster.build import ensure_built

    for name, path in ensure_built(progress=_err).items():
        print(f"{name}\t{path}")
    if args.real_nodes:
        from gate.devcluster import realnode
        from gate.devcluster.images import build_images

        roots, tools = realnode.prepare(list(realnode.NODE_ROOTS), _err)
        for suite, root in roots.items():
            print(f"node-root:{suite}\t{root}")
        print(f"node-tools\t{tools}")
        for name, image in build_images(_err).items():
            print(f"image:{name}\t{image}")
    return 0


def cmd_dev_up(args: argparse.Namespace) -> int:
    from gate.devcluster import services
    from gate.devcluster.cluster import DevCluster, NodeSpec, RealNodeSpec

    cluster = DevCluster(Path(args.state_dir) if args.state_dir else None)
    suites = [s.strip() for s in args.real_node_os.split(",") if s.strip()]
    real = RealNodeSpec(args.real_nodes, _labels(args.label), suites=suites) if args.real_nodes else None
    endpoints = _labels(args.prometheus_endpoint, "--prometheus-endpoint")
    signatures = _signature_policy(args.image_signatures) if args.image_signatures else None
    cluster.up(NodeSpec(args.nodes, _labels(args.label)), job_seconds=args.job_seconds, progress=_err,
               real_nodes=real)
    if args.prometheus_endpoint:
        services.set_prometheus_endpoints(cluster, endpoints)
    if signatures is not None:
        services.set_image_signatures(cluster, signatures)
        if "operator" in cluster.processes() and cluster.processes()["operator"].alive():
            _err("Restarting the operator with the image signature policy")
            cluster.stop_process("operator")
    if args.cert_manager:
        from gate.devcluster import certmanager

        certmanager.start(cluster, progress=_err)
    services.start(cluster, webhook=not args.no_webhook, operator=not args.no_operator, progress=_err)
    print(cluster.kubeconfig)
    return 0


def _signature_policy(path: str) -> str:
    """The text of an image signature policy file, checked as the operator reads it, before anything starts."""
    from gate.api.signatures import load_policy

    try:
        text = Path(path).read_text()
        load_policy(text, source=path)
    except (OSError, ValueError) as exc:
        raise CliError(f"--image-signatures {path}: {exc}") from None
    return text


def cmd_dev_down(args: argparse.Namespace) -> int:
    from gate.devcluster.cluster import DevCluster

    cluster = DevCluster(Path(args.state_dir) if args.state_dir else None)
    stopped = cluster.down(quiet=True)
    print(f"Stopped {', '.join(stopped)}." if stopped else "Nothing was running.")
    return 0


def cmd_dev_kubeconfig(args: argparse.Namespace) -> int:
    from gate.devcluster.cluster import DevCluster

    cluster = DevCluster(Path(args.state_dir) if args.state_dir else None)
    if not cluster.running():
        raise CliError("the dev cluster is not running; start it with `nodegate dev up`")
    print(cluster.kubeconfig)
    return 0


def cmd_dev_images(args: argparse.Namespace) -> int:
    from gate.devcluster import services
    from gate.devcluster.cluster import DevCluster
    from gate.devcluster.images import NODEGATE, ensure_images, format_references
    from gate.devcluster.network import gateway_ip

    cluster = DevCluster(Path(args.state_dir) if args.state_dir else None)
    if not cluster.running():
        raise CliError("the dev cluster's control plane is not running; start it with `nodegate dev up`")
    refs = ensure_images(cluster, host=gateway_ip(cluster.dir), progress=_err)
    running = services.running_agent_image(cluster)
    if running is not None and running != refs[NODEGATE]:
        # The operator names the agent image in every stage pod it starts: the one just built is the
        # one this source tree would run.
        _err(f"Restarting the operator: its agent image is now {refs[NODEGATE]}")
        cluster.stop_process("operator")
        services.start_operator(cluster, _err, env={services.AGENT_IMAGE_ENV: refs[NODEGATE]})
    sys.stdout.write(format_references(refs))
    return 0


def cmd_dev_status(args: argparse.Namespace) -> int:
    from gate.devcluster.cluster import DevCluster

    cluster = DevCluster(Path(args.state_dir) if args.state_dir else None)
    procs = cluster.processes()
    if not procs:
        print("Nothing is running.")
        return 1
    for name, proc in procs.items():
        print(f"{name:26} pid {proc.pid:<8} {'running' if proc.alive() else 'EXITED'}  log {proc.log}")
    return 0 if cluster.running() else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from gate.cli.demo import run_demo

    # The demo runs `nodegate` commands through `main`, handed to it: it does not import this module.
    return run_demo(quick=args.quick, nodes=args.nodes, state_dir=Path(args.state_dir) if args.state_dir else None,
                    cli=main, keep=args.keep, down=args.down, cert_manager=args.cert_manager)


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prog_name(argv0: str | None = None) -> str:
    """`kubectl nodegate` when kubectl runs us as its plugin `kubectl-nodegate`, else `nodegate`."""
    name = Path(argv0 if argv0 is not None else sys.argv[0]).name
    return "kubectl nodegate" if name.startswith("kubectl-") else "nodegate"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog_name(), description="Host-layer packages for Kubernetes fleets.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    crds = sub.add_parser("crds", help="generate the CRD manifests from the API models")
    crds.add_argument("--output", "-o", default="crds", help="directory to write into (default: crds)")
    crds.add_argument("--check", action="store_true", help="exit 1 when the files there are stale")
    crds.set_defaults(func=cmd_crds)

    api_docs = sub.add_parser("api-docs", help="generate docs/api.md from the API models")
    api_docs.add_argument("--output", "-o", default="docs/api.md", help="file to write (default: docs/api.md)")
    api_docs.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    api_docs.set_defaults(func=cmd_api_docs)

    dev = sub.add_parser("dev", help="a local real control plane with simulated nodes")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True, metavar="ACTION")
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument("--state-dir", help="where the cluster keeps its state (default: ~/.cache/nodegate/dev)")

    up = dev_sub.add_parser("up", parents=[state], help="start (or reuse) the control plane and return")
    up.add_argument("--nodes", type=int, default=3, help="simulated nodes to create (default 3)")
    up.add_argument("--real-nodes", type=int, default=0, metavar="N",
                    help="real nodes to start next to the simulated ones: a kubelet, containerd and runc each, "
                         "in namespaces of their own (root only; at most 4; see docs/realnodes.md)")
    up.add_argument("--real-node-os", default="bookworm", metavar="SUITES",
                    help="Debian releases of the real nodes' roots, comma-separated, taken in turn "
                         "(bookworm, trixie; default bookworm): bookworm,trixie makes real-node-1 Debian 13")
    up.add_argument("--label", action="append", default=[], metavar="K=V", help="label for the nodes (repeatable)")
    up.add_argument("--job-seconds", type=float, default=1.0,
                    help="how long each step of a stage pod runs on a simulated node before it succeeds "
                         "(default 1)")
    up.add_argument("--prometheus-endpoint", action="append", default=[], metavar="NAME=URL",
                    help="a Prometheus endpoint a DeploymentPolicy's health.prometheus.endpoint may name "
                         "(repeatable; replaces the cluster's endpoints; as the chart's "
                         "operator.health.prometheus.endpoints)")
    up.add_argument("--image-signatures", metavar="FILE",
                    help="the operator's image signature policy (YAML: mode, unmatched, rules; as the chart's "
                         "operator.imageSignatures): every package image is verified before any node is cordoned "
                         "for it, and resolved to a digest in a registry (docs/supply-chain.md); kept for the "
                         "cluster's later starts")
    up.add_argument("--no-webhook", action="store_true", help="do not start the admission webhook")
    up.add_argument("--no-operator", action="store_true", help="do not start the operator")
    up.add_argument("--cert-manager", action="store_true",
                    help="also run the real cert-manager (its CRDs, controller and cainjector, out of cluster), "
                         "for the chart's certManager.enabled=true")
    up.set_defaults(func=cmd_dev_up)

    down = dev_sub.add_parser("down", parents=[state], help="stop every process `dev up` started")
    down.set_defaults(func=cmd_dev_down)
    kc = dev_sub.add_parser("kubeconfig", parents=[state], help="print the kubeconfig path")
    kc.set_defaults(func=cmd_dev_kubeconfig)
    st = dev_sub.add_parser("status", parents=[state], help="list the processes and whether they run")
    st.set_defaults(func=cmd_dev_status)
    im = dev_sub.add_parser(
        "images", parents=[state],
        help="build NodeGate's and every package's image (buildah, local bases), push them to the dev "
        "cluster's registry, print NAME=REFERENCE by digest")
    im.set_defaults(func=cmd_dev_images)
    bd = dev_sub.add_parser("build", help="build the control plane binaries (once per machine)")
    bd.add_argument("--real-nodes", action="store_true",
                    help="also build what real nodes need: their Debian roots (every release), init and pause, "
                         "and the images")
    bd.set_defaults(func=cmd_dev_build)

    demo = sub.add_parser("demo", help="a live rollout on a local control plane with simulated nodes")
    demo.add_argument("--quick", action="store_true",
                      help="the same story on 12 nodes with short stages; stops the control plane at the end "
                      "(the tests run it)")
    demo.add_argument("--nodes", type=int, help="simulated nodes, split into canary, pool-a, pool-b "
                      "(default 60; 12 with --quick)")
    demo.add_argument("--keep", action="store_true", help="with --quick: leave the control plane running")
    demo.add_argument("--down", action="store_true", help="stop the demo's control plane and exit")
    demo.add_argument("--cert-manager", action="store_true",
                      help="the webhook's certificate issued by the real cert-manager and its caBundle filled by "
                      "cert-manager's cainjector, instead of self-managed")
    demo.add_argument("--state-dir", help="where the demo's control plane keeps its state "
                      "(default ~/.cache/nodegate/demo; never the one of `nodegate dev`)")
    demo.set_defaults(func=cmd_demo)

    for module_name in COMMAND_MODULES:
        module = importlib.import_module(module_name)
        module.register(sub)
    # `--help` lists what a person uses day to day first, the tools for the fleet's processes last.
    rank = {name: i for i, name in enumerate(HELP_ORDER)}
    sub._choices_actions.sort(key=lambda a: rank.get(a.dest, len(rank)))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    func: Handler = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `nodegate status --watch | head`: the reader left, which is fine
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except CliError as exc:
        _err(f"error: {exc}")
        return 2
    except Exception as exc:  # one clear line for every failure; NODEGATE_DEBUG=1 shows the traceback
        import os

        if os.environ.get("NODEGATE_DEBUG"):
            raise
        _err(f"error: {describe_failure(exc)}")
        return 2 if _is_api_failure(exc) else 1


def _is_api_failure(exc: BaseException) -> bool:
    from gate.kube.errors import ApiError, ConnectionFailed

    return isinstance(exc, (ApiError, ConnectionFailed))


def describe_failure(exc: BaseException) -> str:
    """One line for a person: what failed, without a traceback."""
    from pydantic import ValidationError

    from gate.devcluster.build import BuildError
    from gate.devcluster.cluster import ClusterError
    from gate.devcluster.hostside import RealNodeError

    if isinstance(exc, (BuildError, ClusterError, RealNodeError)):
        return str(exc)
    if _is_api_failure(exc):  # a command that did not translate its own
        from gate.cli.kubectx import explain

        return explain(exc)  # type: ignore[arg-type]
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or exc.title
        return f"{exc.title} is not valid at {where}: {first.get('msg', '')}"
    return (f"unexpected {type(exc).__name__}: {exc}; run again with NODEGATE_DEBUG=1 for the traceback "
            "and report it")


if __name__ == "__main__":
    sys.exit(main())
