"""gpu-tuning's intent model: every accelerator x intent x OS x cloud, the golden profiles, the OS
detection from os-release, and the layer files' own rules. The assembler is the package's script,
imported by path (it runs in the agent's container, not as part of `gate`)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from itertools import product
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "packages" / "gpu-tuning"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_tuning", PACKAGE / "scripts" / "gpu_tuning.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_tuning"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gt = _load()
ACCELERATORS = ["any", "b200", "gb200", "h100", "h200"]
INTENTS = ["inference", "multiNodeTraining", "performance"]
OSES = ["amzn", "cos", "debian", "rhel", "ubuntu"]
CLOUDS = [None, "aks", "eks", "gke", "oke"]
SUPPORTED = {None: {"debian", "ubuntu", "rhel"}, "eks": {"amzn", "ubuntu"}, "gke": {"cos", "ubuntu"},
             "aks": {"ubuntu"}, "oke": {"rhel", "ubuntu"}}
X86_ONLY_ARGS = ("iommu=pt", "pci=realloc=off", "pci=disable_acs_redir=pci:0:0")


def test_the_layers_on_disk_are_the_choices_the_table_covers() -> None:
    assert gt.choices("accelerator") == ACCELERATORS
    assert gt.choices("intent") == INTENTS
    assert gt.choices("os") == OSES
    assert gt.choices("cloud") == sorted(c for c in CLOUDS if c)
    assert {None if c == "none" else c: set(o) for c, o in gt.supported_pairs().items()} == SUPPORTED


@pytest.mark.parametrize(("accelerator", "intent", "os_name", "cloud"),
                         list(product(ACCELERATORS, INTENTS, OSES, CLOUDS)))
def test_every_combination_assembles_or_is_refused_with_the_supported_list(
        accelerator: str, intent: str, os_name: str, cloud: str | None) -> None:
    if os_name not in SUPPORTED[cloud]:
        with pytest.raises(gt.ProfileError) as refused:
            gt.assemble(accelerator, intent, os_name, cloud)
        message = str(refused.value)
        assert f"os {os_name} with cloud {cloud or 'none'} is not supported" in message
        assert "cloud eks: os amzn, ubuntu" in message and "cloud none: os debian, ubuntu, rhel" in message
        return
    profile = gt.assemble(accelerator, intent, os_name, cloud)
    expected_layers = ["base", *(["accelerator/h100"] if accelerator in ("h200", "b200") else []),
                       f"accelerator/{accelerator}", f"intent/{intent}", f"os/{os_name}",
                       *([f"cloud/{cloud}"] if cloud else [])]
    assert profile.layers == expected_layers
    ids = [s.id for s in profile.settings]
    assert len(ids) == len(set(ids)) and ids
    for setting in profile.settings:
        assert setting.layer in profile.layers, setting
        assert setting.source.title and setting.source.key, setting
    by = {s.id: s.value for s in profile.settings}
    args = [s.value for s in profile.settings if s.category == "kernelArg"]
    if os_name == "cos":  # no GRUB, read-only root: only sysctls and unit limits, the rest said why
        assert {s.category for s in profile.settings} <= {"sysctl", "limit"}
        assert profile.bootloader == "none"
        assert all("cos takes only sysctl, limit" in why for _, why in profile.left_out)
        assert {s.category for s, _ in profile.left_out} >= {"cpu"}
    else:
        assert profile.bootloader == ("update-grub" if os_name in ("debian", "ubuntu") else "grubby")
        assert by["cpu/governor"] == "performance"
    if accelerator == "gb200":  # Grace is arm64: no x86 IOMMU/PCI arguments
        assert not set(X86_ONLY_ARGS) & set(args)
        assert by["sysctl/kernel.numa_balancing"] == "0"
        if os_name != "cos":
            assert "iommu.passthrough=1" in args
    elif accelerator != "any" and os_name != "cos":
        assert set(X86_ONLY_ARGS) <= set(args)
    if intent == "inference":
        assert by["sysctl/vm.swappiness"] == "1"
        if os_name != "cos":
            assert args.index("hugepagesz=2M") < args.index("hugepages=8192")
            assert by["cpu/max_cstate"] == "1"
    else:
        assert by["sysctl/vm.swappiness"] == "10"
    if intent == "multiNodeTraining":
        assert by["sysctl/net.core.rmem_max"] == "536870912"
        assert by["limit/containerd.service/LimitMEMLOCK"] == "infinity"
    if cloud == "gke":
        assert "service/nvidia-persistenced.service" not in by
    if cloud == "eks":
        assert "intel_idle.max_cstate=1" in args


def test_the_golden_profiles_are_current() -> None:
    stale = gt.stale_golden()
    assert not stale, (f"stale golden profiles: {stale[:5]}; regenerate with "
                       "`python3 packages/gpu-tuning/scripts/gpu_tuning.py golden --write`")
    assert len(list(gt.GOLDEN.glob("*.txt"))) == len(gt.combinations()) == 150


def test_a_changed_layer_makes_its_golden_profiles_stale(tmp_path: Path) -> None:
    layers = tmp_path / "layers"
    shutil.copytree(gt.LAYERS, layers)
    golden = tmp_path / "golden"
    assert gt.write_golden(golden, layers) == 150
    assert gt.stale_golden(golden, layers) == []
    intent = json.loads((layers / "intent/inference.json").read_text())
    intent["settings"]["sysctl/vm.swappiness"]["value"] = "5"
    (layers / "intent/inference.json").write_text(json.dumps(intent))
    stale = gt.stale_golden(golden, layers)
    assert len(stale) == 50 and all("-inference-" in name for name in stale)
    (golden / "h100-leftover-debian-none.txt").write_text("old\n")
    assert "h100-leftover-debian-none.txt" in gt.stale_golden(golden, layers)


def test_the_golden_check_command_fails_when_stale_and_names_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    golden = tmp_path / "golden"
    shutil.copytree(gt.GOLDEN, golden)
    monkeypatch.setattr(gt, "GOLDEN", golden)
    assert gt.main(["golden"]) == 0
    (golden / "h100-inference-debian-none.txt").write_text("edited by hand\n")
    assert gt.main(["golden"]) == 1
    assert "h100-inference-debian-none.txt" in capsys.readouterr().out
    assert gt.main(["golden", "--write"]) == 0
    assert gt.main(["golden"]) == 0


OS_RELEASES = {
    "debian": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n',
    "ubuntu": 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n',
    "rhel": 'NAME="Red Hat Enterprise Linux"\nID="rhel"\nID_LIKE="fedora"\nVERSION_ID="9.4"\n',
    "rocky": 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\n',
    "oracle": 'NAME="Oracle Linux Server"\nID="ol"\nID_LIKE="fedora"\nVERSION_ID="8.9"\n',
    "al2": 'NAME="Amazon Linux"\nID="amzn"\nID_LIKE="centos rhel fedora"\nVERSION_ID="2"\n',
    "al2023": 'NAME="Amazon Linux"\nID="amzn"\nID_LIKE="fedora"\nVERSION_ID="2023"\n',
    "cos": 'NAME="Container-Optimized OS"\nID=cos\nVERSION_ID=113\nBUILD_ID=18244.85.49\n',
    "mint": 'NAME="Linux Mint"\nID=linuxmint\nID_LIKE="ubuntu debian"\n',
}
DETECTED = {"debian": "debian", "ubuntu": "ubuntu", "rhel": "rhel", "rocky": "rhel", "oracle": "rhel",
            "al2": "amzn", "al2023": "amzn", "cos": "cos", "mint": "ubuntu"}


@pytest.mark.parametrize("name", sorted(OS_RELEASES))
def test_the_os_layer_comes_from_os_release_id_before_id_like(name: str) -> None:
    assert gt.detect_os(gt.parse_os_release(OS_RELEASES[name])) == DETECTED[name]


def test_an_os_without_a_layer_is_refused_naming_it_and_the_supported_ones() -> None:
    with pytest.raises(gt.ProfileError) as refused:
        gt.detect_os(gt.parse_os_release('PRETTY_NAME="Alpine Linux v3.20"\nID=alpine\n'))
    assert "Alpine Linux v3.20 (ID=alpine" in str(refused.value)
    assert "supported: cloud aks: os ubuntu" in str(refused.value)


def test_a_host_without_os_release_is_refused(tmp_path: Path) -> None:
    with pytest.raises(gt.ProfileError, match="cannot tell the OS"):
        gt.read_os_release(tmp_path)
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/os-release").write_text(OS_RELEASES["cos"])
    assert gt.read_os_release(tmp_path)["ID"] == "cos"


@pytest.mark.parametrize(("config", "message"), [
    ({"intent": "inference"}, "config key 'accelerator' is required: one of any, b200, gb200, h100, h200"),
    ({"accelerator": "h100"}, "config key 'intent' is required"),
    ({"accelerator": "a100", "intent": "inference"}, "config key 'accelerator': 'a100' is not one of any, b200"),
    ({"accelerator": "h100", "intent": "training"}, "config key 'intent': 'training' is not one of inference"),
    ({"accelerator": "h100", "intent": "inference", "cloud": "azure"}, "config key 'cloud': 'azure' is not one of"),
    ({"accelerator": "h100", "intent": "inference", "exclude": "sysctl/vm.swapiness"},
     "config key 'exclude': 'sysctl/vm.swapiness' matches no setting"),
])
def test_bad_config_is_refused_naming_the_key(config: dict[str, str], message: str) -> None:
    with pytest.raises(gt.ProfileError) as refused:
        gt.profile_from_config(config, gt.parse_os_release(OS_RELEASES["debian"]))
    assert message in str(refused.value)


def test_exclude_leaves_settings_out_by_id_or_glob_and_says_so() -> None:
    profile = gt.profile_from_config({"accelerator": "h100", "intent": "multiNodeTraining",
                                      "exclude": "sysctl/vm.*, kernelArg/*"},
                                     gt.parse_os_release(OS_RELEASES["debian"]))
    ids = {s.id for s in profile.settings}
    assert not any(i.startswith(("sysctl/vm.", "kernelArg/")) for i in ids)
    assert "sysctl/net.core.rmem_max" in ids
    reasons = {s.id: why for s, why in profile.left_out}
    assert reasons["sysctl/vm.swappiness"] == "excluded by config (sysctl/vm.*)"
    assert reasons["kernelArg/iommu"] == "excluded by config (kernelArg/*)"


def test_a_none_value_removes_what_an_earlier_layer_set_and_the_notes_say_which() -> None:
    profile = gt.assemble("h100", "performance", "ubuntu", "gke")
    assert "service/nvidia-persistenced.service" not in {s.id for s in profile.settings}
    assert "cloud/gke removes service/nvidia-persistenced.service (set by base)" in profile.notes


def test_without_an_os_the_profile_has_no_os_layer_and_nothing_left_out() -> None:
    profile = gt.profile_from_config({"accelerator": "h100", "intent": "inference"}, None)
    assert profile.os is None and profile.layers == ["base", "accelerator/h100", "intent/inference"]
    assert profile.left_out == []


def test_the_host_files_are_what_the_shell_steps_read() -> None:
    profile = gt.assemble("h100", "multiNodeTraining", "debian", None)
    files = gt.host_files(profile)
    assert files["bootloader"] == "update-grub\n"
    assert files["kernel-args"] == "iommu=pt\npci=realloc=off\npci=disable_acs_redir=pci:0:0\n"
    assert "net.ipv4.tcp_rmem = 4096 87380 268435456\n" in files["sysctl.conf"]
    assert files["cpu"] == "governor performance\n"
    assert files["services"] == "irqbalance.service disabled\nnvidia-persistenced.service enabled\n"
    assert files["limits"] == ("containerd.service LimitCORE infinity\ncontainerd.service LimitMEMLOCK infinity\n"
                               "containerd.service LimitNPROC infinity\n")
    assert json.loads(files["profile.json"])["layers"] == ["base", "accelerator/h100", "intent/multiNodeTraining",
                                                          "os/debian"]
    assert files["profile.txt"].startswith("gpu-tuning profile: accelerator=h100 intent=multiNodeTraining os=debian")


def _layer(tmp_path: Path, data: dict[str, object]) -> Path:
    (tmp_path / "intent").mkdir(parents=True, exist_ok=True)
    (tmp_path / "intent" / "bad.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize(("data", "message"), [
    ({"settings": {}}, "names no source"),
    ({"sources": {"a": {"title": "A"}, "b": {"title": "B"}}, "settings": {"sysctl/vm.x": {"value": "1"}}},
     "must name one of its sources: a, b"),
    ({"sources": {"a": {"title": "A"}}, "settings": {"sysctl/vm.x": {"value": "1", "source": "c"}}},
     "names source 'c', not one of a"),
    ({"sources": {"a": {"title": "A"}}, "settings": {"grub/x": {"value": "1"}}}, "the id must start with one of"),
    ({"sources": {"a": {"title": "A"}}, "settings": {"sysctl/Vm x": {"value": "1"}}}, "is not a sysctl key"),
    ({"sources": {"a": {"title": "A"}}, "settings": {"sysctl/vm.x": {"value": "1; reboot`"}}}, "without quotes"),
    ({"sources": {"a": {"title": "A"}}, "settings": {"service/irqbalance": {"value": "enabled"}}},
     "a systemd .service unit"),
    ({"sources": {"a": {"title": "A"}}, "settings": {"cpu/turbo": {"value": "on"}}}, "cpu settings are"),
    ({"sources": {"a": {"title": "A"}}, "settings": {"kernelArg/x": {"value": "a b"}}}, "one word"),
])
def test_a_layer_file_breaking_the_rules_is_refused_naming_layer_and_setting(
        tmp_path: Path, data: dict[str, object], message: str) -> None:
    with pytest.raises(gt.ProfileError) as refused:
        gt.load_layer("intent/bad", _layer(tmp_path, data))
    assert str(refused.value).startswith("layer intent/bad")
    assert message in str(refused.value)


def test_every_shipped_layer_loads_and_names_real_sources() -> None:
    names = ["base"] + [f"{kind}/{name}" for kind in ("accelerator", "intent", "os", "cloud")
                        for name in gt.choices(kind)]
    for name in names:
        layer = gt.load_layer(name)
        assert layer.summary, name
        for source in layer.sources.values():
            assert source.url.startswith("https://") or name == "accelerator/any", (name, source)


def test_the_config_keys_package_yaml_declares_are_the_layers_there_are() -> None:
    from gate.agent.loader import load_package

    keys = load_package(PACKAGE).manifest.config
    assert keys is not None
    assert sorted(keys.keys["accelerator"].enum or []) == gt.choices("accelerator")
    assert sorted(keys.keys["intent"].enum or []) == gt.choices("intent")
    assert sorted(keys.keys["cloud"].enum or []) == gt.choices("cloud")
    assert keys.keys["intent"].required and keys.keys["accelerator"].default == "any"
