"""`nodegate webhook ...`: serve the admission webhook, print its configurations."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from gate.admission.server import serve
    from gate.admission.settings import from_args

    settings = from_args(args)
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(settings))
    return 0


def cmd_configurations(args: argparse.Namespace) -> int:
    import yaml

    from gate.admission.configuration import webhook_configurations

    ca = Path(args.ca_file).read_bytes() if args.ca_file else None
    validating, mutating = webhook_configurations(
        mode=args.mode, ca_bundle=ca, name=args.name, url=args.url, service_name=args.service_name,
        service_namespace=args.namespace, service_port=args.service_port, operator_namespace=args.namespace,
        operator_service_account=args.operator_service_account, timeout_seconds=args.timeout_seconds,
        node_mutation_failure_policy=args.node_failure_policy,
    )
    docs: list[dict[str, Any]] = [validating, mutating]
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=2))
    else:
        print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0


def register(subparsers: Any) -> None:
    from gate.admission.settings import add_arguments

    webhook = subparsers.add_parser("webhook", help="the admission webhook")
    sub = webhook.add_subparsers(dest="webhook_command", required=True, metavar="ACTION")

    serve = sub.add_parser("serve", help="serve /validate and /mutate over TLS (flags or NODEGATE_WEBHOOK_* env)")
    add_arguments(serve)
    serve.set_defaults(func=cmd_serve)

    conf = sub.add_parser("configurations", help="print the Validating- and MutatingWebhookConfiguration")
    conf.add_argument("--mode", choices=["service", "url"], default="service",
                      help="service: in cluster behind a Service (default); url: a URL such as a local process")
    conf.add_argument("--url", default="https://127.0.0.1:9443", help="base URL in url mode")
    conf.add_argument("--name", default="nodegate", help="name of both configurations (default nodegate)")
    conf.add_argument("--service-name", default="nodegate-webhook")
    conf.add_argument("--service-port", type=int, default=443)
    conf.add_argument("--namespace", default="nodegate-system", help="the operator's and the Service's namespace")
    conf.add_argument("--operator-service-account", default="nodegate-operator")
    conf.add_argument("--timeout-seconds", type=int, default=5)
    conf.add_argument("--node-failure-policy", choices=["Ignore", "Fail"], default="Ignore",
                      help="failurePolicy of the Node CREATE mutation (default Ignore: see docs/admission.md)")
    conf.add_argument("--ca-file", help="PEM bundle to put in caBundle (default: none, e.g. for cert-manager)")
    conf.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    conf.set_defaults(func=cmd_configurations)
