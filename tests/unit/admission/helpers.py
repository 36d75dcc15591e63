from __future__ import annotations

from typing import Any

from gate.admission.rules.review import AdmissionRequest


def request(kind: str, operation: str, obj: dict[str, Any] | None, old: dict[str, Any] | None = None, *,
            user: str = "alice", groups: list[str] | None = None) -> AdmissionRequest:
    group = "" if kind == "Node" else "nodegate.io"
    version = "v1" if kind == "Node" else "v1alpha1"
    return AdmissionRequest.model_validate({
        "uid": "0000-1111", "kind": {"group": group, "version": version, "kind": kind}, "operation": operation,
        "object": obj, "oldObject": old, "name": (obj or old or {}).get("metadata", {}).get("name", ""),
        "userInfo": {"username": user, "groups": groups or ["system:authenticated"]},
    })


def review(kind: str, operation: str, obj: dict[str, Any] | None, old: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": request(kind, operation, obj, old).model_dump(by_alias=True, mode="json")}


def gate(packages: dict[str, Any] | None = None, name: str = "g", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
            "spec": {"packages": packages or {}, **spec}}


def package(version: str = "1.0.0", image: str = "ghcr.io/example/tool", **extra: Any) -> dict[str, Any]:
    return {"version": version, "image": image, **extra}


def ten_package_gate() -> dict[str, Any]:
    pkgs = {f"pkg-{chr(97 + i)}": package(f"1.{i}.0", f"registry.example.com:5000/team/pkg-{chr(97 + i)}",
                                          config={"a.conf": "x", "b.conf": "y"},
                                          configInterrupts={"*.conf": {"type": "service", "services": ["svc"]}},
                                          resources={"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}},
                                          dependsOn={f"pkg-{chr(96 + i)}": ">=1.0.0"} if i else {})
            for i in range(10)}
    return gate(pkgs, name="ten", nodeSelector={"matchLabels": {"nvidia.com/gpu.present": "true"}},
                interruptionBudget={"percent": 25}, waitTimeout="2h", drain={"timeout": "15m"})
